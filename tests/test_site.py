"""The drill-down site, built for real into temporary folders.

- a crawler follows every link of every page and inside every SVG: none is broken, nothing is
  loaded from off the host, every page is reachable from the overview;
- a headless Chromium (Debian's, driven by playwright; no browser download) clicks
  overview -> replica -> stage -> layer -> GPU graph and reads tooltips;
- a hostile model's names show literally and run no script;
- outputs are published atomically; the command line builds, serves, and fails cleanly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import onnx
import pytest

from dml2comm import zoo
from dml2comm.cli import main
from dml2comm.site import build as site_build
from dml2comm.site.build import SiteError, build_and_publish, md_text, publish
from tests.test_cli import ROOT, assert_bad, run
from tests.test_charts import over_capacity_analysis
from tests.test_render import EVIL, _analysis, hostile_model

pytestmark = pytest.mark.dot

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
XLINK = "{http://www.w3.org/1999/xlink}href"


@pytest.fixture(scope="module")
def gpt_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=3, hidden=64, heads=4, vocab=256, seq_len=32), path)
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory, gpt_onnx) -> Path:
    """``python main.py gpt.onnx --d 2 --p 2 --t 2 --out OUT``: returns OUT."""
    out = tmp_path_factory.mktemp("site")
    assert main([str(gpt_onnx), "--d", "2", "--p", "2", "--t", "2", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def over_site(tmp_path_factory) -> Path:
    """A site whose stage 0 needs more memory than its GPU (zoo GPT, fp16, V100, b = 64, t = 2)."""
    out = tmp_path_factory.mktemp("over")
    a = over_capacity_analysis(dp=2, tp=2, pp=4, micro_batch=64)
    assert a.memory["over_capacity_stages"] == [0]
    build_and_publish(a, out, {"data.json": "{}\n"})
    return out


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile")
    a = _analysis(hostile_model(), lenient=True, tp_size=2, dp_size=2)
    build_and_publish(a, out, {"data.json": "{}\n"})
    return out


# ---------------------------------------------------------------------------------------------
# crawler


class _Links(HTMLParser):
    RESOURCE = {("link", "href"), ("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"), ("image", "href"),
                ("use", "href"), ("image", "xlink:href"), ("use", "xlink:href")}

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (kind, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if (tag, name) in self.RESOURCE:
                self.links.append(("resource", value))
            elif tag == "a" and name in ("href", "xlink:href"):
                self.links.append(("link", value))
            elif name == "style" and "url(" in value:
                self.links.append(("resource", value))


def _crawl(site_dir: Path) -> dict[str, set[str]]:
    """Every local target of every page; asserts that none is broken or off the host."""
    graph: dict[str, set[str]] = {}
    for page in sorted(site_dir.glob("*.html")):
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        base = page.as_uri()
        targets: set[str] = set()
        for kind, url in parser.links:
            assert not url.lower().startswith("javascript:"), (page.name, url)
            if kind == "resource":
                assert not re.match(r"^(https?:)?//", url), f"{page.name} loads {url} from off the host"
            if url.startswith(("http://", "https://", "mailto:")):
                continue
            target = urldefrag(urljoin(base, url))[0]
            path = Path(urlparse(target).path)
            if page.name != "404.html":
                assert path.exists(), f"{page.name}: broken link {url}"
            if path.suffix == ".html":
                targets.add(path.name)
        graph[page.name] = targets
    return graph


def test_every_link_works_and_nothing_loads_off_the_host(site):
    site_dir = site / "site"
    graph = _crawl(site_dir)
    # every page is reachable from the overview
    seen, todo = set(), ["index.html"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    assert seen >= set(graph) - {"404.html"}
    assert {"memory.html", "timeline.html"} <= seen
    assert (site_dir / "trace.json").is_file()  # the timeline page's link (checked above) has its file
    # links inside the SVGs of svg_file/ point at each other
    svgs = sorted((site / "svg_file").glob("*.svg"))
    assert {p.name for p in svgs} >= {"overview.svg", "data_0_detail.svg", "data_1_detail.svg", "stage_1_data_0_detail.svg",
                                      "layer_2_data_0_detail.svg", "gpu_comm_pp_0.svg", "gpu_comm_tp_1.svg", "gpu_comm_dp_0.svg",
                                      "memory.svg", "timeline.svg"}
    hrefs = 0
    for path in svgs:
        for el in ET.parse(path).getroot().iter():
            href = el.get(XLINK)
            if href:
                hrefs += 1
                assert (path.parent / href).is_file(), f"{path.name}: broken link {href}"
    assert hrefs > 20
    # CSS files reference only local files
    for css in site_dir.rglob("*.css"):
        for url in re.findall(r"url\(\s*['\"]?([^'\")]+)", css.read_text(encoding="utf-8")):
            assert not re.match(r"^(https?:)?//", url), f"{css.name} loads {url}"


def test_404_page_loads_its_assets_relative(site):
    """MkDocs writes 404.html with root-absolute paths; made relative they work under file://."""
    page = site / "site" / "404.html"
    html = page.read_text(encoding="utf-8")
    assert not re.search(r'(?:href|src)="/(?!/)', html), re.findall(r'(?:href|src)="/[^"]*"', html)[:3]
    assert '"base": "."' in html
    for url in re.findall(r'(?:href|src)="([^"#]+)"', html):
        if not re.match(r"^[a-z]+:", url):
            assert (page.parent / url).is_file(), url


