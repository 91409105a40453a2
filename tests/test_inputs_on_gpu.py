"""--inputs-on-gpu: a step whose batch is on the GPU before its forward makes no host-to-device
copy of it (the measuring script's steps, a loader that prefetches on another stream)."""

from __future__ import annotations

import json

import pytest

from dml2comm.cli import main
from dml2comm.cost.stages import PCIE4_X16_BYTES_PER_S
from dml2comm.hardware.gpus import get_gpu

RESNET = "dml2comm/validate/data/models/resnet18_dynamo.onnx"
BASE = [RESNET, "--cluster", "dgx-h100", "--stack", "pytorch", "--precision", "bf16", "--optimizer", "adamw", "--no-site"]


def _run(tmp_path, name, *extra):
    out = tmp_path / name
    assert main([*BASE, "--gpus", "1", "--micro-batch-size", "256", "--out", str(out), *extra]) == 0
    return json.loads((out / "data.json").read_text())


def test_the_batch_on_the_gpu_makes_no_pcie_read(tmp_path):
    copied, resident = _run(tmp_path, "copied"), _run(tmp_path, "resident", "--inputs-on-gpu")
    assert (copied["config"]["inputs_on_gpu"], resident["config"]["inputs_on_gpu"]) == (False, True)
    # 256 fp32 images of 3 x 224 x 224 (the export's one input) over the H100's PCIe
    pcie = get_gpu("h100").pcie_bytes_per_s or PCIE4_X16_BYTES_PER_S
    read = 256 * 3 * 224 * 224 * 4 / pcie
    assert copied["summary"]["iteration_time_s"] - resident["summary"]["iteration_time_s"] == pytest.approx(read, rel=1e-6)


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_sweep_and_compare_take_it(tmp_path, command):
    # the same flag and meaning in every command (cli.args.add_stack_arguments)
    times = []
    for extra in ((), ("--inputs-on-gpu",)):
        out = tmp_path / f"{command}{len(extra)}"
        argv = [command, *BASE, "--global-batch-size", "1024", "--out", str(out), *extra]
        argv += ["--gpus", "8", "--d", "8", "--micro-batch-sizes", "128"] if command == "sweep" else ["--configs", "d=8,t=1,p=1,b=128"]
        assert main(argv) == 0
        data = json.loads((out / "data.json").read_text())
        rows = data["sweep"]["top"] if command == "sweep" else data["compare"]
        assert all(r["config"]["inputs_on_gpu"] == bool(extra) for r in rows)
        times.append(min(r["iteration_time_s"] for r in rows))
    assert times[1] < times[0]
