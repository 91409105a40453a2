"""``python main.py ...`` with a Python that lacks the packages (issue 35, item 1).

The quick start installs the packages into ``.venv``; a newcomer then types ``python main.py ...``
with the system Python.  main.py must re-execute itself under ``.venv/bin/python`` (same
arguments), and without a ``.venv`` print one line ``error: ...`` naming the setup command and
exit 2 -- never a ModuleNotFoundError traceback.

"A Python that lacks the packages" is a fresh ``python -m venv --without-pip`` in tmp_path.  The
project is a copy of main.py and dml2comm/bootstrap.py next to a stub ``dml2comm/cli.py`` that
prints which interpreter ran it and with what arguments; ``.venv/bin/python`` is a small shell
script that execs a chosen interpreter (and counts its starts), so its presence or absence is
simulated without touching the real checkout.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dml2comm.bootstrap import GUARD

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["model.onnx", "--d", "2", "--p", "4", "--t", "2"]  # the mission's own command line

STUB_CLI = '''import os, sys
def main():
    print("ran", sys.executable, " ".join(sys.argv[1:]), os.environ.get("DML2COMM_REEXEC", "-"))
    return 0
'''


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with only the standard library: a venv made without pip (about a second)."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = str(where / "bin" / "python")
    probe = subprocess.run([python, "-c", "import onnx"], capture_output=True, text=True)
    assert probe.returncode != 0, "the bare venv should not see onnx"
    return python


def make_project(root: Path, *, stub_cli: bool = True) -> Path:
    """Copy main.py and the bootstrap module (plus a stub CLI, or a link to the real package)."""
    root.mkdir()
    shutil.copy(ROOT / "main.py", root / "main.py")
    if stub_cli:
        pkg = root / "dml2comm"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        shutil.copy(ROOT / "dml2comm" / "bootstrap.py", pkg / "bootstrap.py")
        (pkg / "cli.py").write_text(STUB_CLI)
    else:
        (root / "dml2comm").symlink_to(ROOT / "dml2comm", target_is_directory=True)
    return root


def add_venv(root: Path, interpreter: str) -> Path:
    """``.venv/bin/python``: a script that appends a line to ``starts`` and execs *interpreter*."""
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "python"
    script.write_text(f'#!/bin/sh\necho start >> "{root / "starts"}"\nexec "{interpreter}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def run(python: str, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (GUARD, "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run([python, "main.py", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def starts(root: Path) -> int:
    path = root / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_without_a_venv_one_error_line_names_the_setup_command_and_exits_2(bare_python, tmp_path):
    root = make_project(tmp_path / "proj")
    result = run(bare_python, root, *ARGS)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "onnx" in lines[0] and "./quickstart.sh" in lines[0] and "bash scripts/setup.sh" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_with_a_venv_main_py_reruns_itself_there_with_the_same_arguments(bare_python, tmp_path):
    root = make_project(tmp_path / "proj")
    add_venv(root, sys.executable)  # an interpreter that has the packages
    result = run(bare_python, root, *ARGS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ran", sys.executable, *ARGS, "1"]  # the script exec'd this one
    assert starts(root) == 1 and result.stderr == ""


def test_a_venv_without_the_packages_ends_in_the_error_line_not_a_loop(bare_python, tmp_path):
    root = make_project(tmp_path / "proj")
    add_venv(root, bare_python)  # .venv exists but setup never finished
    result = run(bare_python, root, *ARGS)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "bash scripts/setup.sh" in lines[0], result.stderr
    assert starts(root) == 1  # re-executed once, then stopped by the guard


def test_a_python_with_the_packages_runs_in_place(tmp_path):
    root = make_project(tmp_path / "proj")
    add_venv(root, sys.executable)
    result = run(sys.executable, root, *ARGS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ran", sys.executable, *ARGS, "-"]  # no exec, no guard
    assert starts(root) == 0


def test_the_real_command_line_runs_from_a_bare_python(bare_python, tmp_path):
    root = make_project(tmp_path / "proj", stub_cli=False)
    add_venv(root, sys.executable)
    result = run(bare_python, root, "presets")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("GPUs: ") and "dgx-a100" in result.stdout
