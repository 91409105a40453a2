"""The Validation page of ``python main.py validate``: the parity charts, the target checks, and
the page built on a sampled run, its numbers equal to validation.json's."""

from __future__ import annotations

import csv
import json
import math
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.render.charts import xml_text
from dml2comm.render.parity import BAND_COLOURS, ParityPoint, log_ticks, parity_chart
from dml2comm.site.build import SiteError
from dml2comm.validate import Case, summarize
from dml2comm.site import build as site_build
from dml2comm.site.validate import build_validation_site, chart_name, publish_validation, quantity_unit, validation_page
from dml2comm.validate.targets import check_target

EVIL = "<script>alert(\"x\")</script> 'q' & &lt; a:b\nline2 \\N *_[x]"


# ---------------------------------------------------------------------------------------------
# the chart
# ---------------------------------------------------------------------------------------------

_CIRCLE = re.compile(r'<circle class="d2c-pt" cx="([0-9.]+)" cy="([0-9.]+)"[^>]*data-case="([^"]*)" data-error="([^"]*)"/>')


def test_log_ticks_by_hand():
    assert log_ticks(1, 1000) == [1, 10, 100, 1000]  # 3 decades: powers of ten
    assert log_ticks(1, 50) == [1, 2, 5, 10, 20, 50]  # 1.7 decades: 1-2-5
    assert log_ticks(0.95, 7) == [1, 2, 3, 4, 5, 6, 7]  # under a decade: 1-9 x 10^k (0.9 is below 0.95)
    # 120-160 holds no 1-9 x 10^k: evenly stepped, nice_step(40, 4) = 10
    assert log_ticks(120, 160) == pytest.approx([120, 130, 140, 150, 160])
    assert len(log_ticks(1e-9, 1e3)) <= 7  # 12 decades thinned
    with pytest.raises(ValueError):
        log_ticks(0, 1)


def test_parity_chart_geometry_points_and_escaping():
    """Both axes span [lo, hi] = [min / 1.14, max x 1.14] (1.14 = 1 + the widest band 10% + 4%)
    on one log scale over a 420 px square whose corner is (76, 478): a case predicted exactly
    lies on the diagonal (cx - 76 = 478 - cy), one predicted 10% high lies log10(1.1) / log10(hi
    / lo) x 420 px above it."""
    pts = [ParityPoint(1.0, 1.0, "exact"), ParityPoint(10.0, 11.0, "ten-high"), ParityPoint(100.0, 96.0, EVIL, tip=EVIL)]
    svg = parity_chart(pts, "ms", "t")
    found = {unescape(m.group(3)): (float(m.group(1)), float(m.group(2)), float(m.group(4))) for m in _CIRCLE.finditer(svg)}
    assert set(found) == {"exact", "ten-high", EVIL} and len(_CIRCLE.findall(svg)) == 3
    span = math.log10(100 * 1.14 / (1 / 1.14))
    cx, cy, err = found["exact"]
    assert err == 0 and cx - 76 == pytest.approx(478 - cy, abs=0.011)
    assert cx - 76 == pytest.approx(math.log10(1.14) / span * 420, abs=0.006)
    cx, cy, err = found["ten-high"]
    assert err == pytest.approx(0.1)
    assert (478 - cy) - (cx - 76) == pytest.approx(math.log10(1.1) / span * 420, abs=0.011)
    # colours: 0% within 5% (green), +10% within 10% (amber), -4% green
    assert svg.count(f'fill="{BAND_COLOURS[0]}" fill-opacity') == 2 and svg.count(f'fill="{BAND_COLOURS[1]}" fill-opacity') == 1
    assert '<line class="d2c-diagonal" x1="76" y1="478" x2="496" y2="58"' in svg
    assert [b for b in re.findall(r'class="d2c-band" data-bound="([0-9.]+)"', svg)] == ["0.1", "0.05"]
    # the hostile id is escaped in the attribute and the tooltip: no raw markup anywhere
    assert "<script>" not in svg and xml_text(EVIL) in svg
    assert svg.count("<title>") == 1 + 2 + 3  # the chart, the two bands, the three points


