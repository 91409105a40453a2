"""Worker processes for the sweep: chunks of work with affinity, and stealing at the end.

A sweep's chunks share tables when they share an affinity key (:func:`dml2comm.search.sweep._affinity`:
the compiled schedules and the collective costs of configurations with equal t x c / b).  A
pool that hands the next chunk to whichever worker is free builds those tables in every
worker; here each worker starts on its own list — whole affinity groups, dealt out largest
first to the least loaded worker (LPT) — and, when its list is done, takes chunks from the end
of the list with the most work left, so the workers still finish together.

Workers are forked: they inherit the imported model and the configurations, and only rows
come back (one pipe per worker).  Ctrl-C in the parent stops the workers; the rows that
arrived are kept.
"""

from __future__ import annotations

import gc
import multiprocessing
from multiprocessing.connection import wait
import signal
import traceback
from typing import Any, Callable, Hashable, Sequence

__all__ = ["deal", "run_workers"]


def deal(work: Sequence[float], affinity: Sequence[Hashable], workers: int) -> list[list[int]]:
    """Chunk indices per worker: affinity groups whole, largest group first to the least
    loaded worker; inside a list, groups in the order dealt and each group's chunks largest
    first (a thief takes from the end: the smallest chunk of the last group)."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(affinity):
        groups.setdefault(key, []).append(i)
    total = {key: sum(work[i] for i in members) for key, members in groups.items()}
    lists: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for key in sorted(groups, key=lambda k: (-total[k], min(groups[k]))):
        k = loads.index(min(loads))
        lists[k].extend(sorted(groups[key], key=lambda i: (-work[i], i)))
        loads[k] += total[key]
    return lists


#: What the forked workers read: (lists, work, evaluate, front, back, lock).
_STATE: tuple | None = None


def _next(k: int) -> int | None:
    """The next chunk for worker ``k``: its own list's front, else the back of the list with
    the most work left (under the lock)."""
    assert _STATE is not None
    lists, work, _, front, back, lock = _STATE
    with lock:
        if front[k] < back[k]:
            front[k] += 1
            return lists[k][front[k] - 1]
        left = [sum(work[i] for i in lists[j][front[j]:back[j]]) for j in range(len(lists))]
        j = max(range(len(lists)), key=lambda j: left[j])
        if front[j] >= back[j]:
            return None
        back[j] -= 1
        return lists[j][back[j]]


def _main(k: int, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the workers
    assert _STATE is not None
    evaluate = _STATE[2]
    try:
        while (chunk := _next(k)) is not None:
            conn.send(("rows", evaluate(chunk)))
        conn.send(("done", None))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001 - not picklable: its traceback instead
            conn.send(("error", RuntimeError("sweep worker failed:\n" + traceback.format_exc())))
    finally:
        conn.close()


def run_workers(work: Sequence[float], affinity: Sequence[Hashable], workers: int,
                evaluate: Callable[[int], list[dict[str, Any]]], on_rows: Callable[[list[dict[str, Any]]], None]) -> bool:
    """Evaluate chunks ``0..len(work) - 1`` in ``workers`` forked processes (``evaluate(i)``:
    chunk i's rows, run in a worker; ``on_rows(rows)`` in this process as they arrive).

    Returns True when interrupted (Ctrl-C, or ``on_rows`` raising KeyboardInterrupt); a
    worker's exception is raised here, and a worker that dies raises RuntimeError."""
    global _STATE
    context = multiprocessing.get_context("fork")
    lists = deal(work, affinity, workers)
    front = context.RawArray("i", [0] * workers)
    back = context.RawArray("i", [len(x) for x in lists])
    _STATE = (lists, list(work), evaluate, front, back, context.Lock())
    procs, conns = [], []
    # the objects built so far (the model, its tables) move to the collector's permanent
    # generation before the fork, so that a worker's collections do not write to them and copy
    # their pages (Python docs, gc.freeze: "call ... gc.freeze() right before fork()")
    gc.freeze()
    try:
        for k in range(workers):
            receive, send = context.Pipe(duplex=False)
            proc = context.Process(target=_main, args=(k, send), daemon=True)
            proc.start()
            send.close()
            procs.append(proc)
            conns.append(receive)
        running = dict(zip(conns, procs))
        while running:
            for ready in wait(list(running)):
                try:
                    kind, payload = ready.recv()
                except EOFError:  # its end of the pipe closed before it said done
                    proc = running[ready]
                    proc.join()
                    raise RuntimeError(f"a sweep worker died (exit code {proc.exitcode})") from None
                if kind == "rows":
                    on_rows(payload)
                elif kind == "error":
                    raise payload
                else:
                    del running[ready]
        return False
    except KeyboardInterrupt:
        return True
    finally:
        gc.unfreeze()
        _STATE = None
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
        for conn in conns:
            conn.close()
