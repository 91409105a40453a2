"""Expected-error bands (dml2comm.cost.bands) and their rows from validation (dml2comm.validate.bands)."""

from __future__ import annotations

import pytest

from dml2comm.cost.bands import UNVALIDATED_QUANTILE, BandRow, expected_error_for, load_bands, weighted_quantile
from dml2comm.hardware.cluster import get_cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.bands import band_rows
from dml2comm.validate.cases import Case

A100 = get_cluster("dgx-a100", 8).gpu.name


def _rows():
    # two single-node runs (1e8 params: 10% and 30% off), one multi-node run (1e11: 2% off)
    return [BandRow("vtrain", "v0", A100, 1e8, 8, 8, 2, 1, 0.10), BandRow("vtrain", "v1", A100, 1e8, 4, 8, 1, 1, 0.30),
            BandRow("narayanan2021", "n0", A100, 1e11, 1024, 8, 8, 16, 0.02)]


def test_regime_picks_the_source():
    config = ParallelConfig(dp_size=1, tp_size=8, pp_size=1, micro_batch_size=1, global_batch_size=8)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 8), 1e9, _rows(), min_kind=1)
    assert err == pytest.approx(0.30)  # both single-node runs: the 90% quantile of 0.10 and 0.30
    assert src.startswith("vtrain: the 90% quantile of |error| of the 2 nearest single-node")
    config = ParallelConfig(dp_size=16, tp_size=8, pp_size=8, micro_batch_size=1, global_batch_size=128)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 1024), 1.75e11, _rows(), min_kind=1)
    assert err == pytest.approx(0.02) and src.startswith("narayanan2021")


def _kind_rows():
    # 10 A100 megatron runs of one source (1%..10%), 10 of another (all 30%)
    return ([BandRow("a", f"a{i}", A100, 1e9, 8, 8, 1, 1, (i + 1) / 100) for i in range(10)]
            + [BandRow("b", f"b{i}", A100, 1e9, 8, 8, 1, 1, 0.30) for i in range(10)])


def test_each_source_weighs_the_same_in_the_quantile():
    # cumulative weight: source a's ten runs reach 1.0 of 2.0 at 10%; b's first run passes 1.8 (90%)
    assert weighted_quantile(_kind_rows(), 0.9) == pytest.approx(0.30)
    assert weighted_quantile(_kind_rows(), 0.5) == pytest.approx(0.10)
    assert weighted_quantile(_kind_rows(), 0.25) == pytest.approx(0.05)


def test_a_gpu_or_stack_without_validated_runs_gets_every_sources_quantile_not_its_nearest_neighbours():
    config = ParallelConfig(dp_size=8, micro_batch_size=1, global_batch_size=8)
    near, src = expected_error_for(config, get_cluster("dgx-a100", 8), 1e9, _kind_rows())
    assert near == pytest.approx(0.30) and "megatron runs" in src  # 18 of the 20 nearest are within 30%
    near, _ = expected_error_for(config, get_cluster("dgx-a100", 8), 1e9, _kind_rows()[:10])
    assert near == pytest.approx(0.09)  # the ninth of 1%..10%
    # another GPU, or another stack on the same GPU: no validated run of that kind
    for cluster, cfg in ((get_cluster("dgx-h100", 8), config),
                         (get_cluster("dgx-a100", 8), ParallelConfig(dp_size=8, micro_batch_size=1, global_batch_size=8, stack="pytorch"))):
        err, src = expected_error_for(cfg, cluster, 1e9, _kind_rows())
        assert err == pytest.approx(weighted_quantile(_kind_rows(), UNVALIDATED_QUANTILE)) and src.startswith("no validated")
    # a kind with a few runs: their mean where it is above the quantile
    few = _kind_rows() + [BandRow("h", "h0", get_cluster("dgx-h100", 8).gpu.name, 1e9, 1, 8, 1, 1, 0.5, "pytorch")]
    cfg = ParallelConfig(stack="pytorch")
    err, src = expected_error_for(cfg, get_cluster("dgx-h100", 1), 1e9, few)
    assert err == pytest.approx(0.5) and src.startswith("only 1 validated pytorch run on H100")


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
    assert {r.source for r in rows} == {"narayanan2021", "vtrain", "h100-steps", "gpu-steps"} and len(rows) == 1499
    assert {r.stack for r in rows if r.source in ("h100-steps", "gpu-steps")} == {"pytorch"}
    assert {r.gpu for r in rows if r.source == "gpu-steps"} == {"H100-SXM5-80GB", "H200-SXM-141GB"}
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, micro_batch_size=1, global_batch_size=32)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 8), 3.5e8)
    assert 0 < err < 0.25 and src.startswith("vtrain")
    with pytest.raises(ValueError):
        expected_error_for(config, get_cluster("dgx-a100", 8), 0.0)


