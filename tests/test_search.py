"""The configuration space, the sweep, and the sweep / compare commands."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm import zoo
from dml2comm.cost.cache import layers_of
from dml2comm.analysis import analyze_graph
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import RECOMPUTE_MODES, ParallelConfig
from dml2comm.cli.search import run_compare_command, run_sweep_command
from dml2comm.search.report import parse_config_spec
from dml2comm.search.space import Constraints, enumerate_configs, parse_int_list
from dml2comm.search.sweep import CsvStream, SweepSpace, pareto_front, run_sweep


def _builder(num_gpus):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("search") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=128), path)
    return str(path)


# A narrow space keeps the sweeps fast: 8 GPUs, b in {1, 2}, ZeRO 0, recompute none/full.
SMALL = Constraints(micro_batch_sizes=(1, 2), zero_stages=(0,), recompute=("none", "full"))


@pytest.fixture(scope="module")
def sweep_w1(gpt):
    return run_sweep(gpt, 8, _builder, SweepSpace(global_batch_size=16, constraints=SMALL))


# ---- the space
def _brute_force(n, batch, layers, heads, c: Constraints):
    """Every combination of every choice, filtered by the rules written out once more."""
    out = set()
    for d, t, p, b, v, zero, rec, sp in itertools.product(range(1, n + 1), range(1, n + 1), range(1, n + 1),
                                                          c.micro_batch_sizes, c.virtual_stages, c.zero_stages,
                                                          RECOMPUTE_MODES, (False, True)):
        if d * t * p != n or (heads and heads % t) or t > c.gpus_per_node or p > layers or batch % (b * d):
            continue
        if (c.d and d not in c.d) or (c.t and t not in c.t) or (c.p and p not in c.p):
            continue
        if (c.max_d and d > c.max_d) or (c.max_t and t > c.max_t) or (c.max_p and p > c.max_p):
            continue
        m = batch // (b * d)
        if v > 1 and (p == 1 or m % p or p * v > layers):
            continue
        if rec not in c.recompute or sp not in c.sequence_parallel or (sp and t == 1):
            continue
        out.add((d, t, p, b, v, zero, rec, sp))
    return out


def _key(cfg: ParallelConfig):
    return (cfg.dp_size, cfg.tp_size, cfg.pp_size, cfg.micro_batch_size, cfg.virtual_stages, cfg.zero_stage,
            cfg.recompute, cfg.sequence_parallel)


def test_enumeration_is_complete_against_brute_force():
    c = Constraints(zero_stages=(0, 1))
    got = [_key(x) for x in enumerate_configs(16, 32, 10, 8, 8, 128, c)]
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == _brute_force(16, 32, 10, 8, c)
    # hand count for one slice: d=1, t=2, p=8, b=1 -> m=32: v=1 only (p*v=16 > 10), 2 zero x 3 rec x 2 sp = 12
    assert sum(1 for k in got if k[:4] == (1, 2, 8, 1)) == 12


def test_enumeration_with_constraints_matches_brute_force():
    c = Constraints(t=(1, 2), max_p=4, micro_batch_sizes=(1, 4), zero_stages=(0, 3), recompute=("none",),
                    sequence_parallel=(False,))
    got = {_key(x) for x in enumerate_configs(16, 64, 12, 16, 4, 256, c)}
    assert got == _brute_force(16, 64, 12, 16, c)
    assert all(k[1] in (1, 2) and k[2] <= 4 and k[3] in (1, 4) and not k[7] for k in got)


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32]), batch=st.integers(1, 64), layers=st.integers(1, 20),
       heads=st.sampled_from([None, 1, 4, 6, 8, 12, 32]))
def test_every_yielded_config_is_valid(n, batch, layers, heads):
    try:
        configs = list(enumerate_configs(n, batch, layers, heads, heads, 128))
    except ConfigError as exc:  # nothing valid: a one-line message, and brute force agrees
        assert "\n" not in str(exc) and "no valid configuration" in str(exc)
        assert not _brute_force(n, batch, layers, heads, Constraints())
        return
    for cfg in configs:
        ParallelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ParallelConfig)})  # re-validates
        assert cfg.num_gpus == n
        assert batch % (cfg.micro_batch_size * cfg.dp_size) == 0
        assert heads is None or heads % cfg.tp_size == 0
        assert cfg.pp_size <= layers and cfg.tp_size <= 8
        if cfg.virtual_stages > 1:
            assert cfg.schedule == "interleaved" and cfg.num_micro_batches % cfg.pp_size == 0
        assert not cfg.sequence_parallel or cfg.tp_size > 1
    assert {_key(c) for c in configs} == _brute_force(n, batch, layers, heads, Constraints())


@pytest.mark.parametrize("kwargs, words", [
    ({"t": (3,)}, ["--t 3", "does not divide --gpus 8", "[1, 2, 4, 8]"]),
    ({"p": (16,)}, ["--p 16", "does not divide"]),
    ({"zero_stages": (4,)}, ["--zero must be 0, 1, 2 or 3, got 4"]),
    ({"recompute": ("some",)}, ["--recompute"]),
    ({"micro_batch_sizes": ()}, ["--micro-batch-sizes"]),
    ({"max_p": 0}, ["--max-p"]),
    ({"t": (8,), "max_t": 4}, ["no valid configuration", "loosen"]),
])
def test_bad_constraints_give_one_line(kwargs, words):
    with pytest.raises(ConfigError) as info:
        list(enumerate_configs(8, 16, 6, 8, 8, 128, Constraints(**kwargs)))
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message


def test_parse_int_list():
    assert parse_int_list("4,1,2,2", "--t") == (1, 2, 4)
    for bad in ("1,x", "0", "", "-2"):
        with pytest.raises(ConfigError, match="--t expects comma-separated positive integers"):
            parse_int_list(bad, "--t")


# ---- the sweep
def test_sweep_ranks_fitting_configs_by_time(sweep_w1):
    r = sweep_w1
    assert r.num_configs == len(r.rows) > 20 and not r.interrupted
    fitting = [x for x in r.evaluated if x["fits"]]
    assert r.best == min(fitting, key=lambda x: (x["iteration_time_s"], x["index"]))
    times = [x["iteration_time_s"] for x in r.top(10)]
    assert times == sorted(times) and len(times) == 10


def test_pareto_front_is_non_dominated_and_complete(sweep_w1):
    rows = sweep_w1.evaluated
    front = sweep_w1.pareto()
    key = {(x["iteration_time_s"], x["peak_memory_bytes"]) for x in front}

    def dominates(a, b):
        return (a["iteration_time_s"] <= b["iteration_time_s"] and a["peak_memory_bytes"] <= b["peak_memory_bytes"]
                and (a["iteration_time_s"] < b["iteration_time_s"] or a["peak_memory_bytes"] < b["peak_memory_bytes"]))

    for f in front:
        assert not any(dominates(x, f) for x in rows)
    for x in rows:  # everything off the front is dominated (or duplicates a point on it)
        if (x["iteration_time_s"], x["peak_memory_bytes"]) not in key:
            assert any(dominates(f, x) for f in front)


def test_pareto_front_by_hand():
    rows = [{"index": i, "iteration_time_s": t, "peak_memory_bytes": m}
            for i, (t, m) in enumerate([(1.0, 9.0), (2.0, 5.0), (2.0, 6.0), (3.0, 5.0), (4.0, 1.0), (1.0, 9.0)])]
    assert [r["index"] for r in pareto_front(rows)] == [0, 1, 4]


def test_sweep_number_equals_direct_analysis(gpt, sweep_w1):
    row = next(x for x in sweep_w1.rows if x["config"]["d"] == 2 and x["config"]["t"] == 2 and x["config"]["micro_batch_size"] == 2
               and x["config"]["recompute"] == "full" and x["config"]["sequence_parallel"])
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, micro_batch_size=2, global_batch_size=16, seq_len=128,
                            recompute="full", sequence_parallel=True)
    assert row["config"] == config.to_dict()
    analysis = analyze_graph(load_model(gpt, ImportOptions(batch_size=2, seq_len=128)), config, _builder(8), gpt, advise=False)
    # the fast path sums the same terms in another order: equal to rounding
    assert row["iteration_time_s"] == pytest.approx(analysis.summary["iteration_time_s"], rel=1e-12)
    assert row["peak_memory_bytes"] == analysis.summary["peak_memory_bytes"]
    assert row["mfu"] == pytest.approx(analysis.summary["mfu"], rel=1e-12)
    flops = 3 * analysis.model_info["flops_fwd_per_sample"] * 16
    assert row["tflops_per_gpu"] == pytest.approx(flops / (analysis.summary["iteration_time_s"] * 8) / 1e12, rel=1e-12)


def test_two_workers_give_the_same_results(gpt, sweep_w1):
    r2 = run_sweep(gpt, 8, _builder, SweepSpace(global_batch_size=16, constraints=SMALL), workers=2)
    assert r2.rows == sweep_w1.rows


def test_failed_configs_are_counted_with_their_reason(gpt, monkeypatch):
    from dml2comm.search import sweep as sweep_module

    real = sweep_module.Evaluator.analyze

    def analyze(self, config):  # pretend the analysis rejects t=4 (as it does t not dividing an FFN size)
        if config.tp_size == 4:
            raise ConfigError("--t 4 does not divide the output size 1000; choose t dividing 1000")
        return real(self, config)

    monkeypatch.setattr(sweep_module.Evaluator, "analyze", analyze)
    r = run_sweep(gpt, 8, _builder, SweepSpace(global_batch_size=16, constraints=dataclasses.replace(SMALL, t=(2, 4))),
                  fast=False)
    failed = [x for x in r.rows if x["error"]]
    assert failed and all(x["config"]["t"] == 4 and x["fits"] is False for x in failed)
    assert r.failure_reasons() == {"--t 4 does not divide the output size 1000; choose t dividing 1000": len(failed)}
    assert all(x["config"]["t"] == 2 for x in r.ranked() + r.pareto())


def test_interrupted_sweep_keeps_finished_rows(gpt, tmp_path):
    stream = CsvStream(tmp_path / "partial.csv")
    n = 5

    def on_result(row, done, total):
        stream.write(row)
        if done == n:
            raise KeyboardInterrupt

    r = run_sweep(gpt, 8, _builder, SweepSpace(global_batch_size=16, constraints=SMALL), on_result=on_result)
    stream.close()
    assert r.interrupted and len(r.rows) == n
    with open(tmp_path / "partial.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == n


# ---- the commands
def test_sweep_command_writes_csv_and_data_json(gpt, tmp_path, capsys):
    out = tmp_path / "out"
    rc = run_sweep_command([gpt, "--gpus", "8", "--global-batch-size", "16", "--micro-batch-sizes", "1,2", "--zero", "0",
                            "--recompute", "none,full", "--t", "2,4", "--no-site", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "data.json").read_text())
    s = data["sweep"]
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == s["num_configs"] == s["num_evaluated"] + s["num_failed"]
    assert {r["t"] for r in rows} <= {"2", "4"}
    assert s["best"] == s["top"][0] and len(s["top"]) == 10
    assert set(s["best"]) >= {"config", "iteration_time_s", "tflops_per_gpu", "peak_memory_bytes", "fits"}
    assert s["best"]["iteration_time_s"] == min(float(r["iteration_time_s"]) for r in rows if r["fits"] == "True")
    assert not (out / "sweep.partial.csv").exists()
    assert "Pareto front" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--t", "1,x"], "--t expects comma-separated positive integers"),
    (["--t", "3"], "--t 3 does not divide --gpus 8"),
    (["--zero", "5"], "--zero must be 0, 1, 2 or 3, got 5"),
    (["--recompute", "sometimes"], "--recompute got 'sometimes'"),
    (["--t", "8", "--max-t", "4"], "no valid configuration"),
])
def test_sweep_command_bad_constraints(gpt, tmp_path, argv, words):
    with pytest.raises(ConfigError, match=words.replace("-", "\\-")) as info:
        run_sweep_command([gpt, "--gpus", "8", "--out", str(tmp_path / "o"), *argv])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o" / "data.json").exists()


def test_parse_config_spec():
    cfg = parse_config_spec("d=2,t=2,p=4,b=1,zero=1,recompute=full,sp=1,v=2", 64, 128)
    assert (cfg.dp_size, cfg.tp_size, cfg.pp_size, cfg.micro_batch_size, cfg.zero_stage, cfg.recompute,
            cfg.sequence_parallel, cfg.virtual_stages, cfg.schedule) == (2, 2, 4, 1, 1, "full", True, 2, "interleaved")
    for bad, words in (("d=2,x=1", "cannot read 'x=1'"), ("d=two", "not an integer"), ("t=1,sp=1", "sp=1 needs t"),
                       ("d=3", "not divisible")):
        with pytest.raises(ConfigError, match=words):
            parse_config_spec(bad, 64, 128)


def test_compare_command(gpt, tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = run_compare_command([gpt, "--global-batch-size", "16", "--out", str(out), "--no-site", "--configs", "d=2,t=2,p=2",
                              "d=1,t=4,p=2,b=2,zero=1,recompute=full,sp=1"])
    assert rc == 0
    data = json.loads((out / "data.json").read_text())
    assert [e["spec"] for e in data["compare"]] == ["d=2,t=2,p=2", "d=1,t=4,p=2,b=2,zero=1,recompute=full,sp=1"]
    assert data["compare"][1]["config"]["zero_stage"] == 1
    assert (out / "compare.csv").read_text().count("\n") == 3
    assert "side by side" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="d=1,t=8,p=7.*larger than the model's 6 layers"):
        run_compare_command([gpt, "--global-batch-size", "16", "--out", str(out), "--configs", "d=1,t=8,p=7"])


# ---- the fast path (dml2comm/model/) against the full analysis
def _full_vs_fast(path, gpus, batch, constraints, limit=None):
    space = SweepSpace(global_batch_size=batch, constraints=constraints)
    full = run_sweep(path, gpus, _builder, space, fast=False, limit=limit)
    quick = run_sweep(path, gpus, _builder, space, fast=True, limit=limit)
    return full, quick


def test_fast_path_equals_the_full_analysis_on_every_config(gpt):
    """Issue 7: the fast path agrees with the full run within 1% on iteration time and exactly
    on memory.  It reproduces the simulation itself, so the agreement is to rounding; every
    configuration of the space (1F1B and interleaved, ZeRO 0-3, every recomputation, SP) is
    checked.  Issue 17: ZeRO-2/3 run on the fast path too (their per-micro-batch collectives on
    the dp stream of the batched recurrence, sim.levels.pipeline_end_times_zero)."""
    from dml2comm.model import supports

    constraints = dataclasses.replace(SMALL, zero_stages=(0, 1, 2, 3), virtual_stages=(1, 2))
    full, quick = _full_vs_fast(gpt, 8, 16, constraints)
    assert len(full.rows) == len(quick.rows) > 20
    schedules, zeros = set(), set()
    for a, b in zip(full.rows, quick.rows):
        assert a["config"] == b["config"] and a["error"] == b["error"]
        if a["error"]:
            continue
        schedules.add(a["config"]["schedule"])
        zeros.add(a["config"]["zero_stage"])
        assert b["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9)
        assert b["peak_memory_bytes"] == a["peak_memory_bytes"]
        assert b["fits"] == a["fits"]
        for key in ("compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction", "mfu",
                    "tflops_per_gpu"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
    assert schedules == {"1f1b", "interleaved"} and zeros == {0, 1, 2, 3}
    assert supports(ParallelConfig(dp_size=2, zero_stage=3, global_batch_size=4))


def test_fast_path_equals_the_analysis_with_zero_2_3_and_tp_comm_overlap(gpt):
    """Issue 17: ZeRO 0-3 x --tp-comm-overlap (with SP) x every recomputation x 1F1B, GPipe and
    interleaved, on splits with and without d and p, through FastEvaluator against
    analyze_graph: time and breakdown to 1e-9, memory exactly.  ZeRO-3's all-gathers delay
    the steps (prefetched when the previous step starts), ZeRO-2/3's reduce-scatters queue on
    the dp stream and end the iteration when they outlast the compute."""
    from dml2comm.model import FastEvaluator

    imported = load_model(gpt, ImportOptions(batch_size=1))
    cluster = _builder(8)
    configs = [ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=1, global_batch_size=16, seq_len=None,
                              recompute=r, sequence_parallel=sp, tp_comm_overlap=ov, zero_stage=z, schedule=sch, virtual_stages=v)
               for (d, t, p) in ((2, 2, 2), (1, 2, 4), (4, 1, 2), (8, 1, 1)) for z in range(4) for r in RECOMPUTE_MODES
               for sp, ov in ((False, False), (True, False), (True, True)) if t > 1 or not sp
               for sch, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1)) if p > 1 or sch == "1f1b"]
    rows = FastEvaluator(imported, cluster).evaluate(configs)
    exposed_rs = 0
    for config, row in zip(configs, rows):
        full = analyze_graph(imported, config, cluster, advise=False, timeline=False)
        a = full.summary
        assert row["error"] is None, (config, row["error"])
        assert row["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9), config
        assert row["peak_memory_bytes"] == a["peak_memory_bytes"], config
        for key in ("compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction", "mfu"):
            assert row[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (key, config)
        if config.zero_stage >= 2 and max(full.timeline.dp_exposed_s) > 0:
            exposed_rs += 1
    assert len(configs) > 150 and exposed_rs > 0  # the dp stream's end shows in some iterations


def test_fast_path_on_a_real_export_matches_main_py(tmp_path):
    """The GPT-2 export bundled with the quick start, through the real command line, at the
    configuration the fast path evaluates."""
    from dml2comm.model import FastEvaluator
    from dml2comm.analysis import analyze
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model
    from dml2comm.parallel.config import ParallelConfig

    model = Path(__file__).resolve().parents[1] / "examples" / "gpt2-small.onnx"
    configs = [ParallelConfig(dp_size=2, tp_size=2, pp_size=4, micro_batch_size=1, global_batch_size=16, seq_len=None,
                              recompute=r, sequence_parallel=sp, zero_stage=z, schedule=sch, virtual_stages=v)
               for r in ("none", "selective", "full") for sp in (False, True) for z in (0, 1)
               for sch, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1))]
    cluster = _builder(16)
    fast = FastEvaluator(load_model(model, ImportOptions(batch_size=1)), cluster).evaluate(configs)
    for config, row in zip(configs, fast):
        s = analyze(model, config, cluster).summary
        assert row["iteration_time_s"] == pytest.approx(s["iteration_time_s"], rel=1e-9)
        assert row["peak_memory_bytes"] == s["peak_memory_bytes"]


# ---- collapsed repeated blocks (dml2comm/ir/repeats.py) under the fast path
@pytest.fixture(scope="module")
def deep_gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("deep") / "gpt10.onnx"
    zoo.save(zoo.build_gpt(layers=10, hidden=256, heads=8, vocab=512, seq_len=128), path)
    return str(path)


def test_collapse_keeps_four_blocks_of_a_run_and_maps_every_layer(deep_gpt):
    from dml2comm.ir.layers import group_layers
    from dml2comm.ir.repeats import MIN_RUN, collapse_repeats

    graph = load_model(deep_gpt, ImportOptions(batch_size=1)).graph
    layered = group_layers(graph)
    kinds = [l.kind for l in layered.layers]
    assert kinds.count("block") == 10
    c = collapse_repeats(graph, layered)
    assert c is not None and len(c.runs) == 1
    i, j, _ = c.runs[0]
    assert j - i + 1 >= MIN_RUN
    # kept: everything outside the run, blocks i..i+2 and j; interior blocks share i+2's layer
    assert list(c.full_index) == [li for li in range(len(kinds)) if not i + 3 <= li < j]
    assert [c.layer_map[li] for li in range(i + 2, j)] == [c.layer_map[i + 2]] * (j - i - 2)
    assert len(c.graph.ops) < len(graph.ops)
    # a model with fewer identical blocks than MIN_RUN is not collapsed
    short = load_model(_short_gpt(deep_gpt), ImportOptions(batch_size=1)).graph
    assert collapse_repeats(short, group_layers(short)) is None


def _short_gpt(deep_path):
    path = Path(deep_path).with_name("gpt4.onnx")
    if not path.exists():
        zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=128), path)
    return str(path)


def test_collapsed_fast_path_equals_the_whole_graph(deep_gpt):
    """The fast path on the collapsed model gives the numbers of the fast path on the whole
    graph (which equals the full analysis, above) for every recomputation, SP, ZeRO stage and
    schedule, and pipeline splits that cut inside the run of identical blocks."""
    from dml2comm.model import FastEvaluator

    imported = load_model(deep_gpt, ImportOptions(batch_size=2))
    configs = [ParallelConfig(dp_size=16 // (t * p), tp_size=t, pp_size=p, micro_batch_size=2, global_batch_size=64,
                              seq_len=None, recompute=r, sequence_parallel=sp and t > 1, zero_stage=z,
                              schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)
               for t, p in ((1, 1), (2, 2), (2, 4), (4, 4), (1, 8)) for r in RECOMPUTE_MODES for sp in (False, True)
               for z in (0, 1) for v in (1, 2) if not (v > 1 and p == 1)]
    cluster = _builder(16)
    collapsed = FastEvaluator(imported, cluster)
    assert collapsed.collapsed is not None
    whole = FastEvaluator(imported, cluster, collapse=False)
    for config, a, b in zip(configs, collapsed.evaluate(configs), whole.evaluate(configs)):
        assert a["error"] == b["error"], config
        if a["error"]:
            continue
        assert a["peak_memory_bytes"] == pytest.approx(b["peak_memory_bytes"], rel=1e-12), config
        for key in ("iteration_time_s", "compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-15), (key, config)


def test_other_micro_batches_import_only_the_collapsed_model(deep_gpt):
    """After the first import, the sweep imports the collapsed ONNX model for other micro-batch
    sizes; its numbers equal those of the whole model's import."""
    from dml2comm.model import FastEvaluator
    from dml2comm.search.sweep import Evaluator

    evaluator = Evaluator(deep_gpt, _builder)
    evaluator.prepare_fast(1)
    fe = evaluator.fast_evaluator(4, 8)
    assert fe.pre_collapsed and len(fe.graph.ops) < len(evaluator.imported(1).graph.ops)
    assert 4 not in evaluator._imports  # the whole model was not imported again
    configs = [ParallelConfig(dp_size=2, tp_size=2, pp_size=2, micro_batch_size=4, global_batch_size=32, seq_len=None,
                              recompute=r, sequence_parallel=True) for r in RECOMPUTE_MODES]
    whole = FastEvaluator(load_model(deep_gpt, ImportOptions(batch_size=4)), _builder(8), collapse=False)
    for a, b in zip(fe.evaluate(configs), whole.evaluate(configs)):
        assert a["peak_memory_bytes"] == pytest.approx(b["peak_memory_bytes"], rel=1e-12)
        assert a["iteration_time_s"] == pytest.approx(b["iteration_time_s"], rel=1e-9)


