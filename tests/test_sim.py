"""The iteration simulator: schedules, bubbles, bounds, monotonicity, and the trace it exports."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.errors import ConfigError
from dml2comm.export.chrome_trace import trace_dict
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.sim.engine import DeviceWork, simulate
from dml2comm.sim.levels import compile_schedule
from dml2comm.parallel.schedule import StepKind
from tests.oracles import build_schedule


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_uniform_stages_without_communication_have_the_textbook_bubble(schedule, v, p, m):
    """Narayanan et al. 2021 Sec. 2.2: (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved."""
    tf, tb = 1.0, 2.0
    result = simulate(build_schedule(schedule, p, m, v), [DeviceWork(tf / v, tb / v)] * p, v)
    busy = m * (tf + tb)
    assert result.iteration_time_s == pytest.approx(busy + (p - 1) / v * (tf + tb))
    assert (result.iteration_time_s - busy) / busy == pytest.approx((p - 1) / (v * m))


def test_every_step_runs_once():
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 3)):
        for steps in build_schedule(name, 3, 6, v):
            fwd = sorted((s.micro_batch, s.chunk) for s in steps if s.kind is StepKind.FORWARD)
            bwd = sorted((s.micro_batch, s.chunk) for s in steps if s.kind is StepKind.BACKWARD)
            assert fwd == bwd == sorted((mb, c) for mb in range(6) for c in range(v))


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_warm_up_is_megatron_cores(p, v):
    """Each device's forwards before its first backward, in the compiled schedule, are
    Megatron-Core's ``num_warmup_microbatches`` (megatron/core/pipeline_parallel/schedules.py):
    ``(p - rank - 1) * 2 + (v - 1) * microbatch_group_size_per_vp_stage`` (default p), capped at
    the m v chunk forwards, and the forward that opens its steady state (one forward, then one
    backward); m = p, where the cap cuts the early stages' warm-up, included."""
    for m in (p, 2 * p, 3 * p):
        cs = compile_schedule("interleaved", p, m, v)
        for rank in range(p):
            forward = cs.forward[cs.device == rank]
            leading = int(forward.argmin())  # forwards before the first backward (every device ends with one)
            assert leading == min(min((p - rank - 1) * 2 + (v - 1) * p, m * v) + 1, m * v)


def test_interleaved_needs_m_multiple_of_p():
    with pytest.raises(ConfigError, match="multiple of --p"):
        build_schedule("interleaved", 4, 6, 2)


def test_serial_iteration_is_the_sum_of_its_parts():
    w = DeviceWork(1.0, 2.0, dp_buckets_s=(0.5, 0.25), optimizer_s=0.1, after_step_s=0.05)
    r = simulate(build_schedule("1f1b", 1, 3), [w])
    # the last bucket is ready only when the last backward ends: 3*(1+2), then 0.25 exposed of it
    # (bucket 0 overlaps the second half of the last backward), then the optimizer and the gather
    assert r.iteration_time_s == pytest.approx(9.0 + 0.25 + 0.1 + 0.05)


works = st.lists(
    st.tuples(st.floats(0.1, 5), st.floats(0.1, 5), st.floats(0, 1), st.floats(0, 1), st.floats(0, 2)), min_size=1, max_size=6
)


@given(works, st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]))
@settings(max_examples=60, deadline=None)
def test_never_shorter_than_its_bounds_and_more_bandwidth_never_slower(spec, m, schedule):
    p = len(spec)
    ws = [DeviceWork(f, b, send_fwd_s=sf, send_bwd_s=sb, dp_buckets_s=(dp,)) for f, b, sf, sb, dp in spec]
    sched = build_schedule(schedule, p, m)
    r = simulate(sched, ws, keep_events=False)
    busiest = max(m * (w.fwd_s + w.bwd_s) for w in ws)
    total = sum(m * (w.fwd_s + w.bwd_s) for w in ws)
    chain = sum(w.fwd_s + w.bwd_s for w in ws)  # one micro-batch through every stage and back
    assert r.iteration_time_s >= busiest - 1e-9
    assert r.iteration_time_s >= total / p - 1e-9
    assert r.iteration_time_s >= chain - 1e-9
    faster = [DeviceWork(w.fwd_s, w.bwd_s, send_fwd_s=w.send_fwd_s / 2, send_bwd_s=w.send_bwd_s / 2,
                         dp_buckets_s=tuple(x / 2 for x in w.dp_buckets_s)) for w in ws]
    assert simulate(sched, faster, keep_events=False).iteration_time_s <= r.iteration_time_s + 1e-9


