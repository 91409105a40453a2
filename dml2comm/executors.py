"""Where the parallel work of ``trace``, ``sweep`` and ``calibrate`` runs: this machine's processes, or a Dask cluster.

    python main.py trace torch_profile/ --processes 8                                   # local (default)
    python main.py trace torch_profile/ --executor dask --processes 8                   # a LocalCluster of 8 workers
    python main.py trace /shared/torch_profile/ --executor dask --scheduler tcp://head:8786

One interface, two executors, and the commands call only the interface:

- :meth:`Executor.map_unordered` runs ``fn(item)`` for every item and yields ``(index, result,
  error)`` as each finishes (the trace command's map: one task per rank file).  An exception of
  one item, or a worker that dies while running it, is that item's ``error`` (one line); the other
  items go on.  ``calibrate`` maps :func:`dml2comm.calibrate.samples.file_samples` the same way
  (one task per trace file).
- :meth:`Executor.run_chunks` evaluates the chunks of a :class:`ChunkPlan` (the sweep), with the
  per-worker state (the sweep's evaluator and the tables it caches) built once per worker, and
  hands each chunk's rows to ``on_rows`` as they arrive.  Ctrl-C (or ``on_rows`` raising
  ``KeyboardInterrupt``) stops it; it returns True then, and the rows that arrived are kept.

:class:`LocalExecutor` is the process pool of one machine (``concurrent.futures`` for maps, the
forked workers of :mod:`dml2comm.search.workers` for chunks: they inherit the state built here)
and needs nothing beyond the standard library.  :class:`DaskExecutor` runs the same functions on
a ``dask.distributed`` cluster (an existing scheduler, or a ``LocalCluster`` on this machine); Dask
is the optional extra ``pip install 'dml2comm[dask]'``.  Functions and items sent to Dask are
pickled (cloudpickle), so they must be importable on the workers: install dml2comm there too.

References: Dask distributed, ``Client.submit``/``as_completed``/``LocalCluster``
(https://distributed.dask.org/en/stable/api.html); worker restrictions with
``allow_other_workers`` (https://distributed.dask.org/en/stable/locality.html); a task whose
workers keep dying fails with ``KilledWorker`` after ``distributed.scheduler.allowed-failures``
attempts (https://distributed.dask.org/en/stable/killed.html).
"""

from __future__ import annotations

import argparse
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Sequence

from dml2comm.errors import ConfigError

__all__ = ["EXECUTORS", "DASK_EXTRA", "Executor", "LocalExecutor", "DaskExecutor", "ChunkPlan", "add_executor_args",
           "executor_from_args", "require_dask", "progress_bar"]

#: The ``--executor`` choices.
EXECUTORS = ("local", "dask")
#: How to install Dask (the optional extra of pyproject.toml).
DASK_EXTRA = "pip install 'dml2comm[dask]'"

#: ``(index, result, error)`` of one item of a map: ``error`` is None, or why the item failed (one line).
Outcome = tuple[int, Any, "str | None"]


