"""The analysis is linear in the number of ops (issue 36, item 6).

Chains of unscoped ops (``benchmarks/bench_chain.py``'s generator, which prints the timings)
exposed quadratic loops: in the structure-based layer grouping (a weightless run rescanned from
its start, every start's repeated run re-compared) and in the fused regions' saved inputs (one
walk back per tensor).  A 4,000-op chain took 33 s and 20,000 ops over 4 minutes.  No time is
asserted: the test counts the Python function calls the analysis makes (the same for the same
input on any machine) and checks that doubling the ops does not triple them (linear work gives
about 2x; the quadratic loops gave over 3x at these sizes).
"""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path

import onnx
import pytest

from dml2comm.cli import main
from dml2comm.ir.layers import _find_repeats
from tests.helpers import benchmark

bench_chain = benchmark("bench_chain")


def analysis_calls(tmp_path: Path, capsys, num_ops: int, shape: str) -> int:
    """Function calls of one analysis of a chain of ``num_ops`` ops (imports already done)."""
    path = tmp_path / f"{shape}{num_ops}.onnx"
    onnx.save(bench_chain.chain_model(num_ops, shape), path)
    profile = cProfile.Profile()
    code = profile.runcall(main, [str(path), "--no-site", "--no-advice", "--out", str(tmp_path / f"out{num_ops}")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return pstats.Stats(profile).total_calls


@pytest.mark.parametrize("shape", bench_chain.SHAPES)
def test_doubling_the_ops_at_most_doubles_the_work(tmp_path, capsys, shape):
    analysis_calls(tmp_path, capsys, 200, shape)  # first-call imports and caches
    small = analysis_calls(tmp_path, capsys, 1500, shape)
    large = analysis_calls(tmp_path, capsys, 3000, shape)
    assert large / small < 2.6, f"{shape} chain: 1,500 ops {small:,} calls, 3,000 ops {large:,} calls"


class Counted:
    """A segment signature that counts its comparisons (equal to every other Counted)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return isinstance(other, Counted)

    __hash__ = object.__hash__


def test_repeated_unit_search_compares_linearly():
    # n equal segments: every start repeats to the end; comparing each start's run again was
    # n^2 / 2 comparisons per period
    for n in (1000, 2000):
        Counted.compared = 0
        assert _find_repeats([(Counted(),) for _ in range(n)]) == (0, 1, n)
        assert Counted.compared <= 6 * n, (n, Counted.compared)  # one per segment and period (1-6)
