"""Functions stay short: no function or method of ``dml2comm`` runs over 80 lines (the ``def`` line to
the last line of its body, decorators excluded), so a reader meets short named steps.

The check parses every module with :mod:`ast` (nothing is imported). Nested functions and methods
count on their own, under their qualified name (``Class.method``, ``outer.inner``); an outer
function's length includes its nested ones. The test fails on any long function not listed in
``ALLOWED_LONG`` (empty: every function is split), and on an entry that is no longer over the
limit (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dml2comm"
MAX_LINES = 80

# Known long functions, ``"path/relative/to/dml2comm.py:qualified.name"``, to be split: none left,
# so any function over the limit fails the test.
ALLOWED_LONG: set[str] = set()


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, lines)`` of every function and method below ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def long_functions() -> dict[str, int]:
    """Every function of the package over :data:`MAX_LINES` lines, with its length."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for name, lines in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            if lines > MAX_LINES:
                found[f"{module}:{name}"] = lines
    return found


def test_no_new_long_functions():
    new = {name: lines for name, lines in long_functions().items() if name not in ALLOWED_LONG}
    assert not new, (f"functions over {MAX_LINES} lines (split them into short named steps): "
                     + ", ".join(f"{name} ({lines} lines)" for name, lines in sorted(new.items())))


def test_the_allow_list_only_shrinks():
    stale = sorted(ALLOWED_LONG - set(long_functions()))
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): delete from ALLOWED_LONG: {stale}"


def test_the_counter_sees_methods_and_nested_functions():
    source = "class A:\n    def m(self):\n        def inner():\n            pass\n" + "        x = 1\n" * 90
    names = dict(_functions(ast.parse(source)))
    assert names["A.m"] == 93 and names["A.m.inner"] == 2
