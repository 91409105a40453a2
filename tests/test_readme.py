"""The README and the docs/ pages are for users: their commands run as written, they point only at
files in the repository, and neither they nor any ``--help`` text carries development history
(tracker numbers, notes that live outside the repository)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

#: What a user-facing text must not mention: tracker numbers and notes outside the repository.
HISTORY = re.compile(r"issue|\.\./shared|DESIGN\.md|REFERENCES\.md", re.IGNORECASE)


def _code_block_lines(path: Path) -> list[str]:
    """The lines inside the fenced (```) code blocks of a Markdown file."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line.strip())
    return lines


def readme_commands() -> list[str]:
    return [line for line in _code_block_lines(README) if line.startswith("python main.py")]


def test_the_quick_start_is_the_two_scripts():
    lines = _code_block_lines(README)
    assert any(line.startswith("./quickstart.sh ") for line in lines)
    assert any(line.startswith("./test.sh ") for line in lines)
    assert (ROOT / "quickstart.sh").is_file() and (ROOT / "test.sh").is_file()


def test_readme_commands_run_as_written(tmp_path):
    """Every ``python main.py`` line of the README's code blocks, in order (the calibrated analysis
    reads the cluster file the calibrate line writes), from a folder holding copies of the inputs
    they name. Each must exit 0 and write only under that folder's ``out/``, never into the
    repository. Two speed-ups only, to keep this under a minute on 2 cores: ``validate`` runs 3
    cases per source without the leave-one-source-out refits (the full sets take minutes;
    tests/test_validate.py covers them), and only the first command builds its drill-down site
    (the others add ``--no-site``: a site is a few seconds of Graphviz each, and tests/test_site.py
    tests sites)."""
    commands = readme_commands()
    assert len(commands) >= 10, commands
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    traces = tmp_path / "tests" / "fixtures" / "traces"
    for name in ("gloo_pp2_dp2", "hta"):
        shutil.copytree(ROOT / "tests" / "fixtures" / "traces" / name, traces / name)
    for name in ("benchmarks/data/gpu_steps/h100_trace_gpt2-small_bf16_b8_s1024.json.gz",
                 "dml2comm/validate/data/models/step_gpt2_small_dynamo.onnx"):  # the one-GPU trace's prediction
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    repo_before = sorted(p.name for p in ROOT.iterdir())
    site_built = shutil.which("dot") is None  # without Graphviz no command builds a site
    for line in commands:
        words = shlex.split(line, comments=True)
        command = words[2]
        if command == "validate":
            words += ["--sample", "3", "--no-loso", "--no-site"]
        elif command in ("sweep", "compare", "trace", "calibrate") or command.endswith(".onnx"):
            if site_built:
                words.append("--no-site")
            site_built = True
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *words[2:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{line}\n{r.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks", "dml2comm", "examples", "out", "tests"]
    assert sorted(p.name for p in ROOT.iterdir()) == repo_before
    if shutil.which("dot"):
        assert (tmp_path / "out" / "site" / "index.html").is_file()


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_carry_no_development_history(path):
    bad = [f"{i}: {line}" for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if HISTORY.search(line)]
    assert not bad, "\n".join(bad)


HELPS = (["--help"], *([c, "--help"] for c in ("zoo", "presets", "collective", "sweep", "compare", "trace",
                                                "validate", "calibrate")),
         *(["zoo", k, "--help"] for k in ("gpt", "llama", "moe", "bert", "resnet", "mlp", "preset")))


@pytest.mark.parametrize("argv", HELPS, ids=lambda a: " ".join(a))
def test_help_texts_carry_no_development_history(argv):
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    bad = [line for line in r.stdout.splitlines() if HISTORY.search(line)]
    assert not bad, "\n".join(bad)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lstrip("#").strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files_in_the_repository(path):
    bad = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    assert not bad, "\n".join(bad)
