"""The H200's kernel bandwidth share, recomputed from the bundled H100 / H200 measurements
(``benchmarks/data/gpu_steps/``, PROVENANCE.md there), and what it predicts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from dml2comm.cost.compute import optimizer_step_s
from dml2comm.errors import ConfigError
from dml2comm.hardware.gpus import get_gpu

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "gpu_steps"


def _misc(name: str) -> list[dict]:
    return json.loads((DATA / f"{name}.json").read_text())["misc"]


def _kernel_ratios() -> list[float]:
    """Per memory-bound kernel row: H100 time / H200 time over the datasheet bandwidth ratio."""
    h100, h200 = get_gpu("h100"), get_gpu("h200")
    spec = h200.hbm_bytes_per_s / h100.hbm_bytes_per_s
    out = []
    for a, b in zip(_misc("h100_a"), _misc("h200_a"), strict=True):
        assert a["op"] == b["op"] and a.get("M") == b.get("M") and a.get("params") == b.get("params")
        keys = ("ln_fwd_s", "ln_fwd_bwd_s", "gelu_4h_s") if a["op"] == "layernorm_gelu_copy" else ("step_s",)
        out += [a[k] / b[k] / spec for k in keys]
    return out


def test_h200_kernel_bandwidth_share_is_the_measured_median():
    ratios = _kernel_ratios()
    assert len(ratios) == 19
    assert get_gpu("h200").kernel_bandwidth_share == pytest.approx(statistics.median(ratios), abs=5e-4)
    assert get_gpu("h100").kernel_bandwidth_share == 1.0


def test_h200_plain_copy_reaches_the_datasheet_rate_but_kernels_do_not():
    """Why a share and not a lower datasheet bandwidth: the copy scales with 4.8 / 3.35."""
    spec = get_gpu("h200").hbm_bytes_per_s / get_gpu("h100").hbm_bytes_per_s
    copies = [a["copy_4h_s"] / b["copy_4h_s"] / spec for a, b in zip(_misc("h100_a"), _misc("h200_a"))
              if a["op"] == "layernorm_gelu_copy" and a["M"] * a["h"] >= 16384 * 1024]
    assert min(copies) > 0.97
    assert max(_kernel_ratios()) < 0.95


def test_h200_gemms_run_at_the_h100_rate():
    """The H200 shares the H100's GEMM law: same silicon, same measured times."""
    h100 = {(r["M"], r["N"], r["K"]): r for r in json.loads(
        (Path(__file__).resolve().parent.parent / "dml2comm" / "validate" / "data" / "h100_kernels_measured.json").read_text())["gemm"]}
    ratios = [r[f"{k}_s"] / h100[(r["M"], r["N"], r["K"])][f"{k}_s"]
              for r in json.loads((DATA / "h200_b.json").read_text())["gemm"] for k in ("fwd", "dgrad", "wgrad")]
    assert len(ratios) == 420
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("gpu, file", [("h100", "h100_a"), ("h200", "h200_a")])
def test_fused_adamw_on_both_gpus_within_8_percent(gpu, file):
    """The fused AdamW law (measured on the first H100) at the kernel bandwidth of each GPU."""
    g = get_gpu(gpu)
    rows = [r for r in _misc(file) if r["op"] == "adamw_fused"]
    assert len(rows) == 4
    for r in rows:
        element = 2 if "bfloat16" in r["dtype"] else 4
        t = optimizer_step_s(r["params"], "adamw", element, g.kernel_hbm_bytes_per_s, precision="bf16" if element == 2 else "amp")
        assert abs(t / r["step_s"] - 1) < 0.08, (gpu, r)


def test_kernel_bandwidth_share_is_validated_and_serialised_only_when_set():
    h200 = get_gpu("h200")
    assert h200.to_dict()["kernel_bandwidth_share"] == h200.kernel_bandwidth_share
    assert "kernel_bandwidth_share" not in get_gpu("h100").to_dict()
    assert h200.kernel_hbm_bytes_per_s == pytest.approx(4.8e12 * 0.853)
    assert not h200.unsourced_fields()
    import dataclasses
    for bad in (0.0, -1.0, 2.0, float("nan"), True):
        with pytest.raises(ConfigError, match="kernel_bandwidth_share"):
            dataclasses.replace(h200, kernel_bandwidth_share=bad)