@pytest.fixture(scope="module")
def small_analysis():
    model = zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=128)
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, micro_batch_size=2, global_batch_size=16, seq_len=128)
    return analyze_graph(load_model_proto(model, ImportOptions(batch_size=2)), config, make_cluster("a100", 8, 8))


def test_analysis_breakdown_adds_up(small_analysis):
    s = small_analysis.summary
    assert s["iteration_time_s"] >= s["compute_time_s"]
    assert s["compute_time_s"] + s["bubble_time_s"] + s["exposed_comm_time_s"] + s["optimizer_time_s"] == pytest.approx(
        s["iteration_time_s"], rel=0.05)


def test_trace_validates(small_analysis):
    trace = trace_dict(small_analysis, small_analysis.timeline)
    json.dumps(trace)
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
            by_thread.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in by_thread.values():  # events on one thread nest: here, they never overlap
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 2e-3 or b1 <= a1  # ts and dur are rounded to the nanosecond separately
    starts = {ev["id"] for ev in trace["traceEvents"] if ev["ph"] == "s"}
    ends = {ev["id"] for ev in trace["traceEvents"] if ev["ph"] == "f"}
    assert starts and starts == ends  # every flow has both ends
    names = {ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert names == {"compute", "pp", "dp", "optimizer"}


def test_recommendations_are_reanalysed_and_faster():
    model = zoo.build_gpt(layers=8, hidden=256, heads=8, vocab=512, seq_len=128)
    config = ParallelConfig(pp_size=4, micro_batch_size=2, global_batch_size=16, seq_len=128)
    a = analyze_graph(load_model_proto(model, ImportOptions(batch_size=2)), config, make_cluster("a100", 4, 4, collective_overhead_s=0.0),
                      reimport=lambda b: load_model_proto(model, ImportOptions(batch_size=b)))
    changes = {r["change"].split(" (")[0]: r for r in a.recommendations}
    assert "--schedule interleaved --virtual-stages 2" in changes
    base = a.summary["iteration_time_s"]
    assert all(r["iteration_time_s"] < base and r["speedup"] == pytest.approx(base / r["iteration_time_s"]) for r in a.recommendations)


def test_tp_comm_overlap_hides_part_of_the_tensor_parallel_time_never_all():
    model = zoo.build_gpt(layers=2, hidden=1024, heads=16, vocab=512, seq_len=512)
    imported = load_model_proto(model, ImportOptions(batch_size=4))
    cluster = make_cluster("a100", 8, 8, collective_overhead_s=0.0)
    base = ParallelConfig(tp_size=8, sequence_parallel=True, micro_batch_size=4, global_batch_size=8, seq_len=512)
    plain = analyze_graph(imported, base, cluster, advise=False)
    from dataclasses import replace

    over = analyze_graph(imported, replace(base, tp_comm_overlap=True), cluster, advise=False)
    assert over.summary["iteration_time_s"] < plain.summary["iteration_time_s"]
    # at least one chunk of every collective (t_comm / t) stays exposed
    tp = sum(c.time_s * c.count_per_iteration for c in plain.comms if c.dim.value == "tp")
    assert over.summary["iteration_time_s"] >= plain.summary["iteration_time_s"] - tp * (1 - 1 / 8) - 1e-12
    with pytest.raises(ConfigError, match="needs --sequence-parallel"):
        ParallelConfig(tp_size=8, tp_comm_overlap=True)


def test_device_sums_run_in_program_order_for_many_rows_in_any_layout():
    """device_sums adds each device's steps one after the other, to the bit, for many distinct
    rows (where numpy would sum a contiguous axis pairwise) and whatever the inputs' memory order."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, device_sums

    rng = np.random.default_rng(7)
    cs = compile_schedule("1f1b", 4, 40)
    f, b = rng.random((64, 4)) * 1e3, rng.random((64, 4)) * 1e-3
    fwd = cs.forward.reshape(4, -1)
    want = np.zeros((64, 4))
    for d in range(4):
        for is_fwd in fwd[d]:
            want[:, d] += f[:, d] if is_fwd else b[:, d]
    for x, y in ((f, b), (np.asfortranarray(f), np.asfortranarray(b)), (f.T.copy().T, b)):
        assert np.array_equal(device_sums(cs, x, y), want)


def test_device_sums_of_repeated_rows_are_each_rows_own():
    """sim.levels.device_sums sums configurations with equal costs once: every row's sums are, to
    the bit, those of the row summed alone (the running sum in program order)."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, device_sums

    rng = np.random.default_rng(5)
    cs = compile_schedule("interleaved", 3, 6, 2)
    f, b = rng.random((3, 3)), rng.random((3, 3))
    rows = [0, 1, 0, 2, 1, 0]  # repeats, in no order
    both = device_sums(cs, f[rows], b[rows])
    for k, r in enumerate(rows):
        alone = device_sums(cs, f[r:r + 1], b[r:r + 1])[0]
        assert np.array_equal(both[k], alone)
        fwd = cs.forward.reshape(3, -1)
        for d in range(3):  # the running sum, step by step
            total = 0.0
            for is_fwd in fwd[d]:
                total += f[r, d] if is_fwd else b[r, d]
            assert both[k, d] == total


@pytest.mark.parametrize("schedule, p, m, v", [("1f1b", 4, 300, 1), ("interleaved", 3, 48, 4), ("gpipe", 2, 500, 1)])
def test_device_sums_of_long_schedules_are_the_running_sum(schedule, p, m, v):
    """device_sums is the running sum in program order to the last bit also where a device has
    hundreds of steps: numpy sums pairwise along a contiguous axis of more than 8 values, which
    rounds differently from the timeline's step-by-step sum (sim.engine); costs of mixed
    magnitudes make any other order show."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, device_sums

    rng = np.random.default_rng(11)
    cs = compile_schedule(schedule, p, m, v)
    k = 7
    f = rng.random((k, p)) * 10.0 ** rng.integers(-6, 1, (k, p))
    b = rng.random((k, p)) * 10.0 ** rng.integers(-6, 1, (k, p))
    sums = device_sums(cs, f, b)
    fwd = cs.forward.reshape(p, -1).tolist()
    for r in range(k):
        for d in range(p):
            total = 0.0
            for is_fwd in fwd[d]:
                total += float(f[r, d]) if is_fwd else float(b[r, d])
            assert sums[r, d] == total, (r, d)
    pairwise = np.where(cs.forward.reshape(p, -1), f[:, :, None], b[:, :, None]).sum(axis=-1)
    assert not np.array_equal(pairwise, sums)  # the costs are such that the order shows


def test_batched_levels_do_not_read_a_previous_calls_memory():
    """pipeline_end_times_many reuses its memory between calls (sim.levels._scratch: the
    layout's row indices and the depth loops' floats) and leaves the rows a depth writes unset
    until then: a call's end times, ZeRO's dp stream included, are
    the same after a larger call with other values as before it."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, pipeline_end_times_many

    rng = np.random.default_rng(3)
    small = [(compile_schedule("1f1b", 3, 5), *(rng.random((4, 3)) for _ in range(4)))]
    zero = [tuple(rng.random((4, 3)) for _ in range(3))]
    first = pipeline_end_times_many(small), pipeline_end_times_many(small, zero_terms=zero)
    big = [(compile_schedule("interleaved", 4, 8, 2), *(1e6 * rng.random((40, 4)) for _ in range(4)))]
    pipeline_end_times_many(big)
    pipeline_end_times_many(big, zero_terms=[tuple(1e6 * rng.random((40, 4)) for _ in range(3))])
    again = pipeline_end_times_many(small), pipeline_end_times_many(small, zero_terms=zero)
    assert np.array_equal(first[0][0], again[0][0])
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first[1], again[1]))


