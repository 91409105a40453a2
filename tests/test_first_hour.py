"""What a newcomer runs in the first hour and was misled by: help examples that wrote into the
repository root, a calibrated cluster whose stated band lost its GPU's validated runs, a stopped
server that claimed nothing was written, and an attention kernel named for a model with none."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.cli.analyse import EXAMPLES

ROOT = Path(__file__).resolve().parent.parent


def test_help_examples_write_under_out(capsys):
    # "each runs as written from the repository root; outputs go to out/": the zoo examples wrote
    # gpt3.onnx, llama70b.onnx and gpt2.onnx into the root
    with pytest.raises(SystemExit):
        main(["zoo", "--help"])
    zoo_help = capsys.readouterr().out
    examples = [line for line in EXAMPLES.splitlines() if "python main.py zoo" in line]
    outputs = re.findall(r" -o (\S+)", zoo_help + "\n".join(examples))
    assert len(outputs) == 4 and all(o.startswith("out/") for o in outputs), outputs


def test_zoo_makes_the_output_folder_and_refuses_a_folder(tmp_path, capsys):
    out = tmp_path / "new" / "sub" / "gpt2.onnx"
    assert main(["zoo", "preset", "gpt2-small", "-o", str(out)]) == 0 and out.is_file()
    capsys.readouterr()
    assert main(["zoo", "preset", "gpt2-small", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a folder; give a file name" in err[0]


def test_a_calibrated_gpu_keeps_its_base_gpus_band(tmp_path):
    # the calibrated GPU is named "A100-SXM4-80GB cal-<hash>"; the band had found no validated run
    # of that name and fallen back to every source's (±11.0% against the A100's ±8.3%)
    cluster = tmp_path / "cluster.yaml"
    assert main(["calibrate", "tests/fixtures/traces/hta/trace_filter__sampled_rank-0.json.gz", "--cluster", "dgx-a100",
                 "-o", str(cluster)]) == 0
    bands = {}
    for name, spec in (("preset", "dgx-a100"), ("calibrated", str(cluster))):
        out = tmp_path / name
        assert main(["examples/gpt2-small.onnx", "--d", "2", "--t", "4", "--cluster", spec, "--no-site", "--no-advice",
                     "--out", str(out)]) == 0
        summary = json.loads((out / "data.json").read_text())["summary"]
        bands[name] = (summary["expected_error"], summary["expected_error_source"])
    assert " cal-" in json.loads((tmp_path / "calibrated" / "data.json").read_text())["cluster"]["gpu"]
    assert bands["calibrated"] == bands["preset"] and "A100-SXM4-80GB" in bands["calibrated"][1]


def test_a_model_without_attention_is_not_said_to_run_flash_attention(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["dml2comm/validate/data/models/resnet18_dynamo.onnx", "--cluster", "dgx-h100", "--gpus", "1", "--stack", "pytorch",
                 "--precision", "bf16", "--micro-batch-size", "16", "--no-site", "--no-advice", "--out", str(out)]) == 0
    head = " ".join(capsys.readouterr().out.split()[:40])
    assert "no attention" in head and "flash attention" not in head
    assert json.loads((out / "data.json").read_text())["model"]["attention_cores"] == 0


def test_stopping_the_server_says_the_outputs_stay(tmp_path):
    # SIGTERM while serving had printed "nothing was written", with the site already in place
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "main.py", "examples/gpt2-small.onnx", "--no-advice", "--out", str(out), "--serve"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("serving") or not line:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, lines + [rest]
    assert "stopped (SIGTERM); the outputs in" in rest and "nothing was written" not in rest
    assert (out / "data.json").is_file() and (out / "site" / "index.html").is_file()
