"""Data integrity of ``benchmarks/data/fake_memory_fixtures.json`` (the FakeTensor training steps of
the decoder-only dynamo fixtures, written by ``benchmarks/fake_fixtures.py``): it parses, says how
it was made, names fixtures that exist, and each row's model is the fixture's model (its parameter
count is the one ``tests/fixtures/fixtures_expected.json`` recorded at export)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "fake_memory_fixtures.json"
FIXTURES = ROOT / "tests" / "fixtures"


def test_fake_fixture_steps_name_existing_fixtures_of_the_same_models():
    doc = json.loads(DATA.read_text())
    assert doc["how"].startswith("/work/fake-venv/bin/python benchmarks/fake_fixtures.py") and doc["torch"] and doc["transformers"]
    expected = json.loads((FIXTURES / "fixtures_expected.json").read_text())["models"]
    rows = doc["runs"]
    assert {r["name"] for r in rows} >= {"gemma_tiny", "gpt_neox", "falcon_mqa", "bloom", "cohere_tiny", "qwen3_init",
                                         "llama_gqa", "gpt2"}
    for row in rows:
        assert (FIXTURES / row["fixture"]).is_file(), row["fixture"]
        assert row["fixture"] == f"{row['name']}_dynamo.onnx"
        assert row["params"] == expected[row["name"]]["torch"]["parameter_count"], row["name"]
        assert row["mode"] in ("bf16", "amp") and row["b"] == row["micro_batch"] and row["s"] == row["seq"]
        assert row["hf_config"] and row["config_class"].endswith("Config")
        assert 0 < row["start_bytes"] < row["peak_alloc_bytes"] == max(row["phase_peak_bytes"].values())
        assert isinstance(row["use_cache"], bool)
    assert len({(r["name"], r["mode"], r["use_cache"]) for r in rows}) == len(rows)
