"""The one run of priced plans (:mod:`dml2comm.model`): the analysis and the sweep run a plan
through the same code, so a sweep row is the analysis's number to the last bit, the timeline's
numbers are those of the run without events, and the iteration's tail is the bucket-by-bucket
loop's however the buckets are batched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.stages import StageCoster
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.model import FastEvaluator, run
from dml2comm.parallel.config import ParallelConfig
from dml2comm.sim.levels import iteration_tail
from tests.oracles import bucket_stream


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=6, hidden=512, heads=8, vocab=8192, seq_len=256), path)
    return load_model(str(path), ImportOptions(batch_size=2))


def _configs() -> list[ParallelConfig]:
    return [ParallelConfig(dp_size=8 // (t * p), tp_size=t, pp_size=p, micro_batch_size=2, global_batch_size=32, zero_stage=z,
                           schedule=sch, virtual_stages=v, overlap_grad_reduce=ov, sequence_parallel=t > 1)
            for t, p in ((2, 2), (1, 4), (1, 1), (2, 1)) for z in (0, 1, 2, 3) for ov in (True, False)
            for sch, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1)) if p > 1 or sch == "1f1b"]


_KEYS = ("iteration_time_s", "compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction",
         "mfu", "tflops_per_gpu")


def test_sweep_rows_are_the_analysis_to_the_last_bit(gpt):
    """FastEvaluator's row of a configuration equals analyze_graph's summary exactly (==, not to a
    tolerance): ZeRO 0-3, overlapped and trailing gradient buckets, 1F1B, GPipe and interleaving,
    tied embeddings on two stages.  (Before the one run, the sweep summed a device's compute as
    ``m v (f + b)`` and its buckets in closed form, and the two differed in the last bits.)"""
    configs = _configs()
    cluster = make_cluster("a100", 8, 4)
    rows = FastEvaluator(gpt, cluster, collapse=False).evaluate(configs)
    for config, row in zip(configs, rows):
        assert row["error"] is None, (config, row["error"])
        a = analyze_graph(gpt, config, cluster, advise=False, timeline=False).summary
        for key in _KEYS:
            assert row[key] == a[key], (key, config)


def test_the_timeline_carries_the_numbers_of_the_run_without_events(gpt):
    """run(events=True) (the engine's events) and run(events=False) (the batched recurrence)
    give the same iteration, per-device times and run without communication, bit for bit."""
    configs = [c for c in _configs() if c.pp_size > 1][::3]
    cluster = make_cluster("a100", 8, 4)
    coster = StageCoster(gpt, cluster, collapse=False)
    plans = [coster.prepare(c) for c in configs]
    quiet = run(plans)
    for plan, q in zip(plans, quiet):
        loud = run([plan], events=True)[0]
        assert loud.timeline.events and not q.timeline.events
        for field in ("iteration_time_s", "device_end_s", "compute_end_s", "compute_busy_s", "tp_s", "dp_exposed_s"):
            assert getattr(loud.timeline, field) == getattr(q.timeline, field), (field, plan.config)
        assert loud.free == q.free


@given(st.lists(st.tuples(st.floats(0, 4), st.floats(0, 2), st.sampled_from([1e-5, 1e-3, 0.01, 0.05, 0.3]),
                          st.integers(0, 3000), st.integers(0, 3), st.booleans(), st.booleans()), min_size=1, max_size=4))
@settings(max_examples=80, deadline=None)
@example([(0.0, 2.225073858507e-311, 0.05, 2, 0, False, False)])  # subnormal durations: the binades' ulp is 2^-1074 there
def test_iteration_tail_is_the_bucket_loop_to_the_last_bit(spec):
    """sim.levels.iteration_tail (the one tail of the engine and the sweep) against the loop of
    tests/oracles.py in Python floats: the stream's end and every bucket's start are equal, with
    thousands of buckets, a remainder bucket, buckets as long as the backward share (where the
    stream alternates between keeping up and falling behind), dyadic values that round to ties,
    with and without overlap, after a busy stream."""
    p = len(spec)
    end, dur = np.array([s[0] + s[1] for s in spec]), np.array([s[1] for s in spec])
    buckets, runs = [], []
    for (_, d, scale, n, rest, dyadic, _), e in zip(spec, end):
        tau = d / max(n + (rest > 0), 1) if scale == 0.05 else scale  # 0.05: exactly the backward share
        tau = round(tau * 2 ** 12) / 2 ** 12 if dyadic else tau
        buckets.append([tau] * n + [tau / 3] * (rest > 0))
        runs.append([(tau, n), (tau / 3, int(rest > 0))])
    tau = np.array([[[t for t, _ in r] for r in runs]])
    count = np.array([[[c for _, c in r] for r in runs]], dtype=np.int64)
    overlap = np.array([[s[-1] for s in spec]])
    free = np.array([[0.5 * (i % 2) for i in range(p)]])
    none = np.zeros((1, p))
    tail = iteration_tail(end[None], dur[None], free, tau, count, overlap, none, none, none, starts=True)
    for d in range(p):
        t, starts = bucket_stream(float(end[d] - dur[d]), float(dur[d]), float(end[d]), buckets[d], bool(overlap[0, d]),
                                  float(free[0, d]))
        assert tail.reduced[0, d] == max(t, end[d])
        assert tail.bucket_start[0, d, :len(starts)].tolist() == starts
