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
