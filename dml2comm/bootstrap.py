"""Run ``main.py`` under the project's own Python when the current one lacks the packages.

The quick start (``./quickstart.sh`` or ``bash scripts/setup.sh``) installs the pinned packages into
``.venv`` next to ``main.py``, while the README and the mission write ``python main.py ...``.
:func:`use_project_environment` lets that command work as written: when the running interpreter
cannot find the packages and ``.venv/bin/python`` exists, it replaces the process with that
interpreter (:func:`os.execv`, same arguments); when there is no ``.venv`` it prints one line
``error: ...`` naming the setup command and exits with code 2 (the CLI's bad-input code).

This module imports only the standard library and must stay that way: it runs before anything
that needs the packages.  The environment variable :data:`GUARD` marks a re-executed process, so a
``.venv`` that itself lacks the packages ends in the error line instead of an exec loop.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Sequence

__all__ = ["GUARD", "REQUIRED_MODULES", "missing_modules", "project_python", "use_project_environment"]

#: set in the environment of the re-executed process; seeing it means "do not exec again"
GUARD = "DML2COMM_REEXEC"

#: import names of the pinned runtime dependencies in pyproject.toml (mkdocs-material is ``material``)
REQUIRED_MODULES = ("onnx", "numpy", "networkx", "graphviz", "jinja2", "mkdocs", "material", "rich",
                    "yaml", "pyarrow", "msgspec")


def missing_modules(names: Sequence[str] = REQUIRED_MODULES) -> list[str]:
    """Return the names in *names* that the running interpreter cannot import (nothing is imported)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def project_python(main_file: str) -> str | None:
    """Return ``.venv/bin/python`` next to *main_file* when it is an executable file, else None."""
    root = os.path.dirname(os.path.abspath(main_file))
    for parts in (("bin", "python"), ("Scripts", "python.exe")):
        candidate = os.path.join(root, ".venv", *parts)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def use_project_environment(main_file: str, argv: Sequence[str] | None = None) -> None:
    """Return when the packages are importable; otherwise re-execute under ``.venv`` or exit 2.

    Parameters
    ----------
    main_file:
        path of the running ``main.py`` (its folder holds ``.venv``).
    argv:
        the arguments after the script name; ``sys.argv[1:]`` when None.

    Raises
    ------
    SystemExit
        code 2, after one line ``error: ...`` on stderr, when the packages are missing and no
        ``.venv`` can supply them (absent, or already tried: :data:`GUARD` is set).
    """
    missing = missing_modules()
    if not missing:
        return
    args = list(sys.argv[1:] if argv is None else argv)
    venv_python = project_python(main_file)
    names = ", ".join(missing)
    if venv_python is not None and not os.environ.get(GUARD):
        os.environ[GUARD] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(venv_python, [venv_python, os.path.abspath(main_file), *args])
    if venv_python is not None:
        what = f"{venv_python} lacks the packages {names}; run `bash scripts/setup.sh` to install them"
    else:
        what = (f"this Python ({sys.executable}) lacks the packages {names} and there is no .venv next to "
                f"main.py; run `./quickstart.sh` (or `bash scripts/setup.sh`) once, then run the command again")
    print(f"error: {what}", file=sys.stderr)
    raise SystemExit(2)
