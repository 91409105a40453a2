"""Issue 19, long work shows progress on a terminal: the site build reports a progress bar over the
Graphviz layouts and a line before MkDocs, which the command line draws on stderr when it is a
terminal, and writes nothing when it is not (pipes, files and tests stay clean)."""

from __future__ import annotations

import io
import re
import sys

import onnx
import pytest
from rich.console import Console

from dml2comm import zoo
from dml2comm.cli import main
from dml2comm.render.dot import Drawing
from dml2comm.render.svg import render
from dml2comm.cli.progress import progress_console, site_progress
from dml2comm.site.build import build_and_publish
from tests.test_render import _analysis

pytestmark = pytest.mark.dot

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=256, seq_len=32), path)
    return _analysis(onnx.load(str(path), load_external_data=False), micro_batch_size=1, tp_size=2, pp_size=2), path


def test_render_reports_each_distinct_layout():
    seen: list[tuple[int, int]] = []
    a = Drawing(name="a", page="a", title="a", dot="digraph { x -> y }")
    b = Drawing(name="b", page="b", title="b", dot="digraph { x -> z }")
    same = Drawing(name="c", page="c", title="c", dot="digraph { x -> y }")  # laid out once with "a"
    _, stats = render([a, b, same], jobs=2, on_layout=lambda done, total: seen.append((done, total)))
    # one call before the first layout, then one per distinct layout (2 of the 3 drawings)
    assert stats.layouts_run == 2 and sorted(seen) == [(0, 2), (1, 2), (2, 2)]


def test_build_on_a_terminal_shows_the_layouts_and_the_mkdocs_line(analysis, tmp_path):
    a, _ = analysis
    buf = io.StringIO()
    stats = build_and_publish(a, tmp_path, {"data.json": "{}\n"},
                              progress=site_progress(Console(file=buf, force_terminal=True, width=100, color_system=None)))
    text = ANSI.sub("", buf.getvalue())
    assert "Graphviz layouts" in text  # the bar, drawn while the layouts run
    assert f"{stats.layouts_run}/{stats.layouts_run}" in text  # it reached the number of layouts run
    assert re.search(rf"Graphviz: \d+ drawings, {stats.layouts_run} distinct layouts in [0-9.]+ s", text)
    assert f"building the site with MkDocs: {stats.pages} pages" in text
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_library_builds_silently(analysis, tmp_path, capsys, monkeypatch):
    a, _ = analysis
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    build_and_publish(a, tmp_path, {"data.json": "{}\n"})  # no progress given: only the command line draws it
    assert capsys.readouterr().err == ""


def test_default_progress_follows_whether_stderr_is_a_terminal(analysis, tmp_path, capsys, monkeypatch):
    a, _ = analysis
    assert progress_console(None) is None  # pytest's captured stderr is not a terminal
    assert progress_console(False) is None
    # (off a terminal the main command writes nothing on stderr: the test below)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert isinstance(progress_console(None), Console)
    build_and_publish(a, tmp_path / "tty", {"data.json": "{}\n"}, progress=site_progress())
    err = ANSI.sub("", capsys.readouterr().err)
    assert "building the site with MkDocs" in err and "distinct layouts" in err


def test_main_command_writes_nothing_on_stderr_when_piped(analysis, tmp_path, capsys):
    _, path = analysis
    assert main([str(path), "--t", "2", "--p", "2", "--micro-batch-size", "1", "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "site: open" in " ".join(captured.out.split())