@dataclass(frozen=True)
class ChunkPlan:
    """The work of a sweep as chunks.

    ``work[k]`` estimates chunk k's cost and ``affinity[k]`` groups chunks that share tables
    (:func:`dml2comm.search.workers.deal` keeps a group on one worker); ``setup()`` builds the
    per-worker state, ``run(state, payloads[k])`` returns chunk k's rows; ``state``, when given,
    is that state already built in this process (local workers fork and inherit it).  For Dask,
    ``setup``, ``run`` and the payloads are pickled: ``setup`` must rebuild the state from
    scratch (a path, not an imported model)."""

    work: Sequence[float]
    affinity: Sequence[Hashable]
    setup: Callable[[], Any]
    run: Callable[[Any, Any], list[dict[str, Any]]]
    payloads: Sequence[Any]
    state: Any = None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Executor:
    """What ``trace``, ``sweep`` and ``calibrate`` run their parallel work on (a context manager: ``close``
    releases its processes or cluster)."""

    name = "executor"
    workers = 1

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        raise NotImplementedError

    def run_chunks(self, plan: ChunkPlan, on_rows: Callable[[list[dict[str, Any]]], None]) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor(Executor):
    """``workers`` processes of this machine (1: everything in this process)."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(1, int(workers))

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        if self.workers <= 1 or len(items) <= 1:
            for i, item in enumerate(items):
                try:
                    result = fn(item)
                except Exception as exc:  # noqa: BLE001 - one item's failure, reported with the others' results
                    yield i, None, _one_line(exc)
                else:
                    yield i, result, None
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed  # imported here: 12 ms of every sweep's start
        from concurrent.futures.process import BrokenProcessPool

        with ProcessPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            try:
                for future in as_completed(futures):
                    try:
                        result = future.result()
                    except BrokenProcessPool:
                        yield futures[future], None, "a worker process died (killed, or out of memory) before this item finished"
                    except Exception as exc:  # noqa: BLE001 - as above
                        yield futures[future], None, _one_line(exc)
                    else:
                        yield futures[future], result, None
            finally:
                for future in futures:
                    future.cancel()

    def run_chunks(self, plan: ChunkPlan, on_rows: Callable[[list[dict[str, Any]]], None]) -> bool:
        state = plan.state if plan.state is not None else plan.setup()  # built here: forked workers inherit it
        if self.workers <= 1:
            try:
                for payload in plan.payloads:
                    on_rows(plan.run(state, payload))
            except KeyboardInterrupt:
                return True
            return False
        from dml2comm.search.workers import run_workers  # imported here: multiprocessing, 2.4 ms a one-process sweep does not need

        return run_workers(plan.work, plan.affinity, self.workers, lambda k: plan.run(state, plan.payloads[k]), on_rows)


# ---- Dask


def require_dask() -> Any:
    """The ``dask.distributed`` module, or :class:`ConfigError` saying how to install it."""
    try:
        import dask.distributed as dd
    except ImportError as exc:
        raise ConfigError(f"--executor dask needs Dask, which is not installed ({exc.name or exc}); "
                          f"install it with: {DASK_EXTRA}") from exc
    return dd


#: The per-worker state of a chunked run on a Dask worker: (run key, state).  One run at a time:
#: a new run's state replaces the last one's (its memory is freed).
_WORKER_STATE: tuple[str, Any] | None = None
_WORKER_LOCK = threading.Lock()


def _dask_chunk(key: str, setup: Callable[[], Any], run: Callable[[Any, Any], list[dict[str, Any]]],
                payload: Any) -> list[dict[str, Any]]:
    """Runs on a Dask worker: the run's state, built on this worker's first chunk, then the chunk."""
    global _WORKER_STATE
    with _WORKER_LOCK:  # a worker with several threads builds the state once
        if _WORKER_STATE is None or _WORKER_STATE[0] != key:
            _WORKER_STATE = None
            _WORKER_STATE = (key, setup())
        state = _WORKER_STATE[1]
    return run(state, payload)


class DaskExecutor(Executor):
    """A ``dask.distributed`` cluster: the scheduler at ``scheduler`` (``tcp://host:8786``), or,
    without one, a ``LocalCluster`` of ``workers`` single-threaded worker processes here.

    Raises :class:`ConfigError` when Dask is not installed or the scheduler cannot be reached."""

    name = "dask"

    def __init__(self, workers: int = 1, scheduler: str | None = None, timeout_s: float = 10.0,
                 processes: bool = True) -> None:
        dd = require_dask()
        self._dd = dd
        self.scheduler = scheduler
        self._cluster = None
        if scheduler:
            try:
                self._client = dd.Client(scheduler, timeout=timeout_s)
            except (OSError, TimeoutError, ValueError) as exc:
                raise ConfigError(f"cannot reach the Dask scheduler at {scheduler!r} ({_one_line(exc)}); "
                                  "start one (dask scheduler) and its workers, or check --scheduler") from exc
        else:
            self._cluster = dd.LocalCluster(n_workers=max(1, int(workers)), threads_per_worker=1, processes=processes,
                                            dashboard_address=None)
            self._client = dd.Client(self._cluster)
        self.workers = max(1, len(self.addresses()))

    @classmethod
    def on_client(cls, client: Any) -> "DaskExecutor":
        """An executor on an existing ``dask.distributed.Client`` (tests; notebooks); ``close``
        leaves the client open."""
        self = cls.__new__(cls)
        self._dd = require_dask()
        self.scheduler = None
        self._cluster = None
        self._client = client
        self._borrowed = True
        self.workers = max(1, len(self.addresses()))
        return self

    @property
    def client(self) -> Any:
        return self._client

    def addresses(self) -> list[str]:
        return sorted(self._client.scheduler_info()["workers"])

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        run = uuid.uuid4().hex
        futures = [self._client.submit(fn, item, key=f"dml2comm-{run}-{i}", pure=False) for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for future in self._dd.as_completed(futures):
                i = index[future.key]
                try:
                    result = future.result()
                except self._dd.KilledWorker:
                    yield i, None, "the Dask workers running it died (killed, or out of memory) on every attempt"
                except Exception as exc:  # noqa: BLE001 - one item's failure, reported with the others' results
                    yield i, None, _one_line(exc)
                else:
                    yield i, result, None
                future.release()
        finally:
            self._client.cancel([f for f in futures if not f.done()])

    def run_chunks(self, plan: ChunkPlan, on_rows: Callable[[list[dict[str, Any]]], None]) -> bool:
        from dml2comm.search.workers import deal

        addresses = self.addresses()
        key = uuid.uuid4().hex
        lists = deal(plan.work, plan.affinity, len(addresses))
        # each worker gets its affinity groups (largest first) and Dask's work stealing
        # rebalances at the end (the restriction is loose: allow_other_workers)
        futures = []
        for address, members in zip(addresses, lists):
            for k in members:
                futures.append(self._client.submit(_dask_chunk, key, plan.setup, plan.run, plan.payloads[k],
                                                   key=f"dml2comm-chunk-{key}-{k}", workers=[address],
                                                   allow_other_workers=True, pure=False))
        try:
            for future in self._dd.as_completed(futures):
                try:
                    rows = future.result()
                except self._dd.KilledWorker as exc:
                    raise RuntimeError(f"a sweep worker died on every attempt of a chunk ({_one_line(exc)})") from None
                future.release()
                on_rows(rows)
            return False
        except KeyboardInterrupt:
            return True
        finally:
            self._client.cancel([f for f in futures if not f.done()])

    def close(self) -> None:
        if getattr(self, "_borrowed", False):
            return
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


# ---- command-line flags


def add_executor_args(parser: argparse.ArgumentParser, count_flag: str) -> None:
    """``--executor`` and ``--scheduler`` (``count_flag``: the flag that gives the number of
    local processes, which is also the size of a LocalCluster)."""
    g = parser.add_argument_group("executor (where the parallel work runs)")
    g.add_argument("--executor", choices=EXECUTORS, default="local",
                   help=f"local: processes of this machine (default); dask: a Dask cluster ({DASK_EXTRA}), the one at "
                        f"--scheduler or else a LocalCluster of {count_flag} workers")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="address of a running dask.distributed scheduler (tcp://host:8786) for --executor dask; the "
                        "workers must see the same files (a shared filesystem) and have dml2comm installed")


def executor_from_args(args: argparse.Namespace, workers: int) -> Executor:
    """The executor the flags ask for (``workers``: processes, or LocalCluster workers)."""
    if args.scheduler and args.executor != "dask":
        raise ConfigError("--scheduler is used only by --executor dask; add --executor dask or drop --scheduler")
    if args.executor == "dask":
        return DaskExecutor(workers, scheduler=args.scheduler)
    return LocalExecutor(workers)