def test_fused_kernels_never_span_blocks():
    """Megatron-LM's kernels end where a tensor is written for another kernel (the residual
    stream read by the next LayerNorm): no fused region holds ops of two layers."""
    from dml2comm.cost.ops import fused_kernels
    from dml2comm.ir.layers import group_layers

    graph = load_model(Path(__file__).resolve().parents[1] / "examples" / "gpt2-small.onnx", ImportOptions(batch_size=1)).graph
    layer_of = group_layers(graph).layer_of_op
    regions: dict[int, set[int]] = {}
    for op, region in fused_kernels(graph).items():
        regions.setdefault(region, set()).add(layer_of[op])
    assert regions and all(len(layers) == 1 for layers in regions.values())
    assert max(sum(1 for r in fused_kernels(graph).values() if r == k) for k in regions) >= 3  # bias-dropout-add, GeLU chains


def test_sweep_rows_equal_their_analyses_on_a_collapsed_llama_70b(tmp_path):
    """Every row of a sweep of Llama-2-70B on 256 H100s (80 identical blocks: the fast path
    runs on the collapsed model, and on the collapsed model's own import for the second
    micro-batch size) equals the analysis of its configuration on the whole graph, to rounding.
    A decomposed RMSNorm (``Pow``, ``Mul``) reads the residual stream directly: before kernels
    ended at layer boundaries, every block's norms and residual adds were one fused kernel, and
    the rows were 2e-4 away from the analyses."""
    from dml2comm.cost.ops import fused_kernels
    from dml2comm.search.sweep import config_from_dict

    path = tmp_path / "llama2-70b.onnx"
    zoo.save(zoo.build_preset("llama2-70b"), path)

    def h100(n):
        return get_cluster("dgx-h100", n)

    constraints = Constraints(d=(16, 8), t=(2,), p=(8, 16), micro_batch_sizes=(1, 2), virtual_stages=(1, 4), zero_stages=(1,),
                              recompute=("selective",), sequence_parallel=(True,))
    result = run_sweep(str(path), 256, h100, SweepSpace(global_batch_size=512, constraints=constraints))
    assert len(result.rows) == 8 and not any(row["error"] for row in result.rows)
    imports = {}
    for row in result.rows:
        config = config_from_dict(row["config"])
        b = config.micro_batch_size
        imported = imports.get(b) or imports.setdefault(b, load_model(str(path), ImportOptions(batch_size=b)))
        s = analyze_graph(imported, config, h100(256), str(path), advise=False, timeline=False).summary
        assert row["peak_memory_bytes"] == s["peak_memory_bytes"], config
        for key in ("iteration_time_s", "compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "mfu",
                    "tflops_per_gpu"):
            assert row[key] == pytest.approx(s[key], rel=1e-9, abs=1e-15), (key, config)
    # no fused kernel holds ops of two layers (what the collapse relies on)
    graph = imports[1].graph
    layer_of = layers_of(graph).layer_of_op
    spans: dict[int, set[int]] = {}
    for op, region in fused_kernels(graph).items():
        spans.setdefault(region, set()).add(layer_of[op])
    assert spans and all(len(layers) == 1 for layers in spans.values())


