"""The command line: bad input gives one line on stderr, exit code 2, and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.helpers import mlp

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_bad(result: subprocess.CompletedProcess[str], out: Path, pattern: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert not list(out.iterdir()) if out.exists() else True


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    onnx.save(mlp(), tmp_path / "mlp.onnx")
    return tmp_path


def test_missing_file(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "none.onnx"), "--out", str(out), cwd=workdir), out, "not found")


def test_not_onnx(workdir):
    (workdir / "x.onnx").write_text("hello")
    out = workdir / "out"
    assert_bad(run(str(workdir / "x.onnx"), "--out", str(out), cwd=workdir), out, "not a readable ONNX model")


def test_truncated(workdir):
    data = (workdir / "mlp.onnx").read_bytes()
    (workdir / "cut.onnx").write_bytes(data[: len(data) // 3])
    out = workdir / "out"
    result = run(str(workdir / "cut.onnx"), "--out", str(out), cwd=workdir)
    assert_bad(result, out, "")


def test_gpus_mismatch(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "mlp.onnx"), "--d", "2", "--t", "2", "--gpus", "8", "--out", str(out), cwd=workdir), out, "d*t*p")


def test_global_batch_not_divisible(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "mlp.onnx"), "--d", "2", "--micro-batch-size", "2", "--global-batch-size", "6", "--out", str(out), cwd=workdir),
               out, "not divisible")


def test_p_larger_than_layers(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "mlp.onnx"), "--p", "64", "--gpus", "64", "--out", str(out), cwd=workdir), out, "larger than the model")


def test_t_not_dividing(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "mlp.onnx"), "--t", "3", "--out", str(out), cwd=workdir), out, "does not divide")


def test_unknown_flag_is_one_line(workdir):
    out = workdir / "out"
    assert_bad(run(str(workdir / "mlp.onnx"), "--frobnicate", "--out", str(out), cwd=workdir), out, "unrecognized")


def test_unsupported_op_and_lenient(workdir):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node("Frob", ["x"], ["y"], domain="acme", name="<script>alert(1)</script>")
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)])
    onnx.save(m, workdir / "frob.onnx")
    out = workdir / "out"
    assert_bad(run(str(workdir / "frob.onnx"), "--out", str(out), cwd=workdir), out, "no cost rule for op type 'Frob'")
    ok = run(str(workdir / "frob.onnx"), "--out", str(out), "--lenient", "--no-site", cwd=workdir)
    assert ok.returncode == 0, ok.stderr
    data = json.loads((out / "data.json").read_text())
    assert any("Frob" in w for w in data["warnings"])


def test_runs_and_writes_data_json(workdir):
    out = workdir / "out"
    result = run(str(workdir / "mlp.onnx"), "--d", "2", "--t", "2", "--out", str(out), "--no-site", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["iteration_time_s"] > 0
    data = json.loads((out / "data.json").read_text())
    assert data["schema_version"] == 1
    for key in ("model", "config", "cluster", "summary", "comm_by_dim", "collectives", "stages", "layers", "warnings"):
        assert key in data
    assert sorted(p.name for p in out.iterdir()) == ["data.json", "trace.json"]


def test_assumptions_are_said_once_apart_from_warnings(workdir):
    """The modelling choices (dropout, compute, host, the default stack) go to one ``assumptions``
    block in the terminal and an ``assumptions`` list in data.json; ``warning:`` lines and
    ``warnings`` keep what the user should act on (here: t=16 wider than a node of 8 GPUs)."""
    out = workdir / "out"
    result = run(str(workdir / "mlp.onnx"), "--t", "16", "--out", str(out), "--no-site", "--no-advice", cwd=workdir)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "data.json").read_text())
    kinds = [a.split(":")[0] for a in data["assumptions"]]
    assert kinds == ["dropout", "compute", "host", "stack"], data["assumptions"]
    assert len(data["warnings"]) == 1 and data["warnings"][0].startswith("tensor parallelism t=16 is wider than a node")
    lines = result.stdout.splitlines()
    block = lines.index("assumptions")
    said = [ln for ln in lines[block + 1:] if ln.startswith("  ") and not ln.startswith("   ")]  # continuation lines: 4 spaces
    assert [ln.split(":")[0].strip() for ln in said[:4]] == kinds
    warned = [ln for ln in lines if ln.startswith("warning:")]
    assert len(warned) == 1 and "tensor parallelism t=16" in warned[0]
    assert not any(ln.startswith(("warning: dropout", "warning: compute", "warning: host", "warning: stack")) for ln in lines)


@pytest.mark.dot
def test_relative_out_folder_builds_the_site(tmp_path):
    """The README's command uses --out out, relative to the working folder."""
    result = run(str(ROOT / "examples" / "gpt2-small.onnx"), "--d", "2", "--p", "2", "--out", "out", "--no-advice", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "site" / "index.html").is_file()
    assert (tmp_path / "out" / "svg_file" / "overview.svg").is_file()