def test_batched_levels_equal_the_per_schedule_recurrence():
    """sim.levels: one pass over every schedule's depth levels (the sweep's fast path) gives the
    end times of each schedule simulated alone; the vectorised bucket tail equals the loop."""
    import numpy as np

    from tests.oracles import bucket_tail_end, pipeline_end_times
    from dml2comm.sim.levels import compile_schedule, iteration_tail, pipeline_end_times_many

    rng = np.random.default_rng(7)
    items = []
    for name, p, m, v in (("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("gpipe", 3, 5, 1), ("1f1b", 1, 4, 1),
                          ("interleaved", 2, 6, 3), ("1f1b", 6, 3, 1)):
        cs = compile_schedule(name, p, m, v)
        k = int(rng.integers(1, 4)) if len(items) % 2 else int(rng.integers(5, 30))  # rows of several widths, padded
        items.append((cs, *(rng.random((k, p)) for _ in range(4))))
    for item, end in zip(items, pipeline_end_times_many(items)):
        assert np.array_equal(end, pipeline_end_times(*item))
    columns = [cs.last_step for cs, *_ in items]
    for item, cols, end in zip(items, columns, pipeline_end_times_many(items, columns)):
        assert np.array_equal(end, pipeline_end_times(*item)[:, cols])
    tau = rng.random((5, 3, 2))
    count = rng.integers(0, 4, (5, 3, 2))
    start, dur = rng.random((5, 3)), rng.random((5, 3))
    none = np.zeros((5, 3))
    for overlap in (True, False):
        many = iteration_tail(start + dur, dur, none, tau, count, overlap, none, none, none).reduced
        for i in range(5):
            for d in range(3):
                runs = [(tau[i, d, r], int(count[i, d, r])) for r in range(2) if count[i, d, r] > 0]
                closed = bucket_tail_end(start[i, d], dur[i, d], start[i, d] + dur[i, d], runs, overlap)
                assert many[i, d] == pytest.approx(max(closed, start[i, d] + dur[i, d]), rel=1e-12, abs=0)


def test_compiled_depths_are_the_longest_chains():
    """sim.levels: the Gauss-Seidel depths equal the longest dependency chain, found here step
    by step (a step is placed once both its predecessors are)."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule

    for name, p, m, v in (("1f1b", 5, 12, 1), ("1f1b", 6, 3, 1), ("interleaved", 4, 8, 2), ("interleaved", 3, 9, 3),
                          ("interleaved", 1, 4, 3), ("gpipe", 4, 6, 1), ("interleaved", 3, 15, 2)):
        cs = compile_schedule(name, p, m, v)
        n = cs.num_steps
        depth = np.full(n + 1, -1)  # slot n: no predecessor
        pending = set(range(n))
        while pending:
            for i in sorted(pending):
                if {int(cs.prev[i]), int(cs.need[i])} & pending:
                    continue
                depth[i] = max(depth[cs.prev[i]], depth[cs.need[i]]) + 1
                pending.discard(i)
        assert np.array_equal(cs.depth, depth[:-1]), (name, p, m, v)
    from dml2comm.sim.levels import _depths, _one_f_one_b_depths

    for p in range(1, 13):  # the closed form for 1F1B equals the relaxation for every m (fewer than p too)
        for m in range(1, 3 * p + 2):
            cs = compile_schedule("1f1b", p, m)
            assert np.array_equal(_one_f_one_b_depths(p, m), _depths(np.arange(2 * m), cs.need, p)), (p, m)
    from dml2comm.sim.levels import _stretched_depths

    stretched = 0
    for p in (2, 3, 4, 5, 7, 8, 12, 16):  # interleaved beyond 2p micro-batches: the base's depths stretched
        for v in (2, 3, 4):
            for m in range(3 * p, 7 * p + 1, p):
                cs = compile_schedule("interleaved", p, m, v)
                depth = _stretched_depths(p, m, v)
                assert depth is not None and np.array_equal(depth, cs.depth), (p, m, v)
                assert np.array_equal(depth, _depths(np.arange(2 * m * v), cs.need, p)), (p, m, v)
                stretched += 1
    assert stretched == 8 * 3 * 5


# ---- the batched recurrence (sim.levels.pipeline_end_times_many, the sweep's) against one
# configuration's (engine.simulate: pipeline_steps with K = 1, turned into events) on send-bound
# work: a device's sends queue on its pp stream in both
def _engine_step_ends(name, p, m, v, works):
    """End of every step in sim.levels' order (device by device, each in schedule order), from
    simulate's compute events (in each device's program order)."""
    import numpy as np

    result = simulate(build_schedule(name, p, m, v), works, v)
    ends: list[list[float]] = [[] for _ in range(p)]
    for ev in result.events:
        if ev.stream == "compute":
            ends[ev.device].append(ev.start_s + ev.dur_s)
    return np.array([e for device in ends for e in device]), result


def _levels_step_ends(name, p, m, v, fwd, bwd, send_fwd, send_bwd, others=3, seed=0):
    """sim.levels' end times of one configuration's steps (per-device costs), alone and batched
    among ``others`` random configurations and a second schedule."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, pipeline_end_times_many
    from tests.oracles import pipeline_end_times

    cs = compile_schedule(name, p, m, v)
    row = [np.array([x], dtype=float) for x in (fwd, bwd, send_fwd, send_bwd)]
    alone = pipeline_end_times(cs, *row)[0]
    rng = np.random.default_rng(seed)
    batch = [np.vstack([rng.random((others, p)) * 3, r]) for r in row]  # the configuration last, padded rows around it
    other = compile_schedule("gpipe", 3, 4)
    many = pipeline_end_times_many([(other, *(rng.random((5, 3)) for _ in range(4))), (cs, *batch)])[1][-1]
    return alone, many


