"""The calibration loop closed (issue 20 parts 2-3): ``trace --cluster cal.yaml`` shows measured,
base-preset and calibrated predictions side by side; ``calibrate`` writes a page with the fitted
values and scatter charts; the References page of an analysis on a calibrated cluster lists the
calibrated constants against the base's.

The calibration is made once per module from the real HTA traces bundled in
tests/fixtures/traces/hta/ (provenance in ORIGIN.txt): ``nccl_parser_config`` (A100-PG509-200,
all-reduces with message sizes) and ``trace_filter`` rank 0/1 (recorded shapes): 104 large GEMM
shapes in eight regimes of min(M, N, K), 56 small ones in four, 27 memory-bound shapes and one fitted collective (ALL_REDUCE n=2 intra-node, 5 sizes).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from dml2comm.calibrate.base import base_cluster, collective_times_s, group_ranks
from dml2comm.render.calibration_charts import ScatterPoint, class_chart, loglog_chart
from dml2comm.cli import main
from dml2comm.hardware.cluster import get_cluster
from dml2comm.hardware.cluster_file import cluster_file_dict, dump_cluster_file, parse_cluster_file
from dml2comm.hardware.gpus import GPUS
from dml2comm.site.references import calibration_table

FIX = Path(__file__).parent / "fixtures"
HTA = FIX / "traces" / "hta"
NCCL = HTA / "nccl_parser_config__nccl_data.json.gz"
SHAPED = [HTA / "trace_filter__sampled_rank-0.json.gz", HTA / "trace_filter__sampled_rank-1.json.gz"]
GPT2 = FIX / "gpt2_legacy.onnx"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``calibrate`` on the three HTA traces, 30% held out, with its page (default folder)."""
    out = tmp_path_factory.mktemp("cal") / "a100.yaml"
    assert main(["calibrate", str(NCCL), *map(str, SHAPED), "--holdout", "0.3", "-o", str(out)]) == 0
    return out


# ------------------------------------------------------------------ part 1: trace closed loop


