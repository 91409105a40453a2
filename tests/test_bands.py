"""Expected-error bands (dml2comm.validate.bands)."""

from __future__ import annotations

import pytest

from dml2comm.hardware.cluster import get_cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.bands import BandRow, band_rows, expected_error_for, load_bands
from dml2comm.validate.cases import Case

A100 = get_cluster("dgx-a100", 8).gpu.name


def _rows():
    # two single-node runs (1e8 params: 10% and 30% off), one multi-node run (1e11: 2% off)
    return [BandRow("vtrain", "v0", A100, 1e8, 8, 8, 2, 1, 0.10), BandRow("vtrain", "v1", A100, 1e8, 4, 8, 1, 1, 0.30),
            BandRow("narayanan2021", "n0", A100, 1e11, 1024, 8, 8, 16, 0.02)]


def test_regime_picks_the_source():
    config = ParallelConfig(dp_size=1, tp_size=8, pp_size=1, micro_batch_size=1, global_batch_size=8)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 8), 1e9, _rows())
    assert err == pytest.approx(0.20)  # both single-node runs: (0.10 + 0.30) / 2
    assert src.startswith("vtrain: mean |error| of the 2 nearest single-node") and "no validated run" not in src
    config = ParallelConfig(dp_size=16, tp_size=8, pp_size=8, micro_batch_size=1, global_batch_size=128)
    err, src = expected_error_for(config, get_cluster("dgx-h100", 1024), 1.75e11, _rows())
    assert err == pytest.approx(0.02) and src.startswith("narayanan2021") and "no validated run on H100-SXM5-80GB" in src


def test_band_rows_from_cases():
    cases = [Case("vtrain", "vtrain_0001", "iteration_time_s", 1.0, 0.9, "h=1024 a=16 L=24 t=2 d=2 p=2 b=4 B=32"),
             Case("narayanan2021", "narayanan21_t1_1.7B", "tflops_per_gpu", 137.0, 140.0, "t=1 p=1 d=32 b=8 v=1 B=512 fp16"),
             Case("gemm", "g", "time_s", 1.0, 1.0)]
    rows = band_rows(cases, A100)
    assert len(rows) == 2
    # 12 L h^2 + (V + s) h = 12 * 24 * 1024^2 + (50257 + 1024) * 1024 = 302,000,000 + 52,511,744
    assert rows[0].params == 12 * 24 * 1024 ** 2 + (50257 + 1024) * 1024 and rows[0].num_gpus == 8 and rows[0].single_node
    assert rows[0].abs_error == pytest.approx(0.1)
    assert rows[1].params == pytest.approx(1.7e9) and rows[1].num_gpus == 32 and not rows[1].single_node


def test_bundled_bands_cover_both_regimes():
    rows = load_bands()
    assert {r.source for r in rows} == {"narayanan2021", "vtrain"} and len(rows) == 1450
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, micro_batch_size=1, global_batch_size=32)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 8), 3.5e8)
    assert 0 < err < 0.25 and src.startswith("vtrain")
    with pytest.raises(ValueError):
        expected_error_for(config, get_cluster("dgx-a100", 8), 0.0)


def test_a_model_far_from_every_run_of_its_regime_takes_the_nearest_of_either():
    # 1e8 parameters on 16 GPUs (multi-node): the only multi-node run is 1e11 (3 decades away),
    # so the two single-node 1e8 runs speak for it (mean (0.10 + 0.30 + 0.02)/3 of all three
    # nearest: K covers every row), and the source says why
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=4, micro_batch_size=1, global_batch_size=8)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 16), 1e8, _rows())
    assert err == pytest.approx((0.10 + 0.30 + 0.02) / 3)
    assert "no validated multi-node run within 10x" in src
    # within a decade of a run of its regime, the regime's runs alone count
    err, _ = expected_error_for(config, get_cluster("dgx-a100", 16), 2e10, _rows())
    assert err == pytest.approx(0.02)