def test_levels_queue_sends_like_the_engine_by_hand():
    """GPipe, p = 2, m = 2, forward 1, backward 2, every send 3 (one pp stream per device):
    device 0: F0 [0, 1] sent [1, 4]; F1 [1, 2] sent [4, 7] (behind F0's send);
    device 1: F0 [4, 5]; F1 [7, 8]; B1 [8, 10] sent [10, 13]; B0 [10, 12] sent [13, 16];
    device 0: B1 [13, 15]; B0 [16, 18].  Without the queue F1 would arrive at 5 and device 0
    would end at 15, device 1 at 10."""
    import numpy as np

    expected = np.array([1.0, 2.0, 15.0, 18.0, 5.0, 8.0, 10.0, 12.0])  # device 0: F0 F1 B1 B0, then device 1
    engine, result = _engine_step_ends("gpipe", 2, 2, 1, [DeviceWork(1.0, 2.0, send_fwd_s=3.0, send_bwd_s=3.0)] * 2)
    assert np.array_equal(engine, expected) and result.compute_end_s == (18.0, 12.0)
    alone, many = _levels_step_ends("gpipe", 2, 2, 1, [1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [3.0, 3.0])
    assert np.array_equal(alone, expected) and np.array_equal(many, expected)


@pytest.mark.parametrize("name,v,ends", [
    # the engine's compute ends per device; the unqueued recurrence gave 81, 51 and 116 on device 0
    # (2.4%, 29% and 9.4% short)
    ("1f1b", 1, (83.0, 78.0, 73.0, 68.0)),
    ("gpipe", 1, (72.0, 67.0, 62.0, 50.0)),
    ("interleaved", 2, (128.0, 123.0, 118.0, 113.0)),
])
def test_levels_equal_the_engine_on_send_bound_work(name, v, ends):
    """Issue 17's case: p = 4, m = 8, forward 1, backward 2, send 3 (per model chunk when
    interleaved), every step's end to 1e-9."""
    p, m = 4, 8
    engine, result = _engine_step_ends(name, p, m, v, [DeviceWork(1.0, 2.0, send_fwd_s=3.0, send_bwd_s=3.0)] * p)
    assert result.compute_end_s == pytest.approx(ends, rel=1e-12)
    alone, many = _levels_step_ends(name, p, m, v, [1.0] * p, [2.0] * p, [3.0] * p, [3.0] * p)
    assert alone == pytest.approx(engine, rel=1e-9, abs=0)
    assert many == pytest.approx(engine, rel=1e-9, abs=0)


@given(st.lists(st.tuples(st.floats(0.1, 2), st.floats(0.1, 3), st.floats(0, 4), st.floats(0, 4)), min_size=1, max_size=5),
       st.integers(1, 4), st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(0, 4))
@settings(max_examples=80, deadline=None)
def test_levels_equal_the_engine_on_random_work(spec, blocks, schedule, others):
    """Random per-device costs with sends up to twice the longest step, so that sends often
    outlast the steps after them: every step's end equal to 1e-9 (interleaved: m a multiple of p)."""
    name, v = schedule
    p = len(spec)
    m = blocks * p if name == "interleaved" else blocks + p - 1
    fwd, bwd, send_fwd, send_bwd = (list(x) for x in zip(*spec))
    works = [DeviceWork(f, b, send_fwd_s=sf, send_bwd_s=sb) for f, b, sf, sb in spec]
    engine, _ = _engine_step_ends(name, p, m, v, works)
    alone, many = _levels_step_ends(name, p, m, v, fwd, bwd, send_fwd, send_bwd, others=others, seed=blocks)
    assert alone == pytest.approx(engine, rel=1e-9, abs=1e-12)
    assert many == pytest.approx(engine, rel=1e-9, abs=1e-12)


@given(st.lists(st.tuples(st.floats(0.1, 2), st.floats(0.1, 3), st.floats(0, 2), st.sampled_from([0.0, 0.5, 3.0]),
                          st.sampled_from([0.0, 0.4, 2.5]), st.sampled_from([0.0, 0.3, 4.0])), min_size=1, max_size=5),
       st.integers(1, 4), st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]))
