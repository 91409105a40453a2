"""Bad input to the analysis's less common flags, --config, zoo, collective and validate: one
``error:`` line, exit code 2, no traceback, nothing written; and --dim binding the batch reported
as the micro-batch it sets."""

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