def test_parity_chart_refuses_what_a_log_axis_cannot_show():
    with pytest.raises(ValueError):
        parity_chart([], "s", "t")
    with pytest.raises(ValueError):
        parity_chart([ParityPoint(1.0, 0.0, "zero")], "s", "t")


def test_quantity_unit():
    t = [Case("s", "a", "iteration_time_s", 0.02, 0.02), Case("s", "b", "iteration_time_s", 0.5, 0.5),
         Case("s", "c", "iteration_time_s", 0.004, 0.004)]
    assert quantity_unit(t) == ("ms", 1e-3)  # median 0.02 s
    assert quantity_unit([Case("s", "a", "tflops_per_gpu", 140.0, 141.0)]) == ("TFLOP/s per GPU", 1.0)


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------


def _c(source: str, case_id: str, quantity: str, error: float, tags: tuple[str, ...] = ()) -> Case:
    return Case(source, case_id, quantity, 1.0, 1.0 + error, tags=tags)


def test_target_checks_by_hand():
    assert check_target("narayanan2021", [_c("n", "a", "tflops_per_gpu", 0.04), _c("n", "b", "tflops_per_gpu", -0.049)]).met is True
    assert check_target("narayanan2021", [_c("n", "a", "tflops_per_gpu", 0.051)]).met is False
    # vTrain: mean |error| (0.10 + 0.02) / 2 = 6% <= 8% and worst 10% <= 25% -> met; a 30% case breaks the worst bound
    assert check_target("vtrain", [_c("v", "a", "t", 0.10), _c("v", "b", "t", -0.02)]).met is True
    assert check_target("vtrain", [_c("v", "a", "t", 0.30)] + [_c("v", str(i), "t", 0.0) for i in range(9)]).met is False
    k = [_c("k", "x/forward", "layer_forward_time_s", 0.03), _c("k", "x/backward", "layer_backward_time_s", -0.06)]
    check = check_target("korthikanti2022", k)
    assert check.met is False and "backward worst |error| 6.0% > 5%" in check.detail
    # NCCL: only the A100 rows are judged
    assert check_target("nccl", [_c("c", "a", "t", 0.08, ("A100",)), _c("c", "b", "t", 0.5, ("V100",))]).met is True
    assert check_target("nccl", [_c("c", "b", "t", 0.05, ("V100",))]).met is None
    # H100: per (op, group) mean at >= 16 MiB: all_reduce/n2 (0.12 + 0.06) / 2 = 9% ok, all_gather/n8 11% not;
    # median over all sizes |0.12, 0.06, 0.11, 0.5| = (0.11 + 0.12) / 2 = 11.5% <= 15%
    big = (">=16MiB",)
    xla = [_c("x", "1", "t", 0.12, ("H100", "all_reduce/n2") + big), _c("x", "2", "t", -0.06, ("H100", "all_reduce/n2") + big),
           _c("x", "3", "t", 0.11, ("H100", "all_gather/n8") + big), _c("x", "4", "t", 0.5, ("H100", "all_gather/n8"))]
    check = check_target("xla_collectives", xla)
    assert check.met is False and "11.0% (all_gather/n8; <= 10%)" in check.detail and "median over all sizes 11.5%" in check.detail
    assert check_target("xla_collectives", xla[:2] + xla[3:]).met is True
    # GEMM: the median over the >= 1 GFLOP shapes only
    g = [_c("g", "a", "t", 0.07, (">=1GFLOP",)), _c("g", "b", "t", 0.5), _c("g", "c", "t", -0.02, (">=1GFLOP",))]
    assert check_target("gemm", g).met is True
    assert check_target("nobody", g).met is None and check_target("gemm", []).met is None


# ---------------------------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------------------------