@settings(max_examples=80, deadline=None)
def test_levels_zero_stream_equals_the_engine_on_random_work(spec, blocks, schedule):
    """Issue 17: sim.levels.pipeline_end_times_zero (the sweep's ZeRO-2/3 recurrence) against
    the engine on random per-device costs with per-micro-batch ZeRO terms (forward all-gather,
    backward all-gather, backward reduce-scatter; 0 on some devices, longer than the steps on
    others, so that prefetched all-gathers delay steps and reduce-scatters queue): every step's
    end and each device's dp-stream end (its last ZeRO event) equal to 1e-9."""
    import numpy as np

    from dml2comm.sim.levels import compile_schedule, pipeline_end_times_many, pipeline_end_times_zero

    name, v = schedule
    p = len(spec)
    m = blocks * p if name == "interleaved" else blocks + p - 1
    works = [DeviceWork(f, b, send_fwd_s=s, send_bwd_s=s, zero_fwd_s=zf, zero_bwd_pre_s=zb, zero_bwd_post_s=rs)
             for f, b, s, zf, zb, rs in spec]
    engine, result = _engine_step_ends(name, p, m, v, works)
    dp_end = [max((ev.start_s + ev.dur_s for ev in result.events if ev.stream == "dp" and ev.device == d), default=0.0)
              for d in range(p)]
    cs = compile_schedule(name, p, m, v)
    f, b, s, zf, zb, rs = (np.array([list(x)]) for x in zip(*spec))
    end, dp = pipeline_end_times_zero(cs, f, b, s, s, zf, zb, rs)
    assert end[0] == pytest.approx(engine, rel=1e-9, abs=1e-12)
    assert dp[0, cs.last_step] == pytest.approx(dp_end, rel=1e-9, abs=1e-12)
    # batched as the sweep runs it: after random configurations (some without ZeRO terms) and
    # beside a second schedule, in pipeline_end_times_many's one pass
    rng = np.random.default_rng(blocks)
    other = compile_schedule("gpipe", 3, 4)
    batch = [np.vstack([rng.random((3, p)) * 3 * (rng.random((3, p)) > 0.3), x]) for x in (f, b, s, zf, zb, rs)]
    item = (cs, batch[0], batch[1], batch[2], batch[2])
    ends, dps = pipeline_end_times_many([(other, *(rng.random((5, 3)) for _ in range(4))), item],
                                        zero_terms=[tuple(rng.random((5, 3)) for _ in range(3)), tuple(batch[3:])])
    assert ends[1][-1] == pytest.approx(engine, rel=1e-9, abs=1e-12)
    assert dps[1][-1, cs.last_step] == pytest.approx(dp_end, rel=1e-9, abs=1e-12)
    alone, alone_dp = pipeline_end_times_zero(*item, *batch[3:])
    assert np.allclose(ends[1], alone, rtol=1e-12, atol=0) and np.allclose(dps[1], alone_dp, rtol=1e-12, atol=0)


