"""The tool's eager-step peak on each export of ``benchmarks/newarch_export.py`` (default /tmp/newarch)
against the FakeTensor count of ``benchmarks/fake_newarch.py`` (``benchmarks/data/fake_memory_newarch.json``),
the same comparison as ``benchmarks/bench_fake_fixtures.py`` (whose ``tool_peak`` this reuses).  No torch.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fake_newarch.py [KEY ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench_fake_fixtures import tool_peak  # noqa: E402  (FIXTURES / an absolute path is that path)

DATA = ROOT / "data" / "fake_memory_newarch.json"


def main(argv: list[str]) -> None:
    doc = json.loads(DATA.read_text())
    print(f"fake steps: torch {doc['torch']}, transformers {doc['transformers']}")
    print(f"{'arch':12s} {'mode':4s} {'cache':5s} {'drop':>4s} {'tool GB':>9s} {'fake GB':>9s} {'error':>7s}")
    for row in doc["runs"]:
        if argv and row["name"] not in argv:
            continue
        try:
            tool, dropouts = tool_peak(row)
        except Exception as exc:  # noqa: BLE001  a tool failure is a finding: print it, go on
            print(f"{row['name']:12s} {row['mode']:4s} TOOL FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        fake = row["peak_alloc_bytes"]
        print(f"{row['name']:12s} {row['mode']:4s} {str(row['use_cache']):5s} {dropouts:4d} {tool / 1e9:9.4f} "
              f"{fake / 1e9:9.4f} {tool / fake - 1:+7.1%}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
