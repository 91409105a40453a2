"""The first numbers a reviewer reads agree with each other (issue 19, "Numbers that agree").

On data.json, the CLI summary and the rendered overview, for a pipeline, a data-parallel-only,
a context-parallel and an expert-parallel configuration:
- compute + pipeline bubble + exposed communication + optimizer step = the iteration, so the
  breakdown bar needs no unexplained "other" part;
- ``bubble_fraction`` is the bubble's share of the iteration (the same number the bar shows);
  Narayanan et al.'s bubble / busy time is ``bubble_ratio``;
- exposed communication <= communication (``comm_time_s`` counts every stage's collectives:
  removing them all shortens the critical path by at most their time on it).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from dml2comm.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

CASES = {
    "pipeline": [str(ROOT / "examples" / "gpt2-small.onnx"), "--d", "2", "--p", "4", "--t", "2"],
    "dp-only": [str(ROOT / "examples" / "gpt2-small.onnx"), "--d", "4"],
    "cp": [str(FIXTURES / "gpt2_dynamo.onnx"), "--seq-len", "64", "--d", "2", "--cp", "2", "--p", "2"],
    "ep": [str(FIXTURES / "mixtral_tiny_dynamo.onnx"), "--seq-len", "16", "--d", "4", "--ep", "2", "--p", "2"],
}


def _run(tmp_path: Path, capsys, args: list[str], site: bool = False) -> tuple[dict, dict]:
    out = tmp_path / "out"
    code = main([*args, "--out", str(out), "--json", "--no-advice", *([] if site else ["--no-site"])])
    printed = capsys.readouterr().out
    assert code == 0
    cli_summary = json.loads(next(line for line in printed.splitlines() if line.startswith("{")))
    return json.loads((out / "data.json").read_text())["summary"], cli_summary


def _check(s: dict) -> None:
    it = s["iteration_time_s"]
    parts = s["compute_time_s"] + s["bubble_time_s"] + s["exposed_comm_time_s"] + s["optimizer_time_s"]
    assert parts == pytest.approx(it, rel=1e-9)
    assert s["bubble_fraction"] == pytest.approx(s["bubble_time_s"] / it, rel=1e-12)
    assert s["exposed_comm_time_s"] <= s["comm_time_s"] * (1 + 1e-12)
    assert s["comm_time_busiest_stage_s"] <= s["comm_time_s"] * (1 + 1e-12)
    assert 0.0 <= s["bubble_fraction"] <= 1.0


@pytest.mark.parametrize("case", sorted(CASES))
def test_data_json_and_cli_summary_agree(tmp_path, capsys, case):
    data, cli = _run(tmp_path, capsys, CASES[case])
    _check(data)
    assert cli == data


def test_rendered_overview_shows_one_bubble_and_exposed_within_communication(tmp_path, capsys):
    data, _ = _run(tmp_path, capsys, CASES["pipeline"], site=True)
    page = html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "out" / "site" / "index.html").read_text()))
    page = re.sub(r"\s+", " ", page)
    # the card and the bar give the same bubble share (one decimal, as fmt_share writes it)
    card = re.search(r"PIPELINE BUBBLE[^0-9]*([0-9.]+)%", page, re.IGNORECASE)
    bar = re.search(r"pipeline bubble: [0-9.]+ [µm]?s \(([0-9.]+)%\)", page)
    assert card and bar, page[:2000]
    assert card.group(1) == bar.group(1) == f"{100 * data['bubble_fraction']:.1f}"
    assert "other:" not in page  # the four parts add up to the iteration


def _showcase_args() -> list[str]:
    """The quick start's showcase, read from quickstart.sh (``SHOWCASE=(...)``), model path absolute."""
    text = (ROOT / "quickstart.sh").read_text()
    args = re.search(r"^SHOWCASE=\(([^)]*)\)", text, re.MULTILINE).group(1).split()
    return [str(ROOT / args[0]), *args[1:]]


def _text(path: Path) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", path.read_text())))


def test_the_showcase_tells_one_story_across_overview_timeline_and_stage_page(tmp_path, capsys):
    """Issue 35.3: the quick start's showcase fills its pipeline, and its bottleneck reads the same
    on every page: the overview's compute card, the timeline's per-stage table and the busiest
    stage's page give one compute time and share for that stage, and the overview and the
    timeline name the same busiest stage."""
    args = _showcase_args()
    data, _ = _run(tmp_path, capsys, args, site=True)
    full = json.loads((tmp_path / "out" / "data.json").read_text())
    cfg = full["config"]
    assert cfg["num_micro_batches"] >= 4 * cfg["p"] and 4 <= cfg["micro_batch_size"] <= 8  # a pipeline that is full
    crit = data["critical_stage"]
    site = tmp_path / "out" / "site"
    overview, timeline = _text(site / "index.html"), _text(site / "timeline.html")
    stage = _text(site / f"stage_{crit}_data_0.html")

    card = re.search(r"COMPUTE \(BUSIEST STAGE\) (?:› )?([0-9.]+ [µm]?s) ([0-9.]+%) of the iteration: stage (\d+)'s own operators "
                     r"\(busy ([0-9.]+%)", overview, re.IGNORECASE)
    assert card, overview[:3000]
    compute, share, card_stage, busy = card.groups()
    assert int(card_stage) == crit
    row = re.search(rf"stage {crit} \(busiest\) ([0-9.]+ [µm]?s) ([0-9.]+%) [0-9.]+ [µm]?s \(([0-9.]+%)\)", timeline)
    assert row, timeline
    assert row.groups() == (compute, share, busy)  # one number per quantity
    assert f"compute {compute} ({share} of the iteration; the busiest stage" in stage
    assert f"({busy}) with the tensor-parallel collectives" in stage
    # the bottleneck names the same stage on the overview and the timeline, and the timeline marks it
    named = {int(n) for page in (overview, timeline) for n in re.findall(r"\(stage (\d+) is the busiest\)", page)}
    assert named == {crit}
    assert len(re.findall(r"\(busiest\)", timeline)) == 1
    assert f"{compute} ({share}" in overview.replace("compute: ", "")  # the breakdown bar: the same compute