# ---- issue 17: simulate is the vectorised recurrence for one configuration, turned into events
def test_simulate_events_by_hand():
    """GPipe, p = 2, m = 2, forward 1, backward 2, every send 3 (the queueing case above), with
    two 1 s gradient buckets on device 0 (overlapped with its last backward B0 [16, 18]:
    bucket 0 ready at 16 + 2 * 1/2 = 17, [17, 18]; bucket 1 ready at 18, [18, 19]), a 0.5 s
    tied-weight all-reduce on both devices from max(19, 12) = 19, a 0.25 s optimizer step on
    both at 19.5, and a 0.125 s parameter all-gather after device 1's step at 19.75.
    Order: the scan's (device 0 runs F0 F1 and waits for B1; device 1 runs all four; device 0
    B1 B0), each step followed by its send, then the buckets, then each device's tail."""
    works = [DeviceWork(1.0, 2.0, send_fwd_s=3.0, send_bwd_s=3.0, dp_buckets_s=(1.0, 1.0), tied_s=0.5, optimizer_s=0.25),
             DeviceWork(1.0, 2.0, send_fwd_s=3.0, send_bwd_s=3.0, tied_s=0.5, optimizer_s=0.25, after_step_s=0.125)]
    r = simulate(build_schedule("gpipe", 2, 2), works)
    assert [tuple(e) for e in r.events] == [
        (0, "compute", "F0", 0.0, 1.0, 0, 0, None), (0, "pp", "send F0", 1.0, 3.0, 0, 0, (1, "F0")),
        (0, "compute", "F1", 1.0, 1.0, 1, 0, None), (0, "pp", "send F1", 4.0, 3.0, 1, 0, (1, "F1")),
        (1, "compute", "F0", 4.0, 1.0, 0, 0, None), (1, "compute", "F1", 7.0, 1.0, 1, 0, None),
        (1, "compute", "B1", 8.0, 2.0, 1, 0, None), (1, "pp", "send B1", 10.0, 3.0, 1, 0, (0, "B1")),
        (1, "compute", "B0", 10.0, 2.0, 0, 0, None), (1, "pp", "send B0", 13.0, 3.0, 0, 0, (0, "B0")),
        (0, "compute", "B1", 13.0, 2.0, 1, 0, None), (0, "compute", "B0", 16.0, 2.0, 0, 0, None),
        (0, "dp", "gradient bucket 0", 17.0, 1.0, -1, 0, None), (0, "dp", "gradient bucket 1", 18.0, 1.0, -1, 0, None),
        (0, "pp", "tied-weight gradient all-reduce", 19.0, 0.5, -1, 0, None), (0, "optimizer", "optimizer step", 19.5, 0.25, -1, 0, None),
        (1, "pp", "tied-weight gradient all-reduce", 19.0, 0.5, -1, 0, None), (1, "optimizer", "optimizer step", 19.5, 0.25, -1, 0, None),
        (1, "dp", "parameter all-gather", 19.75, 0.125, -1, 0, None),
    ]
    assert r.compute_end_s == (18.0, 12.0) and r.compute_busy_s == (6.0, 6.0) and r.dp_exposed_s == (1.0, 0.0)
    assert r.device_end_s == (19.75, 19.875) and r.iteration_time_s == 19.875


