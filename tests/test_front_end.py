"""One front end: only :mod:`dml2comm.cli` prints, writes to the terminal or sets exit codes.

The packages below it return values and raise :class:`~dml2comm.errors.Dml2CommError`; the front
end parses the arguments, prints, draws the progress bars and turns an error into ``error: ...``
and exit code 2.  The check parses every module of ``dml2comm`` with :mod:`ast` (nothing is
imported) and lists, outside ``dml2comm/cli/``:

- ``print(...)`` calls;
- ``sys.exit``, ``os._exit`` and any use of ``SystemExit``;
- ``sys.stdout`` / ``sys.stderr`` used for anything but ``.isatty()`` (a write, a flush, a
  ``file=sys.stderr``);
- a rich ``Console(...)`` or ``Progress(...)`` made (what draws on the terminal).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import PACKAGE, ROOT, _write

FRONT_END = "dml2comm/cli/"

# Known places left for later, each ``(file, what)``: the test fails on any other one, and on an
# entry here that no longer occurs (so the list only shrinks).
ALLOWED: set[tuple[str, str]] = {
    # the stdlib-only launcher main.py runs before the packages (rich, the front end) can be
    # imported: when they are missing it must say so itself, and exit with code 2
    ("dml2comm/bootstrap.py", "print"),
    ("dml2comm/bootstrap.py", "SystemExit"),
    ("dml2comm/bootstrap.py", "sys.stdout"),
    ("dml2comm/bootstrap.py", "sys.stderr"),
}


def _what(node: ast.AST) -> str | None:
    """What ``node`` does of the front end's work, or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
        return "print"
    if isinstance(node, ast.Name) and node.id == "SystemExit":
        return "SystemExit"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "sys" and node.attr == "exit":
            return "sys.exit"
        if node.value.id == "os" and node.attr == "_exit":
            return "os._exit"
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if name in ("Console", "Progress"):
            return f"rich {name}"
    return None


def _stream_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``sys.stdout`` / ``sys.stderr`` used other than as ``sys.stderr.isatty()``."""
    isatty = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "isatty"}
    return [(n.lineno, f"sys.{n.attr}") for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "sys"
            and n.attr in ("stdout", "stderr") and id(n) not in isatty]


def terminal_work(root: Path = ROOT, package: str = PACKAGE) -> dict[tuple[str, str], list[int]]:
    """``(file, what) -> [line, ...]`` of the front end's work done outside ``dml2comm/cli/``."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(FRONT_END):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        hits = [(n.lineno, w) for n in ast.walk(tree) if (w := _what(n))] + _stream_uses(tree)
        for line, what in hits:
            found.setdefault((rel, what), []).append(line)
    return found


def test_only_the_front_end_prints_or_exits():
    found = terminal_work()
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not new, ("printing, terminal output or exit codes outside dml2comm/cli/ (return a value or raise a "
                     "Dml2CommError; let the front end print):\n"
                     + "\n".join(f"  {f}:{','.join(map(str, sorted(lines)))} {what}" for (f, what), lines in sorted(new.items())))
    gone = ALLOWED - set(found)
    assert not gone, f"fixed, so drop from ALLOWED: {sorted(gone)}"


def test_the_front_end_is_the_package_main_py_runs():
    assert (ROOT / FRONT_END / "__init__.py").is_file()
    assert "from dml2comm.cli import main" in (ROOT / "main.py").read_text(encoding="utf-8")


def test_the_check_finds_each_kind(tmp_path):
    _write(tmp_path, {
        "dml2comm/__init__.py": "",
        "dml2comm/cli/__init__.py": "import sys\nprint('ok')\nsys.exit(2)\n",  # the front end may
        "dml2comm/cost/__init__.py": "",
        "dml2comm/cost/a.py": (
            "import os, sys\n"
            "from rich.console import Console\n"
            "def f(x):\n"
            "    print(x)\n"
            "    print(x, file=sys.stderr)\n"
            "    sys.stdout.write('x')\n"
            "    if sys.stderr.isatty():\n"  # reading whether it is a terminal is not writing to it
            "        Console(stderr=True)\n"
            "    raise SystemExit(2)\n"
            "def g():\n"
            "    sys.exit(1)\n"
            "    os._exit(1)\n"),
    })
    found = terminal_work(tmp_path)
    assert found == {("dml2comm/cost/a.py", "print"): [4, 5], ("dml2comm/cost/a.py", "sys.stderr"): [5],
                     ("dml2comm/cost/a.py", "sys.stdout"): [6], ("dml2comm/cost/a.py", "rich Console"): [8],
                     ("dml2comm/cost/a.py", "SystemExit"): [9], ("dml2comm/cost/a.py", "sys.exit"): [11],
                     ("dml2comm/cost/a.py", "os._exit"): [12]}
