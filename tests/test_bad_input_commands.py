"""Bad input to the analysis's less common flags, --config, zoo, collective and validate: one
``error:`` line, exit code 2, no traceback, nothing written; and --dim binding the batch reported
as the micro-batch it sets.  Flags given where they would change nothing (--cp-scheme without
context parallelism, --capacity-factor without experts, ...), numbers other than plain digits and
sizes no real run has are refused the same way, while the same flags still run where they act."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dml2comm.cli import main

MODEL = "examples/gpt2-small.onnx"


def _refused(capsys, argv: list[str], out: Path | None = None) -> str:
    rc = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err)
    assert "Traceback" not in captured.out + captured.err
    if out is not None:
        assert not out.exists()
    return err[0]


@pytest.mark.parametrize("text,why", [("d: null\n", None), (b"\xff\xfe\x00d", "is not a text file")], ids=["null", "binary"])
def test_config_files_that_crashed(tmp_path, capsys, text, why):
    # 'd: null' had raised a TypeError traceback, a binary file a UnicodeDecodeError
    cfg = tmp_path / "cfg.yaml"
    if isinstance(text, bytes):
        cfg.write_bytes(text)
    else:
        cfg.write_text(text)
    out = tmp_path / "out"
    if why is None:  # a key with no value is its default, as if left out
        assert main([MODEL, "--config", str(cfg), "--no-site", "--no-advice", "--out", str(out)]) == 0
        assert json.loads((out / "data.json").read_text())["config"]["d"] == 1
    else:
        assert why in _refused(capsys, [MODEL, "--config", str(cfg), "--no-site", "--out", str(out)], out)


@pytest.mark.parametrize("argv,why", [
    (["zoo", "gpt", "--layers", "1000000000000", "--hidden", "64", "--heads", "4", "--vocab", "100", "--seq-len", "32"],
     "--layers 1,000,000,000,000 is beyond the 10,000"),
    (["zoo", "gpt", "--layers", "2", "--hidden", "1000000000000", "--heads", "4", "--vocab", "100", "--seq-len", "32"],
     "--hidden 1,000,000,000,000 is beyond"),
    (["zoo", "moe", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "128", "--vocab", "100",
      "--seq-len", "32", "--experts", "1000000000", "--top-k", "2"], "--experts 1,000,000,000 is beyond the 4,096"),
    (["zoo", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "128", "--vocab", "100",
      "--seq-len", "32", "--rope-theta", "nan"], "--rope-theta must be a finite number"),
], ids=["layers", "hidden", "experts", "rope-nan"])
def test_zoo_sizes_beyond_any_model_are_refused(tmp_path, capsys, argv, why):
    # a 10**12-layer GPT ran for hours, 10**9 experts filled memory, a NaN rope theta was written
    out = tmp_path / "m.onnx"
    assert why in _refused(capsys, [*argv, "-o", str(out)], out)


def test_a_collective_over_more_gpus_than_any_plan_is_refused(capsys):
    # --n 10**12 printed its result, then a MemoryError traceback listing the ranks
    err = _refused(capsys, ["collective", "--op", "all_reduce", "--n", "1000000000000", "--size", "1GiB"])
    assert "--n 1,000,000,000,000 is beyond" in err


@pytest.mark.parametrize("argv,why", [
    (["--out", ""], "--out is empty"),
    (["--gpu", ""], "--gpu is empty"),
    (["--virtual-stages", "2", "--p", "2"], "--virtual-stages 2 splits each pipeline stage"),
    (["--virtual-stages", "2", "--schedule", "interleaved"], "--virtual-stages 2 splits each pipeline stage"),
    (["--dim", "batch=4", "--micro-batch-size", "2"], "--dim binds the batch axis to 4, --micro-batch-size to 2"),
    (["--no-async-tp-allreduce"], "which t = 1 has none of"),
], ids=["empty-out", "empty-gpu", "virtual-1f1b", "virtual-p1", "dim-and-micro", "async-tp-t1"])
def test_flags_that_were_ignored_or_wrote_into_the_current_folder(tmp_path, capsys, argv, why):
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    assert why in _refused(capsys, [MODEL, "--no-site", *argv, *out], tmp_path / "out")


def test_validate_with_an_empty_source_is_refused(capsys):
    # it had run every source in full
    assert "--source is empty" in _refused(capsys, ["validate", "--source", ""])


def test_dim_binding_the_batch_is_the_micro_batch(tmp_path):
    # --dim batch=4 (an example of --help) costed batch 4 but reported b=1 and a quarter of the
    # tokens per second
    runs = {}
    for name, flags in (("dim", ["--dim", "batch=4"]), ("micro", ["--micro-batch-size", "4"])):
        out = tmp_path / name
        assert main([MODEL, "--cluster", "dgx-h100", *flags, "--no-site", "--no-advice", "--out", str(out)]) == 0
        data = json.loads((out / "data.json").read_text())
        runs[name] = (data["config"]["micro_batch_size"], data["summary"]["iteration_time_s"], data["summary"]["tokens_per_s"])
    assert runs["dim"] == runs["micro"] and runs["dim"][0] == 4


# ------------------------------------------------- flags that were accepted and changed nothing

GLOO = "tests/fixtures/traces/gloo_pp2_dp2"


@pytest.mark.parametrize("argv,why", [
    (["--cp-scheme", "ring"], "--cp-scheme ring chooses how context parallelism splits attention, which --cp 1 does not run"),
    (["--capacity-factor", "2"], "this model has no experts"),
    (["--cluster", "dgx-h100", "--gpus-per-node", "4"], "--gpus-per-node 4 contradicts --cluster dgx-h100, whose nodes hold 8 GPUs"),
    (["--dropout", "0.1"], "Dropout node(s) of its own, whose masks are counted"),
    (["--tie-embeddings"], "this export stores no such copy"),
    (["--d", "\uff12"], "argument --d: expected a positive integer, got '\uff12'"),
    (["--d", "1_6"], "argument --d: expected a positive integer, got '1_6'"),
    (["--zero", "\uff11"], "argument --zero: expected a whole number >= 0"),
    (["--collective-overhead-us", "1_0"], "argument --collective-overhead-us: expected a number, got '1_0'"),
    (["--micro-batch-size", "1000000000000"], "expected a positive integer up to 1,048,576"),
    (["--dim", "batch=1000000000000"], "argument --dim: expected a positive integer up to 4,194,304"),
    (["--d", "2", "--collective-overhead-us", "1e15"], "expected a number up to 1e+06 (1 s per call)"),
], ids=["cp-scheme-c1", "capacity-dense", "gpus-per-node-cluster", "dropout-own-nodes", "tie-nothing", "full-width", "underscore",
        "zero-full-width", "float-underscore", "micro-batch-huge", "dim-huge", "overhead-huge"])
def test_analysis_flags_that_changed_nothing_or_planned_nonsense(tmp_path, capsys, argv, why):
    # each was accepted: the flag ignored (or read as another number), or a plan of 10**9 s
    out = tmp_path / "out"
    assert why in _refused(capsys, [MODEL, "--no-site", *argv, "--out", str(out)], out)


@pytest.mark.parametrize("text,shown", [("d: 0x2\n", "0x2"), ("d: 1_1\n", "1_1"), ("d: 010\n", "010"), ("d: 0b10\n", "0b10"),
                                        ("micro_batch_size: 1:30\n", "1:30")], ids=["hex", "underscore", "octal", "binary", "sexagesimal"])
def test_config_numbers_other_than_decimal_are_refused(tmp_path, capsys, text, shown):
    # YAML 1.1 read 0x2 as 2, 010 as 8 and 1:30 as 90, which the same value as a flag refuses
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    out = tmp_path / "out"
    err = _refused(capsys, [MODEL, "--config", str(cfg), "--no-site", "--out", str(out)], out)
    assert f"line 1: {shown} is a YAML 1.1 number in another base or with separators" in err


@pytest.mark.parametrize("argv,why", [
    (["--virtual-stages", "2"], "--virtual-stages 2 splits each pipeline stage into chunks"),
    (["--cp-scheme", "ring"], "which this run (cp 1) does not use"),
    (["--cluster", "dgx-h100", "--gpus-per-node", "4"], "--gpus-per-node 4 contradicts --cluster dgx-h100"),
], ids=["virtual-1f1b", "cp-scheme-c1", "gpus-per-node-cluster"])
def test_trace_prediction_flags_that_changed_nothing(tmp_path, capsys, argv, why):
    out = tmp_path / "out"
    argv = ["trace", GLOO, "--model", MODEL, "--global-batch-size", "8", *argv, "--no-site", "--json", "--out", str(out)]
    assert why in _refused(capsys, argv, out)


@pytest.mark.parametrize("argv,why", [
    (["--topology", "ring", "--radix", "4"], "--radix shapes --topology tree or fat-tree, not ring"),
    (["--topology", "switch", "--oversubscription", "2"], "--oversubscription shapes --topology fat-tree, not switch"),
    (["--topology", "tree", "--levels", "2"], "--levels shapes --topology fat-tree, not tree"),
    (["--cluster", "dgx-a100", "--oversubscription", "2"], "--oversubscription does not apply to --cluster"),
    (["--topology", "ring", "--min-bytes", "1MiB"], "--min-bytes sets the range of --table"),
    (["--topology", "torus2d", "--dims", "2x\uff14"], "argument --dims: invalid"),
], ids=["radix-ring", "oversubscription-switch", "levels-tree", "oversubscription-cluster", "min-bytes-no-table", "dims-full-width"])
def test_collective_flags_that_changed_nothing(capsys, argv, why):
    assert why in _refused(capsys, ["collective", "--op", "all_reduce", "--n", "8", "--size", "1GiB", *argv])


@pytest.mark.parametrize("argv,why", [
    (["sweep", MODEL, "--gpus", "4", "--cp-scheme", "ring"], "which --cp 1 does not try"),
    (["sweep", MODEL, "--gpus", "4", "--cluster", "dgx-h100", "--gpus-per-node", "4"], "--gpus-per-node 4 contradicts --cluster"),
    (["sweep", MODEL, "--gpus", "4", "--d", "1,\uff12"], "--d expects comma-separated positive integers"),
    (["sweep", MODEL, "--gpus", "4", "--micro-batch-sizes", "1,2000000"], "--micro-batch-sizes 2,000,000 is beyond the 1,048,576"),
    (["sweep", MODEL, "--scaling", "4,8_0"], "--scaling expects comma-separated positive GPU counts"),
    (["compare", MODEL, "--global-batch-size", "8", "--configs", "d=\uff12"], "is not an integer"),
    (["compare", MODEL, "--global-batch-size", "8", "--configs", "d=2", "--cluster", "dgx-h100", "--gpus-per-node", "2"],
     "--gpus-per-node 2 contradicts --cluster dgx-h100"),
], ids=["sweep-cp-scheme-c1", "sweep-gpus-per-node", "sweep-full-width", "sweep-micro-huge", "scaling-underscore", "compare-full-width",
        "compare-gpus-per-node"])
def test_sweep_and_compare_flags_that_changed_nothing(tmp_path, capsys, argv, why):
    out = tmp_path / "out"
    assert why in _refused(capsys, [*argv, "--no-site", "--out", str(out)], out)


def test_zoo_sizes_are_plain_digits(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    argv = ["zoo", "gpt", "--layers", "\uff12", "--hidden", "64", "--heads", "4", "--vocab", "100", "--seq-len", "32", "-o", str(out)]
    assert "argument --layers: expected an integer" in _refused(capsys, argv, out)


@pytest.mark.parametrize("argv", [
    ["--cp", "2", "--cp-scheme", "ring"],
    ["--cluster", "dgx-h100", "--gpus-per-node", "8"],  # the preset's own node size
    ["--gpu", "h100", "--d", "8", "--gpus-per-node", "4"],
    ["--micro-batch-size", "4", "--collective-overhead-us", "51.5", "--d", "2"],
], ids=["cp-scheme-c2", "gpus-per-node-equal", "gpus-per-node-gpu", "bounded-values"])
def test_the_flags_still_work_where_they_act(tmp_path, argv):
    assert main([MODEL, *argv, "--no-site", "--no-advice", "--out", str(tmp_path / "out")]) == 0


def test_model_flags_still_work_on_models_that_take_them(tmp_path):
    # --capacity-factor on a MoE model, --dropout on an export without Dropout nodes, --tie-embeddings
    # on a legacy export that stores the tied head's copy
    moe, dense = tmp_path / "moe.onnx", tmp_path / "gpt.onnx"
    assert main(["zoo", "moe", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "128",
                 "--vocab", "100", "--seq-len", "32", "--experts", "4", "--top-k", "2", "-o", str(moe)]) == 0
    assert main(["zoo", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "100", "--seq-len", "32",
                 "--dropout", "0", "-o", str(dense)]) == 0
    runs = {"moe": [str(moe), "--d", "2", "--ep", "2", "--capacity-factor", "1.25"], "dropout": [str(dense), "--dropout", "0.1"],
            "tie": ["tests/fixtures/gpt2_legacy.onnx", "--seq-len", "16", "--tie-embeddings"]}
    for name, argv in runs.items():
        out = tmp_path / name
        assert main([*argv, "--no-site", "--no-advice", "--out", str(out)]) == 0, name
        config = json.loads((out / "data.json").read_text())["config"]
        if name == "moe":
            assert config["capacity_factor"] == 1.25
        if name == "dropout":
            assert config["dropout"] == 0.1


@pytest.mark.parametrize("argv", [
    ["--topology", "fat-tree", "--radix", "4", "--oversubscription", "2", "--size", "1GiB"],
    ["--topology", "tree", "--radix", "4", "--size", "1GiB"],
    ["--topology", "ring", "--table", "--min-bytes", "1MiB", "--max-bytes", "4MiB", "--step-factor", "2"],
], ids=["fat-tree", "tree", "table"])
def test_collective_flags_still_work_where_they_act(capsys, argv):
    assert main(["collective", "--op", "all_reduce", "--n", "16", *argv]) == 0
    assert "error" not in capsys.readouterr().err