def test_simulate_zero3_stream_by_hand():
    """One device, 1F1B, m = 2: forward 1, backward 2, a 0.5 s ZeRO-3 all-gather before every
    step (prefetched when the previous step starts) and a 1 s reduce-scatter after every backward.
    F0: gather [0, 0.5], step [0.5, 1.5]; B0: gather from max(0.5, 0.5), [0.5, 1], step [1.5, 3.5],
    scatter [3.5, 4.5]; F1: gather from max(4.5, 1.5), [4.5, 5], step [5, 6]; B1: gather from
    max(5, 5), [5, 5.5], step [6, 8], scatter [8, 9]: compute ends at 8, the dp stream at 9."""
    w = DeviceWork(1.0, 2.0, zero_fwd_s=0.5, zero_bwd_pre_s=0.5, zero_bwd_post_s=1.0)
    r = simulate(build_schedule("1f1b", 1, 2), [w])
    assert [(e.stream, e.name, e.start_s, e.dur_s) for e in r.events] == [
        ("dp", "ZeRO-3 all-gather", 0.0, 0.5), ("compute", "F0", 0.5, 1.0),
        ("dp", "ZeRO-3 all-gather", 0.5, 0.5), ("compute", "B0", 1.5, 2.0), ("dp", "ZeRO reduce-scatter", 3.5, 1.0),
        ("dp", "ZeRO-3 all-gather", 4.5, 0.5), ("compute", "F1", 5.0, 1.0),
        ("dp", "ZeRO-3 all-gather", 5.0, 0.5), ("compute", "B1", 6.0, 2.0), ("dp", "ZeRO reduce-scatter", 8.0, 1.0),
    ]
    assert r.compute_end_s == (8.0,) and r.dp_exposed_s == (1.0,) and r.iteration_time_s == 9.0