def test_stage_page_shows_the_tied_copy_so_parameters_add_up(site):
    """The tiny GPT ties its LM head to the word embedding: the last stage holds a copy, and its
    page shows it (drawing and layer table), so the layers' parameters + the copy = the stage's."""
    data = json.loads((site / "data.json").read_text())
    last = data["stages"][-1]
    layers = sum(l["params"] for l in data["layers"] if l["stage"] == last["index"])
    held = last["params"] - layers
    assert held == 256 * 64  # vocab x hidden: the word embedding
    assert data["stages"][0]["params"] == sum(l["params"] for l in data["layers"] if l["stage"] == 0)  # the owner
    html = (site / "site" / f"stage_{last['index']}_data_0.html").read_text(encoding="utf-8").replace("\xa0", " ")
    assert "tied copy" in html and "<td>16,384</td>" in html, "the held copy is in the layer table"
    assert f"{layers:,} in its layers + 16,384 in the tied copy it holds" in html


def test_send_recv_tooltips_name_the_host_time(site):
    """A pipeline message's time is its transfer plus the host model's time per message: the
    Send/Recv boxes say both, on the box and in the tooltip."""
    root = ET.parse(site / "svg_file" / "stage_1_data_0_detail.svg").getroot()
    titles = [(t.text or "").replace("\xa0", " ") for t in root.iter("{http://www.w3.org/2000/svg}title")]
    recv = [t for t in titles if t.startswith("activations from stage 0")]
    assert recv and re.search(r"\(\S+ [µm]?s transfer \+ 1\.50 ms host\)", recv[0]), recv
    assert "CPU time per pipeline message" in recv[0]
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")).replace("\xa0", " ")
    assert "transfer + 1.50 ms host" in texts


def test_pages_levels_and_nav(site):
    site_dir = site / "site"
    index = (site_dir / "index.html").read_text(encoding="utf-8")
    for word in ("Iteration time", "Memory per GPU", "Bottleneck", "replica 1", "data_0.html", "references.html", "d2c-legend"):
        assert word in index
    for name in ("data_0", "data_1", "stage_0_data_0", "stage_1_data_0", "layer_0_data_0", "layer_2_data_0", "layer_4_data_0",
                 "gpu_comm_pp_0", "gpu_comm_tp_0", "gpu_comm_dp_1", "references", "memory", "timeline"):
        html = (site_dir / f"{name}.html").read_text(encoding="utf-8")
        assert 'class="d2c-crumbs"' in html and 'href="index.html"' in html, name  # breadcrumbs back to the overview
        if name != "references":
            assert "d2c-back" in html, name
        assert "Stages (replica 0)" in html and "Layers (replica 0)" in html and "GPU communication" in html  # nav levels
        nav = re.findall(r'<a href="([a-z_0-9]+\.html)" class="md-nav__link', html)
        assert nav[:3] == ["index.html", "memory.html", "timeline.html"], (name, nav[:4])  # after the overview
    refs = (site_dir / "references.html").read_text(encoding="utf-8")
    for word in ("allreduce_ring", "roofline", "Thakur", "nccl-tests", "PCIE4_X16_BYTES_PER_S", "GPU in use", "DEFAULT_BUCKET_BYTES"):
        assert word in refs, word
    data = json.loads((site / "data.json").read_text(encoding="utf-8"))
    assert data["config"]["dp_size"] == 2 if "dp_size" in data["config"] else data["config"]["d"] == 2


def _svg_of(html: str, chart: str) -> ET.Element:
    m = re.search(r'<svg class="d2c-svg"[^>]*data-chart="%s".*?</svg>' % chart, html, re.S)
    assert m, f"no {chart} chart in the page"
    return ET.fromstring(m.group(0))


