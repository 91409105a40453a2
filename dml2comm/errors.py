"""Exception hierarchy.

Every error dml2comm raises on bad input derives from :class:`Dml2CommError`; its message is
one line that names the problem and how to fix it.  :func:`dml2comm.cli.main` prints it and exits with code 2.
The subclasses also derive from the matching built-in (``ValueError``, ``LookupError``,
``OSError``) so library users can catch them the usual way.
"""

__all__ = [
    "Terminated",
    "Dml2CommError",
    "InputFileError",
    "ModelError",
    "UnsupportedOpError",
    "UnboundDimError",
    "ConfigError",
    "RegistryError",
]


class Dml2CommError(Exception):
    """Base class: a one-line message naming the problem and the fix."""


class InputFileError(Dml2CommError, OSError):
    """A file is missing, unreadable, or not of the expected kind."""


class ModelError(Dml2CommError, ValueError):
    """The ONNX model is corrupt, invalid, or uses something dml2comm cannot analyse."""


class UnsupportedOpError(Dml2CommError, LookupError):
    """No cost rule exists for an op type."""


class UnboundDimError(Dml2CommError, ValueError):
    """A tensor on the compute path still has a symbolic or unknown dimension."""


class ConfigError(Dml2CommError, ValueError):
    """The parallelism, batch or hardware configuration is inconsistent with the model."""


class RegistryError(Dml2CommError, ValueError):
    """A rule was registered twice (programming error caught at import time)."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (``dml2comm.cli.main``'s handler) so that every staging
    folder's ``finally`` removes it; a ``BaseException``, as ``KeyboardInterrupt``, so that no
    ``except Exception`` swallows it."""
