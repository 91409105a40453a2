"""dml2comm.gc_tuning: the collector's thresholds are raised inside the block and restored after,
also when the block raises (the CLI and the sweep run inside it); numpy's huge-page advice is off
inside small_pages and restored after (the sweep runs inside it)."""

from __future__ import annotations

import gc

import pytest

from dml2comm.gc_tuning import GC_THRESHOLDS, collect_rarely, small_pages


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


def _hugepage_switch():
    import numpy as np

    return np._core.multiarray._set_madvise_hugepage


def test_small_pages_turns_the_advice_off_inside_and_restores_it() -> None:
    switch = _hugepage_switch()
    before = switch(True)  # whatever the environment set, start from "on"
    try:
        with small_pages():
            assert switch(False) is False  # off inside (the switch returns the value it replaces)
        assert switch(True) is True  # on again after
        with pytest.raises(KeyError):
            with small_pages():
                raise KeyError("x")
        assert switch(True) is True
    finally:
        switch(before)


def test_a_sweep_runs_with_small_pages(tmp_path) -> None:
    """run_sweep evaluates inside small_pages: the advice is off while a configuration is evaluated."""
    import dataclasses

    from dml2comm import zoo
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.search.space import Constraints
    from dml2comm.search.sweep import SweepSpace, run_sweep

    path = tmp_path / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=128, seq_len=32), path)
    switch = _hugepage_switch()
    seen = []

    def on_result(row, done, total):
        seen.append(switch(False))

    before = switch(True)
    try:
        run_sweep(str(path), 2, lambda n: dataclasses.replace(get_cluster("dgx-a100", n), collective_overhead_s=0.0),
                  SweepSpace(global_batch_size=4, constraints=Constraints()), on_result=on_result, limit=2)
        assert seen and not any(seen)
        assert switch(True) is True
    finally:
        switch(before)
