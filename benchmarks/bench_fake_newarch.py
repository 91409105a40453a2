"""The tool's eager-step peak on each export of ``benchmarks/newarch_export.py`` (default /tmp/newarch)
against the FakeTensor count of ``benchmarks/fake_newarch.py`` (``benchmarks/data/fake_memory_newarch.json``),
the same comparison as ``benchmarks/bench_fake_fixtures.py`` (whose ``print_comparison`` this reuses).  No torch.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fake_newarch.py [KEY ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench_fake_fixtures import print_comparison  # noqa: E402  (its tool_peak: FIXTURES / an absolute path is that path)

DATA = ROOT / "data" / "fake_memory_newarch.json"


def main(argv: list[str]) -> None:
    print_comparison(json.loads(DATA.read_text()), argv, f"{'arch':12s} {'mode':4s} {'cache':5s}",
                     lambda r: f"{r['name']:12s} {r['mode']:4s} {str(r['use_cache']):5s}")

if __name__ == "__main__":
    main(sys.argv[1:])
