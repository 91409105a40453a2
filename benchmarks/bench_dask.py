"""Trace analysis on the local process pool against Dask: wall time, and the bytes each rank sends back.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dask.py [--ranks 64] [--mb 25] [--workers 2]

Synthesises ``--ranks`` traces of about ``--mb`` MB in a temporary folder (the Megatron-like trace
of benchmarks/bench_traces.py: rank 0 is synthesised, the other ranks are copies with their own
rank in ``distributedInfo``, so every rank costs the same to analyse), then times

- the map-reduce alone (:func:`dml2comm.traces.analyze.analyze_traces` in this process) on
  ``LocalExecutor(workers)`` and on a ``LocalCluster`` of ``workers`` single-threaded worker
  processes (the cluster's start-up timed apart);
- the whole command, ``python main.py trace DIR --no-site`` with ``--executor local --processes N``
  and ``--executor dask --processes N`` (interpreter start, cluster start, Parquet and JSON
  included);

and measures what travels from a worker to the client per rank: the pickled result of
:func:`dml2comm.traces.analyze.rank_tables` (what both executors send back), split into the
rank's event table (Arrow IPC, zstd; it becomes events.parquet), the drawn step's activity (the
Gantt charts) and the tables; against the pickled full :func:`analyze_file` result (what the
pool sent before the map-reduce) and the trace file itself.  It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_traces import synthesise  # noqa: E402


def make_ranks(folder: Path, ranks: int, mb: float) -> list[Path]:
    first = folder / "rank-0.json"
    synthesise(first, mb, rank=0, world=ranks)
    text = first.read_bytes()
    head, sep, body = text.partition(b"\n")
    paths = [first]
    for r in range(1, ranks):
        p = folder / f"rank-{r}.json"
        p.write_bytes(head.replace(b'"rank": 0,', f'"rank": {r},'.encode()) + sep + body)
        paths.append(p)
    return paths


def travel_bytes(path: Path) -> dict[str, int]:
    from dml2comm.traces.analyze import analyze_file, rank_tables

    small = rank_tables(str(path))
    full = analyze_file(str(path))
    tables = dataclasses.replace(small, events=b"", activity=dataclasses.replace(small.activity, start=small.activity.start[:0],
                                 end=small.activity.end[:0], category=small.activity.category[:0], step=small.activity.step[:0],
                                 segment=small.activity.segment[:0], name=small.activity.name[:0], stream=small.activity.stream[:0],
                                 collective=small.activity.collective[:0], names=[]))
    total = len(pickle.dumps(small, protocol=5))
    return {"file": path.stat().st_size, "full": len(pickle.dumps(full, protocol=5)), "total": total,
            "events": len(small.events), "tables": len(pickle.dumps(tables, protocol=5)),
            "drawn_step": total - len(small.events) - len(pickle.dumps(tables, protocol=5))}


def time_map(paths: list[Path], executor) -> float:
    from dml2comm.traces.analyze import analyze_traces

    t = time.perf_counter()
    ts = analyze_traces(paths, executor=executor)
    assert len(ts.ranks) == len(paths), ts.problems[:3]
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--mb", type=float, default=25.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each measurement (the median is printed)")
    args = ap.parse_args()
    from dml2comm.executors import DaskExecutor, LocalExecutor

    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "torch_profile"
        folder.mkdir()
        t = time.perf_counter()
        paths = make_ranks(folder, args.ranks, args.mb)
        size = sum(p.stat().st_size for p in paths)
        print(f"synthesised {args.ranks} ranks x {size / args.ranks / 1e6:.1f} MB = {size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s "
              f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f})")
        b = travel_bytes(paths[0])
        print(f"per rank, client <- worker: {b['total'] / 1e3:.1f} kB pickled = event table {b['events'] / 1e3:.1f} kB (Arrow IPC, zstd) "
              f"+ drawn step's activity {b['drawn_step'] / 1e3:.1f} kB + tables {b['tables'] / 1e3:.1f} kB; "
              f"full analyze_file result {b['full'] / 1e3:.1f} kB; trace file {b['file'] / 1e6:.1f} MB")

        local = [time_map(paths, LocalExecutor(args.workers)) for _ in range(args.repeat)]
        t = time.perf_counter()
        dask = DaskExecutor(args.workers)
        start = time.perf_counter() - t
        try:
            remote = [time_map(paths, dask) for _ in range(args.repeat)]
        finally:
            dask.close()
        n = args.ranks
        print(f"map-reduce ({n} ranks): local {args.workers} processes {statistics.median(local):.2f} s "
              f"({statistics.median(local) / n * 1e3:.0f} ms/rank); dask LocalCluster of {args.workers} workers "
              f"{statistics.median(remote):.2f} s ({statistics.median(remote) / n * 1e3:.0f} ms/rank), cluster start {start:.2f} s "
              f"(runs: local {', '.join(f'{x:.2f}' for x in local)}; dask {', '.join(f'{x:.2f}' for x in remote)})")
        for executor in ("local", "dask"):
            walls = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                subprocess.run([sys.executable, str(REPO / "main.py"), "trace", str(folder), "--no-site", "--executor", executor,
                                "--processes", str(args.workers), "--out", str(Path(tmp) / f"out_{executor}")],
                               env=env, check=True, capture_output=True)
                walls.append(time.perf_counter() - t)
            print(f"command, --executor {executor} --processes {args.workers}: {statistics.median(walls):.2f} s "
                  f"(runs {', '.join(f'{x:.2f}' for x in walls)}; interpreter and cluster start, Parquet and JSON included)")
        same = all((Path(tmp) / "out_local" / f).read_bytes() == (Path(tmp) / "out_dask" / f).read_bytes()
                   for f in ("trace_analysis.json", "events.parquet", "steps.parquet"))
        print(f"outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