def test_a_one_gpu_pytorch_step_is_banded_by_the_measured_steps_of_its_gpu():
    """On one H100 or H200 with --stack pytorch the band comes from the measured one-GPU steps
    nearest in size, not from every source: wider for a 124M model (its neighbours' steps are
    often host-bound) than the all-source band, and it names them."""
    config = ParallelConfig(micro_batch_size=8, global_batch_size=8, stack="pytorch")
    for cluster in ("dgx-h100", "hgx-h200"):
        err, src = expected_error_for(config, get_cluster(cluster, 1), 1.24e8)
        assert "gpu-steps" in src and "pytorch runs" in src and 0.1 < err < 0.35, (cluster, err, src)
    unvalidated, src = expected_error_for(config, get_cluster("dgx-a100", 1), 1.24e8)
    assert src.startswith("no validated pytorch run on A100")
    assert expected_error_for(config, get_cluster("dgx-h100", 1), 1.24e8)[0] > unvalidated


def test_a_model_far_from_every_run_of_its_regime_takes_the_nearest_of_either():
    # 1e8 parameters on 16 GPUs (multi-node): the only multi-node run is 1e11 (3 decades away),
    # so the two single-node 1e8 runs speak for it (the 90% quantile of all three nearest, 0.10,
    # 0.30 and 0.02: K covers every row), and the source says why
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=4, micro_batch_size=1, global_batch_size=8)
    err, src = expected_error_for(config, get_cluster("dgx-a100", 16), 1e8, _rows(), min_kind=1)
    assert err == pytest.approx(0.30)
    assert "no validated multi-node run within 10x" in src
    # within a decade of a run of its regime, the regime's runs alone count
    err, _ = expected_error_for(config, get_cluster("dgx-a100", 16), 2e10, _rows(), min_kind=1)
    assert err == pytest.approx(0.02)


def test_runs_that_state_a_host_wait_are_ranked_by_it():
    """Of 30 one-GPU pytorch runs of one size, 15 GPU-bound (host wait 5%, 2% off) and 15
    host-bound (host wait 60%, 25% off): a prediction stating its own wait takes the 20 nearest
    in wait too, so a GPU-bound step gets the GPU-bound runs' band and a host-bound one the
    other; one that states none mixes them.  The rows' ``host_share`` round-trips through the
    bands file."""
    from dml2comm.cost.bands import FIELDS
    from dml2comm.validate.bands import bands_csv

    h100 = get_cluster("dgx-h100", 1)
    rows = [BandRow("gpu-steps", f"g{i}", h100.gpu.name, 1.2e8, 1, 1, 1, 1, 0.02, "pytorch", 0.05) for i in range(15)]
    rows += [BandRow("gpu-steps", f"h{i}", h100.gpu.name, 1.2e8, 1, 1, 1, 1, 0.25, "pytorch", 0.60) for i in range(15)]
    config = ParallelConfig(micro_batch_size=8, global_batch_size=8, stack="pytorch")
    gpu_bound, src = expected_error_for(config, h100, 1.2e8, rows, host_share=0.04)
    host_bound, _ = expected_error_for(config, h100, 1.2e8, rows, host_share=0.7)
    unstated, _ = expected_error_for(config, h100, 1.2e8, rows)
    assert gpu_bound == pytest.approx(0.25) and "GPU waiting for the CPU 5-60% of the step, this one 4%" in src
    assert host_bound == pytest.approx(0.25) and unstated == pytest.approx(0.25)
    # above: the 20 nearest are the 15 GPU-bound runs and 5 host-bound ones, and the 90% quantile
    # (the 18th smallest error) is a host-bound one's.  With 30 GPU-bound runs and 5 host-bound,
    # the 20 nearest a GPU-bound step are all GPU-bound, and those nearest a host-bound step hold
    # all 5 host-bound ones
    more = rows[:15] + rows[:15] + rows[15:20]
    assert expected_error_for(config, h100, 1.2e8, more, host_share=0.04)[0] == pytest.approx(0.02)
    assert expected_error_for(config, h100, 1.2e8, more, host_share=0.7)[0] == pytest.approx(0.25)
    text = bands_csv(rows[:1] + [BandRow("vtrain", "v", "A100", 1e8, 8, 8, 1, 1, 0.1)])
    assert text.splitlines()[0].split(",") == list(FIELDS)
    assert text.splitlines()[1].endswith(",pytorch,0.0500") and text.splitlines()[2].endswith(",megatron,")
