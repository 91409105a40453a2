"""The tool's peak memory of one eager training step on each decoder-only causal-LM dynamo fixture
against PyTorch's FakeTensor count of the same step (``benchmarks/data/fake_memory_fixtures.json``,
written by ``benchmarks/fake_fixtures.py``).  Prints only; no torch.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fake_fixtures.py [FIXTURE ...]

The tool's side is the one ``tests/test_step_memory.py::test_zoo_step_peaks_match_the_fake_tensor_steps``
reads: ``analyze_graph(load_model(fixture, ImportOptions(batch_size=b, seq_len=s)),
ParallelConfig(micro_batch_size=b, global_batch_size=b, seq_len=s, stack="pytorch",
precision=mode, dtype="bf16"), make_cluster("h100", 1)).stages[0].memory["total_bytes"]`` (without
the framework constant, which the fake count does not hold either).  Also printed: the number of
Dropout nodes in the graph (the tool counts a 1-byte mask per node; the fake steps train without
dropout, matching the eval-mode exports, which have none), and ``use_cache`` of the fake step (False:
the export's config; True: transformers' default, the step the memory model assumes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "fake_memory_fixtures.json"
FIXTURES = ROOT.parent / "tests" / "fixtures"


def tool_peak(row: dict) -> tuple[float, int]:
    """The tool's peak bytes for a row's fixture, step and mode, and the graph's Dropout count."""
    b, s = row["b"], row["s"]
    imported = load_model(FIXTURES / row["fixture"], ImportOptions(batch_size=b, seq_len=s))
    cfg = ParallelConfig(micro_batch_size=b, global_batch_size=b, seq_len=s, stack="pytorch",
                         precision=row["mode"], dtype="bf16")
    analysis = analyze_graph(imported, cfg, make_cluster("h100", 1), advise=False, timeline=False)
    dropouts = sum(op.op_type == "Dropout" for op in imported.graph.ops)
    return analysis.stages[0].memory["total_bytes"], dropouts


def print_comparison(doc: dict, argv: list[str], header: str, label) -> None:
    """One line per row of a fake-step file ``doc`` (rows whose ``name`` is in ``argv``, all when
    empty): ``label(row)`` (under ``header``), the graph's Dropout count, the tool's and the fake
    step's peak and the error; a row the tool cannot analyse prints its error and the rest go on."""
    print(f"fake steps: torch {doc['torch']}, transformers {doc['transformers']}")
    print(f"{header} {'drop':>4s} {'tool GB':>9s} {'fake GB':>9s} {'error':>7s}")
    for row in doc["runs"]:
        if argv and row["name"] not in argv:
            continue
        try:
            tool, dropouts = tool_peak(row)
        except Exception as exc:  # noqa: BLE001  a tool failure is a finding: print it, go on
            print(f"{label(row)} TOOL FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        fake = row["peak_alloc_bytes"]
        print(f"{label(row)} {dropouts:4d} {tool / 1e9:9.4f} {fake / 1e9:9.4f} {tool / fake - 1:+7.1%}", flush=True)


def main(argv: list[str]) -> None:
    print_comparison(json.loads(DATA.read_text()), argv,
                     f"{'fixture':28s} {'b':>2s} {'s':>5s} {'mode':4s} {'cache':5s} {'attn':6s}",
                     lambda r: f"{r['fixture']:28s} {r['b']:2d} {r['s']:5d} {r['mode']:4s} {str(r['use_cache']):5s} "
                               f"{r['attn_implementation']:6s}")

if __name__ == "__main__":
    main(sys.argv[1:])
