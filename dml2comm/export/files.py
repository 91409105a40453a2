"""Atomic publication of output files (data.json, trace.json, sweep and compare outputs)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from dml2comm.errors import ConfigError

__all__ = ["publish_files", "check_output_folder", "check_output_file"]


def publish_files(out: str | os.PathLike[str], files: Mapping[str, str]) -> None:
    """Write every file into a temporary folder inside ``out``, then move each into place.

    ``os.replace`` is atomic per file on one file system, so a reader never sees a half-written
    file, and a failure while writing leaves the previous files untouched."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=out))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        for name in files:
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _writable_ancestor(path: Path, flag: str, shown: str) -> None:
    """The nearest existing folder above ``path`` must be a folder we may write into (the
    folders below it are created)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{flag} {shown!r}: {str(parent)!r} is a file, not a folder; give a path under a folder")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {shown!r}: cannot write into {str(parent)!r} (permission denied); give a folder you can write")


def check_output_folder(out: str | os.PathLike[str], flag: str = "--out") -> None:
    """Refuse an output folder that cannot be written before any work: an existing file, or a
    path under a file or under a folder without write permission.

    Raises
    ------
    ConfigError naming the flag, the path and the fix."""
    if not str(out).strip():  # Path("") is the current folder: the outputs would land among the user's files
        raise ConfigError(f"{flag} is empty; give a folder (it is created if missing), e.g. {flag} out")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(out)!r} is an existing file, not a folder; give a folder (it is created if missing)")
    target = path if path.exists() else path / "x"
    _writable_ancestor(target, flag, str(out))


def check_output_file(out: str | os.PathLike[str], flag: str = "-o") -> None:
    """Refuse an output file that cannot be written before any work: an existing folder, or a
    path under a file or under a folder without write permission."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{flag} {str(out)!r} is an existing folder; give a file name (e.g. {str(path / 'cluster.yaml')!r})")
    _writable_ancestor(path, flag, str(out))
