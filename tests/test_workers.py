"""The sweep's worker processes (dml2comm.search.workers): dealing chunks with affinity, stealing
at the end, and failures reaching the parent."""

from __future__ import annotations

import os
import time

import pytest

from dml2comm.search.workers import deal, run_workers


def test_deal_keeps_affinity_groups_whole_and_balances_largest_first():
    work = [5, 1, 1, 4, 3, 3, 2, 2]
    affinity = ["a", "b", "b", "c", "d", "d", "e", "e"]
    lists = deal(work, affinity, 2)
    assert sorted(i for lst in lists for i in lst) == list(range(8))
    for key in set(affinity):
        owners = {k for k, lst in enumerate(lists) for i in lst if affinity[i] == key}
        assert len(owners) == 1, key
    # groups by work d 6, a 5, c 4, e 4, b 2, each to the least loaded: d->0, a->1, c->1, e->0, b->1
    loads = [sum(work[i] for i in lst) for lst in lists]
    assert sorted(loads) == [10, 11]
    assert lists[0][:2] == [4, 5]  # the largest group first, its chunks largest first


def test_deal_with_one_worker_is_everything():
    assert sorted(deal([1, 2, 3], [0, 1, 0], 1)[0]) == [0, 1, 2]


def _evaluate(k: int) -> list[dict]:
    if k == 0:
        time.sleep(0.5)  # worker 0's own list is slow: the other worker takes its remaining chunks
    return [{"chunk": k, "pid": os.getpid()}]


def test_every_chunk_once_and_idle_workers_take_the_rest():
    work = [10.0] + [1.0] * 9
    affinity = [0] * 5 + [1] * 5  # worker 0 gets chunks 0-4, worker 1 chunks 5-9
    got: list[dict] = []
    assert run_workers(work, affinity, 2, _evaluate, got.extend) is False
    assert sorted(r["chunk"] for r in got) == list(range(10))
    by_pid: dict[int, set[int]] = {}
    for r in got:
        by_pid.setdefault(r["pid"], set()).add(r["chunk"])
    assert len(by_pid) == 2
    stolen = [chunks for chunks in by_pid.values() if 0 not in chunks][0]
    assert stolen & {1, 2, 3, 4}  # worker 1 finished its list and took from worker 0's


def _fails(k: int) -> list[dict]:
    if k == 3:
        raise ValueError("chunk 3 is broken")
    return [{"chunk": k}]


def test_a_worker_exception_is_raised_in_the_parent():
    with pytest.raises(ValueError, match="chunk 3 is broken"):
        run_workers([1.0] * 6, list(range(6)), 2, _fails, lambda rows: None)


def _dies(k: int) -> list[dict]:
    if k == 1:
        os._exit(7)
    return [{"chunk": k}]


def test_a_worker_that_dies_is_reported():
    with pytest.raises(RuntimeError, match="exit code 7"):
        run_workers([1.0] * 4, list(range(4)), 2, _dies, lambda rows: None)


def test_interrupt_from_the_callback_keeps_what_arrived():
    got: list[dict] = []

    def on_rows(rows: list[dict]) -> None:
        got.extend(rows)
        if len(got) == 2:
            raise KeyboardInterrupt

    assert run_workers([1.0] * 8, list(range(8)), 2, lambda k: [{"chunk": k}], on_rows) is True
    assert len(got) == 2


def test_workers_fork_with_the_parents_objects_frozen():
    """The parent's objects are in the collector's permanent generation while the workers run
    (their collections leave those pages uncopied) and back in the collector's care after."""
    import gc

    assert gc.get_freeze_count() == 0
    rows: list[dict] = []
    run_workers([1.0, 1.0], [0, 1], 2, lambda i: [{"chunk": i, "frozen": gc.get_freeze_count()}], rows.extend)
    assert len(rows) == 2 and all(r["frozen"] > 0 for r in rows)
    assert gc.get_freeze_count() == 0