class _Tables(HTMLParser):
    """Every ``<tr>`` of the page with its attributes and its ``<td>`` cells (attributes, text),
    grouped by the class of its table."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[tuple[dict, list[tuple[dict, str]]]]] = {}
        self._table: str | None = None
        self._cell: tuple[dict, list[str]] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("class", "")
        elif tag == "tr" and self._table is not None:
            self.rows.setdefault(self._table, []).append((a, []))
        elif tag == "td" and self._table is not None:
            self._cell = (a, [])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1].append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[self._table][-1][1].append((self._cell[0], "".join(self._cell[1])))
            self._cell = None
        elif tag == "table":
            self._table = None


def _tables(html: str) -> dict[str, list[tuple[dict, list[tuple[dict, str]]]]]:
    parser = _Tables()
    parser.feed(html)
    return parser.rows


def _charts(html: str) -> dict[str, list[str]]:
    """{source: the data-case of every point} of each parity chart inlined in the page."""
    out = {}
    for svg in re.findall(r"<svg .*?</svg>", html, flags=re.S):
        if 'data-chart="parity"' not in svg:
            continue
        source = re.search(r"<title>([^<:]+): predicted against measured", svg).group(1)
        out[source] = [unescape(m.group(3)) for m in _CIRCLE.finditer(svg)]
    return out


def _check_page(out: Path) -> dict:
    """The page against validation.json and validation.csv: every figure of the per-source and
    LOSO tables (exact values in data-value), each verdict, one chart point and one table row
    per case."""
    summary = json.loads((out / "validation.json").read_text())
    with (out / "validation.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    html = (out / "site" / "index.html").read_text()
    tables = _tables(html)
    keys = ("count", "mean_abs_error", "median_abs_error", "signed_mean_error", "worst_error")
    main_rows = [(a, cells) for a, cells in tables["d2c-table d2c-validation"] if "data-source" in a and "data-subset" not in a]
    order = list(dict.fromkeys(r["source"] for r in rows))  # the run's order (validation.json's keys are sorted)
    assert [a["data-source"] for a, _ in main_rows] == order and sorted(order) == sorted(summary["sources"])
    for a, cells in main_rows:
        s = summary["sources"][a["data-source"]]
        assert [float(c["data-value"]) for c, _ in cells[1:6]] == [s[k] for k in keys]
        assert cells[6][1] == s["worst_case"]
        assert cells[-1][0]["data-met"] == {True: "true", False: "false", None: "none"}[s["target_met"]]
        assert s["target_check"] in unescape(cells[-2][1])
    loso = [x for x in tables.get("d2c-table d2c-loso", []) if "data-source" in x[0]]
    assert [a["data-source"] for a, _ in loso] == [r["source"] for r in summary["loso"]]
    for (a, cells), r in zip(loso, summary["loso"]):
        assert float(cells[1][0]["data-value"]) == r["shipped_mean_abs_error"]
        assert float(cells[2][0]["data-value"]) == r["in_sample_mean_abs_error"]
        assert float(cells[4][0]["data-value"]) == r["loso_mean_abs_error"]
        assert float(cells[7][0]["data-value"]) == pytest.approx(r["loso_mean_abs_error"] / r["in_sample_mean_abs_error"], rel=1e-15)
    charts = _charts(html)
    assert set(charts) == set(summary["sources"])
    for name in summary["sources"]:
        ids = [r["case"] for r in rows if r["source"] == name]
        assert sorted(charts[name]) == sorted(ids) and len(ids) == summary["sources"][name]["count"]
        assert (out / "site" / "charts" / f"{chart_name(name)}.svg").is_file()
        case_rows = [x for x in tables["d2c-table d2c-case-table"] if x[0].get("data-case") in ids]
        table_rows = [(a["data-case"], [c["data-value"] for c, _ in cells[1:4]]) for a, cells in case_rows]
        assert table_rows == [(r["case"], [r["measured"], r["predicted"], r["error"]]) for r in rows if r["source"] == name]
    assert (out / "site" / "validation.json").read_text() == (out / "validation.json").read_text()
    assert (out / "site" / "validation.csv").read_text() == (out / "validation.csv").read_text()
    return summary


def test_page_of_a_sampled_run_equals_validation_json(tmp_path, capsys):
    """--sample 5 of every source (the refits are the next test's: with Narayanan's they cost ~15 s)."""
    out = tmp_path / "val"
    assert main(["validate", "--sample", "5", "--no-loso", "--out", str(out)]) == 0
    assert f"the Validation page {out / 'site' / 'index.html'}" in capsys.readouterr().out
    summary = _check_page(out)
    assert sorted(summary["sources"]) == ["gemm", "gpu-steps", "h100-gemm", "h100-steps", "korthikanti2022", "narayanan2021", "nccl", "vtrain",
                                          "xla_collectives"]
    assert summary["sources"]["h100-steps"]["count"] == 4  # 2 steps (fewer than 5), time and memory each
    assert summary["sources"]["korthikanti2022"]["count"] == 10  # 5 rows sampled, forward and backward each
    assert "d2c-table d2c-loso" not in _tables((out / "site" / "index.html").read_text())


def test_page_shows_the_leave_one_source_out_refits(tmp_path):
    out = tmp_path / "val"
    assert main(["validate", "--source", "vtrain,korthikanti2022", "--sample", "5", "--out", str(out)]) == 0
    summary = _check_page(out)
    assert [r["source"] for r in summary["loso"]] == ["vtrain", "korthikanti2022"]


def test_no_site_writes_the_files_only(tmp_path):
    out = tmp_path / "val"
    assert main(["validate", "--source", "nccl", "--no-site", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["validation.csv", "validation.json"]


def test_hostile_case_text_is_escaped_on_the_page(tmp_path):
    cases = [Case("src", EVIL, "iteration_time_s", 2.0, 2.1, setup=EVIL + "\n\n# heading?"),
             Case("src", "plain", "iteration_time_s", 1.0, 0.8)]
    summary = {"sample": None, "error_definition": "predicted / measured - 1", "loso": [],
               "sources": {"src": {"title": "T", "target": "none", "quantity": "iteration_time_s", "target_met": None,
                                   "target_check": "", **summarize(cases)}}}
    ctx, charts = validation_page(cases, summary)
    build_validation_site(tmp_path, ctx, charts)
    html = (tmp_path / "site" / "index.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    assert "<h1 id=\"heading\"" not in html  # the setup's blank line did not end the raw HTML block
    assert sorted(_charts(html)["src"]) == sorted([EVIL, "plain"])
    rows = {a["data-case"]: cells for a, cells in _tables(html)["d2c-table d2c-case-table"] if "data-case" in a}
    assert set(rows) == {" ".join(EVIL.split()), "plain"}
    assert float(rows["plain"][3][0]["data-value"]) == pytest.approx(-0.2)


def test_a_failed_site_build_changes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "val"
    publish_validation(out, {"validation.csv": "old\n", "validation.json": "{}\n"})

    def fail(config):
        raise SiteError("mkdocs could not build the site: boom")

    monkeypatch.setattr(site_build, "mkdocs_build", fail)  # the one page-site builder (site.build.build_pages_site)
    cases = [Case("src", "a", "iteration_time_s", 1.0, 1.1)]
    summary = {"sample": None, "loso": [], "sources": {"src": {"title": "T", "target": "t", "quantity": "iteration_time_s",
                                                                "target_met": None, "target_check": "", **summarize(cases)}}}
    with pytest.raises(SiteError):
        publish_validation(out, {"validation.csv": "new\n", "validation.json": "{\"x\": 1}\n"}, cases, summary)
    assert sorted(p.name for p in out.iterdir()) == ["validation.csv", "validation.json"]
    assert (out / "validation.csv").read_text() == "old\n"
