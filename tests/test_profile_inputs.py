"""Profiled traces and flags that cannot be what they claim: one ``error:`` line naming the real
problem, exit code 2, nothing written; and the damaged-but-readable cases that used to give a
number (a 1e300 s step, half a step, a step on no GPU's kernels)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dml2comm.cli import main
from tests.h100_steps import GPT2

DATA = "benchmarks/data/gpu_steps"
RESNET = ("dml2comm/validate/data/models/resnet18_dynamo.onnx", f"{DATA}/h100_trace_resnet18_bf16_b128_s224.json.gz")
BERT_AMP = f"{DATA}/h100_trace_bert-6l-512_amp_b64_s128.json.gz"
BERT_BF16 = f"{DATA}/h100_trace_bert-6l-512_bf16_b64_s128.json.gz"
BERT = "dml2comm/validate/data/models/step_bert_6l_512_dynamo.onnx"
MODEL, TRACE, B, S, STEP_S = GPT2


def _doc(path: str = TRACE) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _write(tmp_path: Path, name: str, doc: dict, zipped: bool = False) -> str:
    out = tmp_path / name
    text = json.dumps(doc)
    if zipped:
        out.write_bytes(gzip.compress(text.encode()))
    else:
        out.write_text(text)
    return str(out)


def _analysis(*extra: str, model: str = MODEL, b: int = B, s: int | None = S) -> list[str]:
    shape = ["--micro-batch-size", str(b)] + (["--seq-len", str(s)] if s else [])
    return [model, "--stack", "pytorch", "--cluster", "dgx-h100", "--gpus", "1", "--global-batch-size", str(b), *shape,
            "--no-site", "--no-advice", *extra]


def _refused(tmp_path: Path, capsys, argv: list[str]) -> str:
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()
    return err[0]


def _kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


@pytest.mark.parametrize("dur", [1e300, -5000.0, 1e12], ids=["1e300", "negative", "twelve-days"])
def test_a_kernel_whose_time_cannot_be_is_a_damaged_trace(tmp_path, capsys, dur):
    # one kernel of 1e300 us had printed a 126-digit step time; a negative one a shorter step
    doc = _doc()
    _kernels(doc)[10]["dur"] = dur
    path = _write(tmp_path, "damaged.json", doc)
    err = _refused(tmp_path, capsys, _analysis("--profile", path))
    assert "1 of its events have times that cannot be" in err and "export the step again" in err


def test_kernels_not_linked_to_their_launches_are_refused(tmp_path, capsys):
    # without correlation ids no kernel can be placed: the step had come out at a third of its
    # time with "99% of the compute scaled" beside "unattributed 99%"
    doc = _doc()
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("correlation", None)
    err = _refused(tmp_path, capsys, _analysis("--profile", _write(tmp_path, "unlinked.json", doc)))
    assert "has its launch call linked" in err and "CPU and CUDA activities" in err


@pytest.mark.parametrize("seconds,why", [(0.001, "shorter than the profiled step's GPU work"),
                                         (51.6, "times the profiled step")], ids=["below-gpu-work", "milliseconds"])
def test_a_step_time_the_trace_rules_out_is_refused(tmp_path, capsys, seconds, why):
    err = _refused(tmp_path, capsys, _analysis("--profile", TRACE, "--step-time", str(seconds)))
    assert why in err and "in seconds" in err


@pytest.mark.parametrize("flags,why", [(("--precision", "mixed"), "--precision mixed holds them in fp32 master copies"),
                                       (("--optimizer", "sgd"), "--optimizer sgd plans another optimizer step")],
                         ids=["mixed", "sgd"])
def test_a_plan_the_traced_step_contradicts_is_refused(tmp_path, capsys, flags, why):
    # the step ran AdamW on bf16 parameters: mixed precision or SGD had been accepted and scaled
    # back to the traced step's optimizer time
    err = _refused(tmp_path, capsys, _analysis("--profile", TRACE, *flags))
    assert why in err


def test_a_trace_is_read_by_its_content_not_its_suffix(tmp_path):
    # plain JSON named .json.gz: the precision scan had opened it as gzip, read nothing, and the
    # plan's default amp was then refused against the bf16 step with no --precision given
    path = _write(tmp_path, "plain.json.gz", _doc())
    out = tmp_path / "out"
    assert main([*_analysis("--profile", path), "--out", str(out)]) == 0
    assert json.loads((out / "data.json").read_text())["config"]["precision"] == "bf16"


def test_traces_of_two_precisions_are_refused_together(tmp_path, capsys):
    err = _refused(tmp_path, capsys, _analysis("--profile", BERT_BF16, "--profile", BERT_AMP, model=BERT, b=64, s=128))
    assert "the traces ran different precisions" in err and "bf16" in err and "amp" in err


def test_an_image_models_trace_on_a_language_model_is_not_its_step(tmp_path, capsys):
    # had said "input dims not bound ... bind them with --seq-len N" though --seq-len was given
    err = _refused(tmp_path, capsys, _analysis("--profile", RESNET[1]))
    assert "not a step of this model" in err and "no token ids" in err


def test_a_trace_that_names_no_device_is_modelled_on_the_plans_gpu(tmp_path):
    doc = _doc()
    doc.pop("deviceProperties")
    out = tmp_path / "out"
    assert main([*_analysis("--profile", _write(tmp_path, "nodevice.json", doc)), "--out", str(out)]) == 0
    with_device = tmp_path / "with"
    assert main([*_analysis("--profile", TRACE), "--out", str(with_device)]) == 0
    times = [json.loads((o / "data.json").read_text())["summary"]["iteration_time_s"] for o in (out, with_device)]
    assert times[0] == pytest.approx(times[1], rel=1e-9)


def test_a_folder_is_named_a_folder(tmp_path, capsys):
    assert "a folder" in _refused(tmp_path, capsys, _analysis("--profile", str(tmp_path)))


def test_a_profiler_step_that_ran_nothing_is_no_step(tmp_path):
    # an empty ProfilerStep beside the real one had been averaged in: half the step's time
    doc = _doc()
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    start, end = min(e["ts"] for e in timed), max(e["ts"] + e["dur"] for e in timed)
    cpu = next(e for e in timed if e.get("cat") == "cpu_op")
    step = {"ph": "X", "cat": "user_annotation", "pid": cpu["pid"], "tid": cpu["tid"], "args": {}}
    doc["traceEvents"] += [{**step, "name": "ProfilerStep#2", "ts": start - 1.0, "dur": end - start + 2.0},
                           {**step, "name": "ProfilerStep#3", "ts": end + 100.0, "dur": 50.0}]
    times = []
    for name, d in (("empty.json", doc), ("one.json", _doc())):
        out = tmp_path / f"out-{name}"
        assert main([*_analysis("--profile", _write(tmp_path, name, d)), "--out", str(out)]) == 0
        times.append(json.loads((out / "data.json").read_text())["summary"]["iteration_time_s"])
    assert times[0] == pytest.approx(times[1], rel=1e-9)


def test_the_trace_command_refuses_a_gpu_its_cluster_does_not_have(tmp_path, capsys):
    err = _refused(tmp_path, capsys, ["trace", TRACE, "--model", MODEL, "--cluster", "dgx-h100", "--gpu", "a100", "--no-site"])
    assert "--gpu a100 conflicts with --cluster dgx-h100" in err


def test_build_top_without_a_site_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, ["sweep", "examples/gpt2-small.onnx", "--gpus", "8", "--global-batch-size", "64",
                                      "--no-site", "--build-top", "1"])
    assert "--build-top 1" in err and "--no-site" in err


def test_calibrate_counts_a_copied_trace_once(tmp_path):
    from dml2comm.calibrate.calibration import calibrate

    copy = tmp_path / "copy.json.gz"
    copy.write_bytes(Path(TRACE).read_bytes())
    once, twice = calibrate([TRACE]), calibrate([TRACE, str(copy)])
    assert twice.document["calibration"]["traces"] == once.document["calibration"]["traces"]
    assert any("copy.json.gz is a copy of" in w for w in twice.warnings)


def test_kernels_before_their_launch_are_a_damaged_trace(tmp_path, capsys):
    # negated kernel timestamps had given a 9,977,704 s step under trace and 251 us of idle per
    # kernel under --profile
    doc = _doc()
    for e in _kernels(doc):
        e["ts"] = -e["ts"]
    err = _refused(tmp_path, capsys, _analysis("--profile", _write(tmp_path, "negated.json", doc)))
    assert "before the call that launched it" in err


def test_the_trace_command_refuses_sequence_parallel_without_tensor_parallelism(tmp_path, capsys):
    err = _refused(tmp_path, capsys, ["trace", TRACE, "--model", MODEL, "--sequence-parallel", "--no-site"])
    assert "--sequence-parallel needs tensor parallelism" in err