def test_memory_and_timeline_pages(site):
    site_dir = site / "site"
    index = (site_dir / "index.html").read_text(encoding="utf-8")
    # the overview's memory card leads to the memory page, the iteration card to the timeline
    assert re.search(r'<a class="d2c-card d2c-card-link" href="memory.html"[^>]*><div class="d2c-card-title">Memory per GPU', index)
    assert re.search(r'href="timeline.html"[^>]*><div class="d2c-card-title">Iteration time', index)
    memory = (site_dir / "memory.html").read_text(encoding="utf-8")
    root = _svg_of(memory, "memory")
    assert {el.get("data-stage") for el in root.iter() if el.get("class") == "d2c-seg"} == {"0", "1"}
    for word in ("Peak and headroom", "largest contributor", "Every stage fits", "micro-batches in flight", "headroom"):
        assert word in memory, word
    assert "Changes that would make it fit" not in memory  # it fits
    timeline = (site_dir / "timeline.html").read_text(encoding="utf-8")
    root = _svg_of(timeline, "timeline")
    boxes = [el for el in root.iter() if el.get("class") == "d2c-box"]
    trace = json.loads((site_dir / "trace.json").read_text(encoding="utf-8"))
    assert (site_dir / "trace.json").read_text(encoding="utf-8") == (site / "trace.json").read_text(encoding="utf-8")
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "compute"]
    assert len([b for b in boxes if b.get("data-kind") in ("forward", "backward")]) == len(steps) == 2 * 2 * 2  # p (F + B) m
    for word in ("Where the time goes", "pipeline bubble", "exposed communication", "optimizer step", "bottleneck",
                 'href="trace.json"', "ui.perfetto.dev", "chrome://tracing", "What would make it faster"):
        assert word in timeline, word
    assert "d2c-slot" not in timeline and "d2c-slot" not in memory  # the charts took their places
    # the charts of svg_file/ are the same drawings, standalone
    for name in ("memory", "timeline"):
        ET.parse(site / "svg_file" / f"{name}.svg")


def test_stages_over_capacity_are_red_on_every_drawing(over_site):
    svg_dir, site_dir = over_site / "svg_file", over_site / "site"

    def red_titles(path: Path) -> list[str]:
        root = ET.parse(path).getroot()
        out = []
        for g in root.iter("{http://www.w3.org/2000/svg}g"):
            if g.get("class") in ("node", "cluster") and any(el.get("stroke") == "#d50000" for el in g.iter()):
                title = g.find("{http://www.w3.org/2000/svg}title")
                out.append(title.text if title is not None else "".join(g.itertext()))
        return out

    overview = red_titles(svg_dir / "overview.svg")
    assert len(overview) == 2 and all(t.startswith("stage 0 of replica") and "over memory: " in t for t in overview)
    for d in (0, 1):
        red = red_titles(svg_dir / f"data_{d}_detail.svg")
        assert len(red) == 1 and red[0].startswith(f"stage 0 of replica {d}") and "over memory" in red[0]
    assert len(red_titles(svg_dir / "stage_0_data_0_detail.svg")) == 1
    assert not red_titles(svg_dir / "stage_1_data_0_detail.svg")
    pp = red_titles(svg_dir / "gpu_comm_pp_0.svg")  # stage 0's frame and its two GPUs, not stage 1's
    assert any("stage 0 (replica 0)" in t for t in pp) and not any("stage 1" in t for t in pp) and len(pp) == 3
    assert len(red_titles(svg_dir / "gpu_comm_tp_0.svg")) == 2 and not red_titles(svg_dir / "gpu_comm_tp_1.svg")
    assert not red_titles(svg_dir / "layer_2_data_0_detail.svg")  # layers are not marked: alike blocks stay alike
    # pages: the stage's header, the overview's card and table, the memory page's suggestions
    stage0 = (site_dir / "stage_0_data_0.html").read_text(encoding="utf-8")
    assert 'class="d2c-over-badge"' in stage0 and "over memory: " in stage0
    assert "d2c-over-badge" not in (site_dir / "stage_1_data_0.html").read_text(encoding="utf-8")
    index = (site_dir / "index.html").read_text(encoding="utf-8")
    assert "d2c-card-alarm" in index and "d2c-over-cell" in index and "double red outline" in index
    memory = (site_dir / "memory.html").read_text(encoding="utf-8")
    assert "Changes that would make it fit" in memory and "--recompute" in memory and "predicted peak" in memory
    root = _svg_of(memory, "memory")
    assert [el.get("data-stage") for el in root.iter() if el.get("class") == "d2c-over"] == ["0"]
    timeline = _svg_of((site_dir / "timeline.html").read_text(encoding="utf-8"), "timeline")
    assert ["d2c-over-label" in el.get("class") for el in timeline.iter() if "d2c-row-label" in (el.get("class") or "")] == \
        [True, False, False, False]
    _crawl(site_dir)


