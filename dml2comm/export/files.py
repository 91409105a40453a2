"""Atomic publication of output files (data.json, trace.json, sweep and compare outputs)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

__all__ = ["publish_files"]


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