# ---- context and expert parallelism in sweeps (issue 9)
@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "moe.onnx"
    zoo.save(zoo.build_moe(layers=2, hidden=128, heads=8, kv_heads=4, ffn_hidden=256, experts=4, top_k=2, vocab=256,
                           seq_len=64), path)
    return str(path)


def test_enumeration_with_cp_and_ep_is_complete_and_valid():
    """Every (d, t, p, c, e) with d*t*p*c = N, c dividing the sequence and (Ulysses) the heads
    over t*c, e dividing the experts and d*c; each configuration constructs."""
    constraints = Constraints(micro_batch_sizes=(1,), virtual_stages=(1,), zero_stages=(0,), recompute=("none",),
                              sequence_parallel=(False,), cp=(1, 2, 4), ep=(1, 2, 4))
    configs = list(enumerate_configs(16, 32, 4, 8, 4, 64, constraints, experts=4))
    seen = {(c.dp_size, c.tp_size, c.pp_size, c.cp_size, c.ep_size) for c in configs}
    expected = {(d, t, p, c, e) for d in (1, 2, 4, 8, 16) for t in (1, 2, 4, 8) for c in (1, 2, 4) for e in (1, 2, 4)
                for p in [16 // (d * t * c)] if d * t * c * p == 16 and p <= 4 and 8 % (t * c) == 0 and 64 % c == 0
                and 4 % e == 0 and (d * c) % e == 0 and 32 % d == 0}
    assert seen == expected and any(c > 1 for _, _, _, c, _ in seen) and any(e > 1 for *_, e in seen)
    with pytest.raises(ConfigError, match="no experts"):
        list(enumerate_configs(16, 32, 4, 8, 4, 64, constraints, experts=None))


def test_sweep_over_cp_and_ep_evaluates_them(moe, tmp_path, capsys):
    """--cp and --ep lists reach the rows (through the fast path), the CSV has c and e,
    --ep on a model without experts is a one-line error, and compare specs take c= and e=."""
    out = tmp_path / "out"
    code = run_sweep_command([moe, "--gpus", "8", "--global-batch-size", "16", "--cp", "1,2", "--ep", "1,2",
                              "--micro-batch-sizes", "1", "--virtual-stages", "1", "--zero", "0", "--recompute", "none",
                              "--no-sp", "--out", str(out), "--no-site", "--json"])
    assert code == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    combos = {(r["c"], r["e"]) for r in rows if not r["error"]}
    assert {("1", "1"), ("2", "1"), ("1", "2"), ("2", "2")} <= combos
    with pytest.raises(ConfigError, match="no experts") as info:  # main.py prints it as one line, exit 2
        run_sweep_command([_plain_gpt(tmp_path), "--gpus", "8", "--ep", "1,2", "--out", str(tmp_path / "x"), "--no-site"])
    assert "\n" not in str(info.value) and not (tmp_path / "x" / "sweep.csv").exists()
    cfg = parse_config_spec("d=2,t=1,p=1,c=2,e=2", 16, 64)
    assert (cfg.cp_size, cfg.ep_size, cfg.num_gpus) == (2, 2, 4)


def _plain_gpt(tmp_path):
    path = tmp_path / "plain.onnx"
    zoo.save(zoo.build_gpt(layers=2, hidden=128, heads=8, vocab=256, seq_len=64), path)
    return str(path)


def test_chunks_cover_every_config_once_and_keep_blocks_whole(monkeypatch):
    """Work units: every configuration exactly once, none over CHUNK, a (micro-batch, t, c, e)
    block no larger than CHUNK never split (a split block's tables are built by two workers),
    one micro-batch size per chunk, and the largest estimated work handed out first."""
    from dml2comm.search import sweep

    monkeypatch.setattr(sweep, "CHUNK", 100)
    constraints = Constraints(micro_batch_sizes=(1, 2, 4), gpus_per_node=8)
    configs = list(enumerate_configs(64, 128, 24, 16, 16, 1024, constraints))
    chunks = sweep._chunks(configs)
    flat = [i for c in chunks for i in c]
    assert sorted(flat) == list(range(len(configs)))
    assert all(len(c) <= 100 for c in chunks)
    blocks: dict[tuple, set[int]] = {}
    for k, c in enumerate(chunks):
        assert len({configs[i].micro_batch_size for i in c}) == 1
        for i in c:
            blocks.setdefault(sweep._block(configs[i]), set()).add(k)
    sizes: dict[tuple, int] = {}
    for config in configs:
        sizes[sweep._block(config)] = sizes.get(sweep._block(config), 0) + 1
    for block, where in blocks.items():
        assert len(where) == (1 if sizes[block] <= 100 else -(-sizes[block] // 100))
    work = [sweep._work_of(configs, c) for c in chunks]
    assert work == sorted(work, reverse=True)
    assert any(len(where) > 1 for where in blocks.values())  # the case exercises splitting


def test_csv_stream_flushes_on_time_and_on_close(tmp_path):
    from dml2comm.search.sweep import METRICS

    row = {"index": 0, "config": {"d": 1, "t": 1, "p": 1}, "error": None, **{k: 1.0 for k in METRICS}}

    def lines(path) -> int:
        return len((tmp_path / path).read_text().splitlines())

    eager = CsvStream(tmp_path / "eager.csv", flush_s=0.0)
    eager.write(row)
    assert lines("eager.csv") == 2  # header + the row, before close
    lazy = CsvStream(tmp_path / "lazy.csv", flush_s=3600.0)
    lazy.write(row)
    assert lines("lazy.csv") == 1  # buffered: only the header so far
    lazy.close()
    eager.close()
    assert lines("lazy.csv") == 2


@pytest.mark.parametrize("name", ["gpt2_dynamo.onnx", "gpt2_legacy.onnx"])
def test_fast_path_equals_the_analysis_with_a_tied_embedding_at_p_over_1(name):
    """GPT-2's word embedding is read on the first stage (Gather) and the last (LM head: a
    Transpose of it in the dynamo export, a stored copy with --tie-embeddings in the legacy
    one): both stages hold it and all-reduce its gradient before the optimizer step.  The fast
    path reads the same held copies and simulates the same all-reduce."""
    from dml2comm.model import FastEvaluator

    path = Path(__file__).parent / "fixtures" / name
    imported = load_model(path, ImportOptions(batch_size=1, seq_len=64, tie_embeddings=True))
    cluster = _builder(16)
    configs = [ParallelConfig(dp_size=16 // (t * p), tp_size=t, pp_size=p, micro_batch_size=1, global_batch_size=32,
                              seq_len=None, zero_stage=z, schedule=sch, virtual_stages=v)
               for t, p in ((1, 2), (2, 4), (1, 8), (2, 8)) for z in (0, 1)
               for sch, v in (("1f1b", 1), ("interleaved", 2))]
    fast = FastEvaluator(imported, cluster).evaluate(configs)
    for config, row in zip(configs, fast):
        a = analyze_graph(imported, config, cluster, advise=False, timeline=False)
        assert any(c.dim.value == "pp" and c.kind.value == "ALL_REDUCE" for c in a.comms)
        assert row["error"] is None, row
        assert row["iteration_time_s"] == pytest.approx(a.summary["iteration_time_s"], rel=1e-9), config
        assert row["exposed_comm_time_s"] == pytest.approx(a.summary["exposed_comm_time_s"], rel=1e-9, abs=1e-15), config
        assert row["peak_memory_bytes"] == a.summary["peak_memory_bytes"]


def test_fast_path_equals_the_full_analysis_on_send_bound_pipelines(tmp_path, monkeypatch):
    """Issue 17: one GPU per node, so every pipeline send crosses the network, and a GPT so small
    (hidden 32, 128 tokens) that a send (its latency and per-collective overhead) outlasts the
    steps after it: a device's sends queue on its pp stream.  The fast path's batched recurrence
    queues them as the engine does: every configuration (1F1B and interleaved, p up to 8, TP
    across nodes, ZeRO 0-3, recomputation none/full) equal to 1e-9."""
    from dml2comm.hardware.cluster import make_cluster

    # kernel time only (host_model "none"): with the eager host floor (dml2comm.cost.host) this
    # tiny model's steps outlast its sends and the regime under test is gone
    path = tmp_path / "tiny.onnx"
    zoo.save(zoo.build_gpt(layers=8, hidden=32, heads=4, vocab=256, seq_len=128), path)

    def one_gpu_per_node(num_gpus):
        return dataclasses.replace(make_cluster("a100", num_gpus, 1), host_model="none")

    # the regime is send-bound: in the analysis's own timeline some send waits for the one before it
    config = ParallelConfig(pp_size=8, micro_batch_size=1, global_batch_size=16, seq_len=128)
    timeline = analyze_graph(load_model(path, ImportOptions(batch_size=1)), config, one_gpu_per_node(8), advise=False).timeline
    steps = {(ev.device, ev.name): ev.start_s + ev.dur_s for ev in timeline.events if ev.stream == "compute"}
    sends = [ev for ev in timeline.events if ev.stream == "pp" and ev.name.startswith("send ")]
    assert sends and any(ev.start_s > steps[(ev.device, ev.name[len("send "):])] + 1e-12 for ev in sends)

    constraints = Constraints(micro_batch_sizes=(1, 4), zero_stages=(0, 1, 2, 3), recompute=("none", "full"), virtual_stages=(1, 2),
                              allow_cross_node_tp=True, gpus_per_node=1)
    space = SweepSpace(global_batch_size=16, constraints=constraints)
    full = run_sweep(str(path), 8, one_gpu_per_node, space, fast=False)
    quick = run_sweep(str(path), 8, one_gpu_per_node, space, fast=True)
    assert len(full.rows) == len(quick.rows) > 100
    seen = set()
    for a, b in zip(full.rows, quick.rows):
        assert a["config"] == b["config"] and a["error"] == b["error"]
        if a["error"]:
            continue
        seen.add((a["config"]["schedule"], a["config"]["p"]))
        assert b["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9), a["config"]
        assert b["peak_memory_bytes"] == a["peak_memory_bytes"]
        for key in ("compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction", "mfu"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (key, a["config"])
    assert {("1f1b", 8), ("interleaved", 4)} <= seen


def test_evaluators_of_one_cluster_share_its_prices(gpt):
    """The fast evaluators of a sweep's micro-batch sizes share the cluster's prices
    (cost.stages.Pricing: placements, collective seconds, a stage's ZeRO part): a second
    evaluator finds the data-parallel parts the first priced, and its numbers are those of an
    evaluator with prices of its own; a pricing of another cluster is refused."""
    from dml2comm.cost.stages import Pricing
    from dml2comm.model import FastEvaluator
    from dml2comm.search.sweep import Evaluator

    configs = {b: [ParallelConfig(dp_size=d, tp_size=2, pp_size=4 // d, micro_batch_size=b, global_batch_size=16, seq_len=None,
                                  zero_stage=z) for d in (1, 2, 4) for z in (0, 1, 2)] for b in (1, 2)}
    evaluator = Evaluator(gpt, _builder)
    fe1, fe2 = evaluator.fast_evaluator(1, 8), evaluator.fast_evaluator(2, 8)
    assert fe1.pricing is fe2.pricing is evaluator.pricing(8)
    shared = [fe1.evaluate(configs[1])]
    states = dict(fe1.pricing.stage_states)
    assert states  # the ZeRO parts priced for micro-batch 1 are the ones micro-batch 2's evaluator reads
    shared.append(fe2.evaluate(configs[2]))
    assert fe2.pricing.stage_states == states
    own = [FastEvaluator(load_model(gpt, ImportOptions(batch_size=b)), evaluator.cluster(8)).evaluate(configs[b]) for b in (1, 2)]
    assert shared == own
    with pytest.raises(ValueError, match="another cluster"):
        FastEvaluator(load_model(gpt, ImportOptions(batch_size=1)), _builder(8), pricing=Pricing(evaluator.cluster(8)))


def test_a_summary_row_reads_its_fields_in_the_metrics_order():
    """Evaluator._row of a Summary (the fast path's) is the row the mapping reading gives: the
    same keys in the same order (data.json's rows), ``fits`` a bool from ``fits_in_memory``."""
    import dataclasses as dc

    from dml2comm.cost.summary import Summary
    from dml2comm.search.sweep import METRICS, Evaluator

    names = [f.name for f in dc.fields(Summary)]
    summary = Summary(**{name: float(i) + 0.5 for i, name in enumerate(names)})
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16)
    row = Evaluator._row(config, summary)
    want = {"config": config.to_dict(), "error": None, **{k: None for k in METRICS}}
    want.update({k: summary[k] for k in METRICS if k != "fits"})
    want["fits"] = bool(summary["fits_in_memory"])
    assert list(row.items()) == list(want.items())
    assert type(row["fits"]) is bool
    failed = Evaluator._row(config, {"error": "no"})
    assert failed["error"] == "no" and failed["fits"] is False and failed["iteration_time_s"] is None