def test_over_capacity_keeps_alike_layers_laid_out_once():
    from dml2comm.render.dot import all_drawings, overview_drawing
    from dml2comm.render.facts import Facts

    facts = Facts.of(over_capacity_analysis(pp=2, micro_batch=32))
    assert facts.over_stages == (0,)
    drawings = all_drawings(facts, 8)
    blocks = [d.dot for d in drawings if d.name.startswith("layer_")]
    assert len(set(blocks)) < len(blocks)  # blocks of the same stage share their DOT (and layout)
    dot = overview_drawing(facts, 8).dot
    assert dot.count('peripheries="2"') == 1 and dot.count('color="#d50000"') == 1


def test_many_replicas_collapse_into_one_page(tmp_path, gpt_onnx):
    model = onnx.load(str(gpt_onnx), load_external_data=False)
    a = _analysis(model, micro_batch_size=1, dp_size=12)
    stats = build_and_publish(a, tmp_path, {}, replica_pages_max=8)
    site_dir = tmp_path / "site"
    assert not (site_dir / "data_1.html").exists() and (site_dir / "replicas.html").exists()
    assert not (tmp_path / "svg_file" / "data_1_detail.svg").exists()
    html = (site_dir / "replicas.html").read_text(encoding="utf-8")
    assert "replica 11" in html
    overview = (tmp_path / "svg_file" / "overview.svg").read_text(encoding="utf-8")
    assert "replicas 2–11" in overview and "replica 5" not in overview
    assert stats.layouts_run < stats.drawings  # alike blocks laid out once
    _crawl(site_dir)


# ---------------------------------------------------------------------------------------------
# hostile names