def test_trace_shows_measured_base_and_calibrated(calibrated: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "trace"
    assert main(["trace", str(NCCL), "--model", str(GPT2), "--seq-len", "128", "--cluster", str(calibrated),
                 "--out", str(out), "--no-site"]) == 0
    printed = capsys.readouterr().out
    assert "base error" in printed and "calibrated error" in printed
    assert "against its base dgx-a100 (A100-SXM4-40GB, preset constants)" in printed
    cmp = json.loads((out / "trace_analysis.json").read_text())["comparison"]
    assert cmp["cluster_file"] == {"name": "a100.yaml", "sha256": hashlib.sha256(calibrated.read_bytes()).hexdigest(),
                                   "calibrated": True, "date": cmp["cluster_file"]["date"], "base": "dgx-a100",
                                   "base_gpu": "A100-SXM4-40GB", "note": None}
    rows = {r["category"]: r for r in cmp["rows"]}
    for r in rows.values():  # the same relative error against the same measurement, for both predictions
        m = r["measured_s"]
        assert r["error_base"] == (pytest.approx((r["predicted_base_s"] - m) / m) if m else None)
    # the step's all-reduces: the fitted ALL_REDUCE n=2 intra-node (alpha 2.31 ms: DDP's buckets
    # wait for the backward pass) against NCCL's link model on NVLink (microseconds)
    assert rows["comm_dp"]["predicted_s"] > 10 * rows["comm_dp"]["predicted_base_s"] > 0
    # the lower calibrated GEMM factor slows the compute; the measured side is the trace's, unchanged
    assert rows["compute"]["predicted_s"] > rows["compute"]["predicted_base_s"]
    assert rows["compute"]["measured_s"] == pytest.approx(0.03786, abs=5e-6)
    with open(out / "comparison.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == ["category", "predicted_s", "measured_s", "error", "predicted_base_s", "error_base"]
    assert float(table[0]["predicted_base_s"]) == pytest.approx(rows["compute"]["predicted_base_s"], rel=1e-8)


def test_trace_with_a_file_whose_base_is_unknown_says_so(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(dump_cluster_file(cluster_file_dict(get_cluster("dgx-a100"), base="elsewhere")))
    assert main(["trace", str(NCCL), "--model", str(GPT2), "--seq-len", "128", "--cluster", str(path),
                 "--out", str(tmp_path / "t"), "--no-site"]) == 0
    cmp = json.loads((tmp_path / "t" / "trace_analysis.json").read_text())["comparison"]
    assert cmp["cluster_file"]["note"] == ("its base 'elsewhere' is neither a preset nor a cluster file beside it: "
                                           "no prediction with the base's constants")
    assert "predicted_base_s" not in cmp["rows"][0] and not cmp["cluster_file"]["calibrated"]
    assert "mine.yaml (hand-written" in capsys.readouterr().out


def test_base_cluster_of_a_file() -> None:
    # a 40 GB A100 calibrated in a dgx-a100 node: the base gets the 40 GB preset back
    cluster = get_cluster("dgx-a100")
    gpu = dataclasses.replace(GPUS["A100-SXM4-40GB"], name="A100-SXM4-40GB cal-0123abcd", gemm_sustained_factor=0.6)
    doc = cluster_file_dict(dataclasses.replace(cluster, gpu=gpu), base="dgx-a100")
    found = base_cluster(parse_cluster_file(doc, "c.yaml"), 16)
    assert found is not None and found[1] == "dgx-a100"
    assert found[0].gpu == GPUS["A100-SXM4-40GB"] and found[0].num_gpus == 16 and found[0].collective_fits == ()
    assert base_cluster(parse_cluster_file({**doc, "base": None}, "c.yaml")) is None
    # groups placed as the fits were measured: inside node 0; one rank per node; over two nodes
    assert group_ranks(4, "intra_node", 8) == (0, 1, 2, 3) and group_ranks(9, "intra_node", 8) is None
    assert group_ranks(2, "inter_node", 8) == (0, 8) and group_ranks(16, "inter_node", 8) == tuple(range(16))
    times = collective_times_s(lambda n: get_cluster("dgx-a100", n), "ALL_REDUCE", 8, "intra_node", [2**20, 2**28])
    assert times is not None and 0 < times[0] < times[1]


# --------------------------------------------------------------------- part 2: the page


def test_calibration_page_and_samples(calibrated: Path) -> None:
    site = calibrated.with_name("a100_site")
    html = (site / "index.html").read_text()
    assert "Kernel classes" in html and "<code>gemm_large@256..256</code>" in html and "collective ALL_REDUCE n=2 intra-node" in html
    # the page's downloads: the cluster file as written, and the samples the charts draw
    assert (site / "a100.yaml").read_bytes() == calibrated.read_bytes()
    points = json.loads((site / "samples.json").read_text())
    calibration = yaml.safe_load(calibrated.read_text())["calibration"]
    record = calibration["fitted"]
    gemm = next(c for c in calibration["classes"] if c["class"] == "gemm_large@256..256")
    # one point per distinct shape of each fitted class (GEMM regime), held-out ones flagged as the fit split them
    assert len(points["classes"]["gemm_large@256..256"]) == gemm["residual"]["shapes"] + gemm["holdout"]["shapes"] == 16 + 7
    assert sum(p["held_out"] for p in points["classes"]["gemm_large@256..256"]) == 7
    pointwise = points["classes"]["pointwise"]
    assert len(pointwise) == 16 + 7 and sum(p["held_out"] for p in pointwise) == 7
    fitted = [c["class"] for c in calibration["classes"] if c["value"] is not None]  # the classes with a fitted value
    assert sorted(points["classes"]) == sorted(fitted) and len(fitted) == 8 + 4 + 2
    assert "layer_norm" in fitted and "norm" not in fitted  # the LayerNorms are the layer_norm class's shapes
    assert sum(len(points["classes"][k]) for k in fitted if k.startswith("gemm_large@")) == 104
    (coll,) = points["collectives"]
    assert (coll["kind"], coll["group_size"], coll["level"], len(coll["points"])) == ("ALL_REDUCE", 2, "intra_node", 5)
    # the fitted line is alpha + beta S; the base's curve is NCCL's link model, far below it
    s, t = coll["line"][0]
    assert t == pytest.approx(coll["alpha_s"] + coll["beta_s_per_byte"] * s, rel=1e-5)
    assert all(b < f for (_, b), (_, f) in zip(coll["base_line"], coll["line"]))
    # a chart per fitted class and per collective; a hoverable point per shape for each model
    # (calibrated, base) and per size
    for title in ("GEMM, aligned, &gt;= 1 GFLOP, smallest dimension 256: 23 shapes",
                  "GEMM, aligned, &lt; 1 GFLOP, smallest dimension 128-240: 22 shapes", "element-wise: 23 shapes",
                  "LayerNorm / RMSNorm (eager PyTorch kernels): 11 shapes", "ALL_REDUCE n=2 intra-node: time by message size"):
        assert f"<title>{title}</title>" in html
    assert html.count('class="d2c-item"') == 2 * (104 + 56 + 23 + 11) + 5
    ref = record["collectives"][0]["reference_times_s"]
    assert [r["size_bytes"] for r in ref] == [2**20, 2**28] and ref[0]["fitted_s"] == pytest.approx(
        coll["alpha_s"] + coll["beta_s_per_byte"] * 2**20, rel=1e-5)


def test_calibrate_site_flags(tmp_path: Path, capsys) -> None:
    out = tmp_path / "n.yaml"
    assert main(["calibrate", str(NCCL), "-o", str(out), "--no-site"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.yaml"]
    assert main(["calibrate", str(NCCL), "-o", str(out), "--site", str(tmp_path / "page")]) == 0
    assert (tmp_path / "page" / "index.html").is_file() and (tmp_path / "page" / "samples.json").is_file()
    assert main(["calibrate", str(NCCL), "-o", str(out), "--site", str(tmp_path / "p2"), "--no-site"]) == 2
    assert "--site and --no-site contradict each other" in capsys.readouterr().err
    assert not (tmp_path / "p2").exists()


def test_loglog_chart_geometry_and_escaping() -> None:
    # decades 1e-4 .. 1e-2; plot 78 .. 640 - 36 = 604 px wide, 72 .. 420 - 52 = 368 px tall
    svg = loglog_chart("t", "x", "y", [ScatterPoint(1e-4, 1e-4, "a"), ScatterPoint(1e-2, 1e-3, "b")], diagonal=True)
    assert '<circle cx="78" cy="368"' in svg and '<circle cx="604" cy="220"' in svg  # 1e-3: half way up = 72 + 148
    assert 'x1="78" y1="368" x2="604" y2="72"' in svg  # y = x
    evil = [{"shape": "1x[64x64]@[64x64] bf16", "ops": ["<script>alert(1)</script>"], "repeats": 1,
             "measured_s": 1e-5, "model_s": 2e-5, "base_s": 1e-5, "held_out": True}]
    text = class_chart({"class": "gemm_small", "label": "<b>GEMM</b>", "quantity": "sustained factor", "value": 0.5,
                        "base_value": 0.7}, evil)
    assert "<b>" not in text and "&lt;b&gt;GEMM&lt;/b&gt;" in text
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "+100.0%" in text


# ---------------------------------------------------------------- part 3: References page


def test_references_list_the_calibrated_constants(calibrated: Path, tmp_path: Path) -> None:
    table = calibration_table(get_cluster(str(calibrated), 8))
    assert table is not None and table["file"] == "a100.yaml" and table["base"] == "dgx-a100"
    assert table["sha256"] == hashlib.sha256(calibrated.read_bytes()).hexdigest() and len(table["traces"]) == 3
    rows = {r["constant"]: r for r in table["rows"]}
    gemm = rows["gpu.calibrated_classes.gemm_large@256..256"]
    assert (gemm["value"], gemm["base"], gemm["samples"]) == ("0.5145", "0.723", "96")
    assert gemm["held"].startswith("7 shapes: 4.6% (base 25.0%); used: ")
    assert rows["gpu.calibrated_classes.pointwise"]["held"].startswith("7 shapes: 30.7% (base 18.5%); base kept: ")
    assert rows["collective ALL_REDUCE n=2 intra-node"]["base"].startswith("1\u00a0MiB: ")
    assert "links.inter_node" in table["from_base"]
    assert calibration_table(get_cluster("dgx-a100", 8)) is None
    plain = tmp_path / "plain.yaml"
    plain.write_text(dump_cluster_file(cluster_file_dict(get_cluster("dgx-a100"), base="dgx-a100")))
    assert calibration_table(get_cluster(str(plain), 8))["note"].startswith("a hand-written cluster file")


@pytest.mark.slow
def test_references_page_of_an_analysis_on_a_calibrated_cluster(calibrated: Path, tmp_path: Path) -> None:
    assert main([str(GPT2), "--seq-len", "128", "--d", "2", "--cluster", str(calibrated), "--no-advice",
                 "--out", str(tmp_path / "a")]) == 0
    html = (tmp_path / "a" / "site" / "references.html").read_text()
    assert "Calibrated constants" in html and hashlib.sha256(calibrated.read_bytes()).hexdigest() in html
    assert "<code>gpu.calibrated_classes.gemm_large@256..256</code></td><td>0.5145</td><td>0.723</td>" in html
    assert "nccl_parser_config__nccl_data.json.gz" in html
