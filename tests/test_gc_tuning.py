"""dml2comm.gc_tuning: the collector's thresholds are raised inside the block and restored after,
also when the block raises (the CLI and the sweep run inside it)."""

from __future__ import annotations

import gc

import pytest

from dml2comm.gc_tuning import GC_THRESHOLDS, collect_rarely


def test_thresholds_raised_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    with collect_rarely():
        assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_threshold() == before


def test_restored_when_the_block_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(KeyError):
        with collect_rarely():
            raise KeyError("x")
    assert gc.get_threshold() == before


def test_cli_restores_thresholds() -> None:
    from dml2comm.cli import main

    before = gc.get_threshold()
    main(["presets"])
    assert gc.get_threshold() == before


def test_sweep_chunks_and_runs_under_raised_thresholds(tmp_path, monkeypatch) -> None:
    """The sweep cuts its chunks with the raised thresholds too: at the default ones the
    chunking's objects run ten young collections, which bring on a middle-generation
    collection over the tables built after."""
    import dataclasses

    from dml2comm import zoo
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.search import sweep
    from dml2comm.search.space import Constraints

    path = tmp_path / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=128, seq_len=32), path)
    seen = []
    chunks = sweep._chunks

    def watched(configs):
        seen.append(gc.get_threshold())
        return chunks(configs)

    monkeypatch.setattr(sweep, "_chunks", watched)
    before = gc.get_threshold()
    space = sweep.SweepSpace(global_batch_size=4, constraints=Constraints(micro_batch_sizes=(1,), zero_stages=(0,),
                                                                          recompute=("none",)))
    result = sweep.run_sweep(str(path), 2, lambda n: dataclasses.replace(get_cluster("dgx-a100", n), collective_overhead_s=0.0),
                             space, limit=2)
    assert result.rows and seen == [GC_THRESHOLDS]
    assert gc.get_threshold() == before