def test_simulate_takes_the_compiled_schedule_and_refuses_other_step_lists():
    from dml2comm.sim.levels import compile_schedule

    works = [DeviceWork(1.0, 2.0, send_fwd_s=0.5, send_bwd_s=0.25, dp_buckets_s=(0.5,), optimizer_s=0.1)] * 4
    for name, m, v in (("gpipe", 4, 1), ("1f1b", 6, 1), ("1f1b", 2, 1), ("interleaved", 8, 2)):
        assert simulate(build_schedule(name, 4, m, v), works, v) == simulate(compile_schedule(name, 4, m, v), works)
    swapped = build_schedule("1f1b", 4, 6)
    swapped[3][0], swapped[3][1] = swapped[3][1], swapped[3][0]  # B0 before F0
    with pytest.raises(ConfigError, match="none of them: compile one with"):
        simulate(swapped, works)
    with pytest.raises(ConfigError, match="interleaved"):  # 1F1B lists run with 2 chunks: no schedule of build_schedule
        simulate(build_schedule("1f1b", 4, 8), works, 2)
    with pytest.raises(ConfigError, match="work for 3 devices and a schedule of 4"):
        simulate(build_schedule("1f1b", 4, 8), works[:3])


def test_scan_order_is_the_order_of_a_step_by_step_scan():
    """CompiledSchedule.scan_order (the order of simulate's events) equals the scan it stands
    for, run here step by step: each device in turn runs its steps as far as their inputs have
    been produced, round after round."""
    from dml2comm.sim.levels import compile_schedule

    for name, p, m, v in (("1f1b", 4, 8, 1), ("1f1b", 5, 3, 1), ("gpipe", 3, 4, 1), ("interleaved", 4, 8, 2),
                          ("interleaved", 1, 3, 3), ("interleaved", 3, 6, 2)):
        cs = compile_schedule(name, p, m, v)
        n, per = cs.num_steps, cs.num_steps // p
        done, scanned, at = set(), [], [0] * p
        while len(scanned) < n:
            for d in range(p):
                while at[d] < per and (int(cs.need[d * per + at[d]]) == n or int(cs.need[d * per + at[d]]) in done):
                    done.add(d * per + at[d])
                    scanned.append(d * per + at[d])
                    at[d] += 1
        assert cs.scan_order.tolist() == scanned, (name, p, m, v)


@given(st.lists(st.tuples(st.floats(0, 3), st.floats(0, 2), st.integers(0, 5), st.floats(0, 1), st.booleans()), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_iteration_tail_buckets_end_at_the_closed_form(spec):
    """sim.levels.iteration_tail runs the buckets one by one (for their starts); their end
    equals bucket_tail_end's closed form (the sweep's) to 1e-12."""
    import numpy as np

    from dml2comm.sim.levels import iteration_tail
    from tests.oracles import bucket_tail_end

    start = np.array([s for s, *_ in spec])
    dur = np.array([d for _, d, *_ in spec])
    buckets = [tuple(tau * (1 + i % 2) for i in range(k)) for _, _, k, tau, _ in spec]
    overlap = np.array([o for *_, o in spec])[None]
    free = np.full((1, len(spec)), 0.25)
    width = max(len(b) for b in buckets)
    tau = np.array([[list(b) + [0.0] * (width - len(b)) for b in buckets]])
    count = np.array([[[1] * len(b) + [0] * (width - len(b)) for b in buckets]], dtype=np.int64)
    none = np.zeros((1, len(spec)))
    tail = iteration_tail((start + dur)[None], dur[None], free, tau, count, overlap, none, none, none, starts=True)
    tail = type(tail)(tail.bucket_start[0], tail.reduced[0], tail.tied_start[0], tail.step_start[0], tail.end[0])
    for d, b in enumerate(buckets):
        runs = [(t, 1) for t in b]
        closed = bucket_tail_end(start[d], dur[d], start[d] + dur[d], runs, bool(overlap[0, d]), stream_free=0.25)
        assert tail.reduced[d] == pytest.approx(max(closed, start[d] + dur[d]), rel=1e-12, abs=1e-15)
        for i in range(1, len(b)):  # a bucket starts once the one before it has ended
            assert tail.bucket_start[d, i] >= tail.bucket_start[d, i - 1] + b[i - 1] - 1e-12
