"""Run a measurement in a fresh forked process, so it starts with no caches a previous run warmed.

A sweep fills process-wide caches (compiled schedules, collective costs); a second sweep in the
same process, or workers forked from it, would find them filled.  A user's sweep is the first in
its process: :func:`in_fresh_process` forks from a process that has only imported the modules.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, Callable


def in_fresh_process(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child (POSIX); its result comes back pickled, an exception as one."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send, exit without running the parent's cleanup
        os.close(read)
        try:
            payload = pickle.dumps(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent
            payload = pickle.dumps(("error", repr(exc)))
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        sys.stdout.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise RuntimeError(f"the measurement failed: {value}")
    return value