def test_hostile_names_are_escaped_everywhere(hostile_site):
    site_dir = hostile_site / "site"
    for page in site_dir.glob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert "<script>alert" not in html, page.name
        assert 'Evil<b>' not in html, page.name
    layer = (site_dir / "layer_0_data_0.html").read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(" in layer
    for svg in (hostile_site / "svg_file").glob("*.svg"):
        ET.parse(svg)  # well-formed


def test_md_filter_keeps_markdown_punctuation_literal():
    assert str(md_text("a*b_c <x> &\nd")) == "a\\*b\\_c &lt;x&gt; &amp; d"


# ---------------------------------------------------------------------------------------------
# headless browser


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (scripts/setup.sh installs it with apt-get)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_click_down_from_overview_to_gpu_graph(browser, site):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((site / "site" / "index.html").as_uri())
    for target in ("data_0.html", "stage_1_data_0.html", "layer_3_data_0.html"):
        page.click(f"svg a[*|href='{target}'] >> nth=0")
        page.wait_for_url(f"**/{target}")
    # a tooltip of an operator: name, costs and sharding rule
    page.hover("svg g.node:has(text:text-is('MatMul')) >> nth=0")
    tip = page.inner_text(".d2c-tip")
    assert "FLOPs: forward" in tip and "time per micro-batch" in tip and "sharded by:" in tip
    # a tensor-parallel collective opens its GPU group
    page.click("svg a[*|href='gpu_comm_tp_1.html'] >> nth=0")
    page.wait_for_url("**/gpu_comm_tp_1.html")
    page.hover("svg g.node >> nth=0")
    assert re.search(r"GPU \d+: replica 0, stage 1", page.inner_text(".d2c-tip"))
    # and back up through the breadcrumbs
    page.click("nav.d2c-crumbs a:text-is('Stage 1')")
    page.wait_for_url("**/stage_1_data_0.html")
    page.click("svg a[*|href='gpu_comm_pp_0.html'] >> nth=0")
    page.wait_for_url("**/gpu_comm_pp_0.html")
    assert "stage 0" in page.inner_text("h1").lower()
    # zoom buttons change the view
    before = page.get_attribute(".d2c-viewport svg", "viewBox")
    page.click("button[data-zoom='in']")
    assert page.get_attribute(".d2c-viewport svg", "viewBox") != before
    assert not errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    page.close()


def test_timeline_and_memory_tooltips_in_the_browser(browser, over_site):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((over_site / "site" / "index.html").as_uri())
    page.click("a.d2c-card-link[href='memory.html']")
    page.wait_for_url("**/memory.html")
    page.hover("svg text.d2c-over-label")
    assert "over memory: " in page.inner_text(".d2c-tip")
    page.hover("svg rect.d2c-seg[data-part='activations'] >> nth=0")
    assert "micro-batches in flight" in page.inner_text(".d2c-tip")
    page.click("nav.md-nav a.md-nav__link[href='timeline.html']")
    page.wait_for_url("**/timeline.html")
    page.hover("svg rect.d2c-box[data-kind='backward'] >> nth=0")
    tip = page.inner_text(".d2c-tip")
    assert "backward of micro-batch" in tip and "stage " in tip
    before = page.get_attribute(".d2c-viewport svg", "viewBox")
    page.click("button[data-zoom='in']")
    assert page.get_attribute(".d2c-viewport svg", "viewBox") != before
    assert page.locator("a[href='trace.json']").count() == 1
    assert not errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    page.close()


def test_hostile_text_shows_literally_and_runs_nothing(browser, hostile_site):
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto((hostile_site / "site" / "layer_0_data_0.html").as_uri())
    assert page.locator("svg text", has_text='Evil<b>Op&"').count() == 1
    assert page.get_by_text('<script>alert("x")</script>', exact=False).count() > 0
    page.hover("svg g.node:has(text:text-is('MatMul')) >> nth=0")
    assert EVIL.split("\n")[0] in page.inner_text(".d2c-tip")
    page.goto((hostile_site / "site" / "index.html").as_uri())
    assert not dialogs
    assert page.evaluate("Array.from(document.scripts).every(s => !s.textContent.includes('alert'))")
    page.close()


# ---------------------------------------------------------------------------------------------
# publishing and the command line


def test_failed_build_leaves_previous_outputs(tmp_path, gpt_onnx, monkeypatch):
    out = tmp_path / "out"
    (out / "site").mkdir(parents=True)
    (out / "site" / "index.html").write_text("old site")
    (out / "data.json").write_text("old data")

    def fail(config_path):
        raise SiteError("mkdocs exploded")

    monkeypatch.setattr(site_build, "mkdocs_build", fail)
    model = onnx.load(str(gpt_onnx), load_external_data=False)
    with pytest.raises(SiteError):
        build_and_publish(_analysis(model, micro_batch_size=1, tp_size=2), out, {"data.json": "new data"})
    assert (out / "data.json").read_text() == "old data"
    assert (out / "site" / "index.html").read_text() == "old site"
    assert sorted(p.name for p in out.iterdir()) == ["data.json", "site"]


def test_publish_rolls_back_when_a_step_fails(tmp_path):
    staging, out = tmp_path / "staging", tmp_path / "out"
    staging.mkdir()
    out.mkdir()
    (out / "data.json").write_text("old")
    (out / "site").mkdir()
    (staging / "data.json").write_text("new")  # staging has no site/: the second rename fails
    with pytest.raises(SiteError):
        publish(staging, out, ["data.json", "site"])
    assert (out / "data.json").read_text() == "old" and (out / "site").is_dir()


def test_cli_says_where_to_open_the_site(tmp_path, gpt_onnx):
    out = tmp_path / "o"
    result = run(str(gpt_onnx), "--t", "2", "--micro-batch-size", "1", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"site: open {(out / 'site' / 'index.html').resolve()}" in " ".join(result.stdout.split())
    assert (out / "svg_file" / "overview.svg").is_file() and (out / "data.json").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".dml2comm-")]


def test_cli_without_dot_fails_cleanly(tmp_path, gpt_onnx):
    out = tmp_path / "o"
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run([sys.executable, str(ROOT / "main.py"), str(gpt_onnx), "--out", str(out)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(empty)})
    assert_bad(result, out, "Graphviz `dot` not found: install it with apt-get install graphviz")


def test_serve_needs_the_site(tmp_path, gpt_onnx):
    out = tmp_path / "o"
    assert_bad(run(str(gpt_onnx), "--serve", "--no-site", "--out", str(out), cwd=tmp_path), out, "--serve needs the site")


def test_serve_prints_a_local_url_and_stops_on_ctrl_c(tmp_path, gpt_onnx):
    out = tmp_path / "o"
    # Ctrl-C's default in the child even where this process ignores SIGINT (a suite started in
    # the background by a non-interactive shell): a child inherits the ignoring, and Python then
    # raises no KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), str(gpt_onnx), "--micro-batch-size", "1", "--out", str(out),
                             "--json", "--serve"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = None
        for _ in range(5):
            line = proc.stdout.readline()
            m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            if m:
                url = m.group(1)
                break
        assert url, proc.stderr.read() if proc.poll() is not None else "no URL printed"
        with urllib.request.urlopen(url + "layer_1_data_0.html", timeout=10) as response:
            assert response.status == 200 and b"d2c-graph" in response.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
