"""Modules talk through public names: no module of ``dml2comm`` reads another module's ``_private``
names (STYLE.md, "Calculon": "no importing another module's _private helpers").

The check parses every module with :mod:`ast` (nothing is imported) and reports

- ``from dml2comm.X import _name`` (or a relative ``from .X import _name``) in any module but X;
- ``import dml2comm.X`` / ``import dml2comm.X as m`` / ``from dml2comm.pkg import X`` followed by
  ``X._name`` (the attribute right after a module);
- an import of a private module (``dml2comm.ops._common``) from outside its package.

Dunder names (``__version__``) are public.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dml2comm"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str, root: Path) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` reads from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(root: Path, package: str = PACKAGE) -> list[str]:
    """Every cross-module use of a private name in ``root/package`` as ``path:line: what``."""
    found: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        module = _module_name(path, root)
        is_package = path.name == "__init__.py"
        where = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules: dict[str, str] = {}  # local name -> the dml2comm module it is bound to

        def check_module_path(dotted: str, line: int) -> None:
            parts = dotted.split(".")
            for i, part in enumerate(parts):
                if _private(part):
                    owner = ".".join(parts[:i])  # the package the private module belongs to
                    if not (module == owner or module.startswith(owner + ".")):
                        found.append(f"{where}:{line}: imports private module {dotted} from outside {owner}")
                    return

        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(node, module, is_package)
                if not (source == package or source.startswith(package + ".")):
                    continue
                check_module_path(source, node.lineno)
                for alias in node.names:
                    if _private(alias.name) and source != module:
                        found.append(f"{where}:{node.lineno}: from {source} import {alias.name}")
                    elif _is_module(f"{source}.{alias.name}", root):
                        modules[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        check_module_path(alias.name, node.lineno)
                        if alias.asname:
                            modules[alias.asname] = alias.name
                        else:
                            modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain: list[str] = []
            value: ast.expr = node
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if not isinstance(value, ast.Name) or value.id not in modules:
                continue
            chain.reverse()  # attributes after the name, outermost last: node.attr is chain[-1]
            dotted = modules[value.id]
            for attr in chain[:-1]:  # follow submodules (dml2comm.site.build....)
                if not _is_module(f"{dotted}.{attr}", root):
                    break
                dotted = f"{dotted}.{attr}"
            else:
                if _private(node.attr) and dotted != module:
                    found.append(f"{where}:{node.lineno}: {dotted}.{node.attr}")
    return sorted(set(found))


def test_no_module_imports_another_modules_private_names():
    assert private_imports(ROOT) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_check_finds_each_kind_of_private_import(tmp_path):
    _write(tmp_path, {
        "dml2comm/__init__.py": "__version__ = '0'\n",
        "dml2comm/a.py": "def _helper():\n    return 1\n\ndef public():\n    return _helper()\n",
        "dml2comm/b.py": "from dml2comm.a import _helper, public\n",  # line 1: from-import of a private name
        "dml2comm/c.py": "import dml2comm.a\nimport dml2comm.a as alias\nfrom dml2comm import a\n\n"
                         "x = dml2comm.a._helper()\ny = alias._helper()\nz = a._helper()\nok = a.public()\n",
        "dml2comm/pkg/__init__.py": "from . import mod\n",
        "dml2comm/pkg/mod.py": "from ._impl import thing\nfrom .._priv import y\n",  # private module of the package: fine
        "dml2comm/pkg/_impl.py": "thing = 1\n",
        "dml2comm/_priv.py": "y = 2\n",
        "dml2comm/d.py": "from dml2comm.pkg._impl import thing\nfrom .a import _helper\nfrom dml2comm import __version__\n",
    })
    assert private_imports(tmp_path) == sorted([
        "dml2comm/b.py:1: from dml2comm.a import _helper",
        "dml2comm/c.py:5: dml2comm.a._helper",
        "dml2comm/c.py:6: dml2comm.a._helper",
        "dml2comm/c.py:7: dml2comm.a._helper",
        "dml2comm/d.py:1: imports private module dml2comm.pkg._impl from outside dml2comm.pkg",
        "dml2comm/d.py:2: from dml2comm.a import _helper",
    ])


def test_a_module_may_use_its_own_private_names(tmp_path):
    _write(tmp_path, {
        "dml2comm/__init__.py": "",
        "dml2comm/a.py": "import dml2comm.a\n\ndef _helper():\n    return 1\n\nx = dml2comm.a._helper()\n",
    })
    assert private_imports(tmp_path) == []
