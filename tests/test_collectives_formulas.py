"""Every formula of shared/REFERENCES.md's collective table, reproduced exactly; the vectorised
path; non-powers of two; nccl-tests busbw factors; hierarchical models reducing to flat ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dml2comm.errors import ConfigError
from dml2comm.hardware import Link
from dml2comm.network import collectives as coll
from dml2comm.network.collectives import (
    Algorithm,
    busbw_factor,
    collective_cost,
    collective_time_vec,
    get_rule,
    kernel_bytes,
    registered_algorithms,
)
from dml2comm.network.kinds import CollectiveKind as K

A, B, G = 3e-6, 1 / 50e9, 1 / 400e9  # alpha (s), beta (s/B), gamma (s/B)
M = 96e6  # bytes
POW2 = [2, 4, 8, 16, 64, 1024]


def lg(n: int) -> float:
    return math.log2(n)


# (function, expected(n, M) as written in REFERENCES.md, how S relates to the table's M)
TABLE = [
    ("AllGather ring", coll.allgather_ring, lambda n: (n - 1) * A + (n - 1) / n * M * B, lambda n: M),
    ("AllGather recursive doubling", coll.allgather_recursive_doubling, lambda n: lg(n) * A + (n - 1) / n * M * B, lambda n: M),
    ("AllGather Bruck", coll.allgather_bruck, lambda n: lg(n) * A + (n - 1) / n * M * B, lambda n: M),
    ("ReduceScatter ring", coll.reducescatter_ring, lambda n: (n - 1) * A + (n - 1) / n * M * (B + G), lambda n: M),
    ("ReduceScatter pairwise", coll.reducescatter_pairwise, lambda n: (n - 1) * A + (n - 1) / n * M * (B + G), lambda n: M),
    ("ReduceScatter recursive halving", coll.reducescatter_recursive_halving,
     lambda n: lg(n) * A + (n - 1) / n * M * (B + G), lambda n: M),
    ("AllReduce ring", coll.allreduce_ring, lambda n: 2 * (n - 1) * A + 2 * (n - 1) / n * M * B + (n - 1) / n * M * G, lambda n: M),
    ("AllReduce recursive doubling", coll.allreduce_recursive_doubling, lambda n: lg(n) * A + lg(n) * M * (B + G), lambda n: M),
    ("AllReduce Rabenseifner", coll.allreduce_rabenseifner,
     lambda n: 2 * lg(n) * A + 2 * (n - 1) / n * M * B + (n - 1) / n * M * G, lambda n: M),
    ("Broadcast binomial tree", coll.broadcast_binomial_tree, lambda n: lg(n) * (A + M * B), lambda n: M),
    ("Broadcast scatter + allgather", coll.broadcast_scatter_allgather, lambda n: 2 * lg(n) * A + 2 * (n - 1) / n * M * B, lambda n: M),
    # AllToAll pairwise: the table's M is what a rank sends to others; nccl-tests S includes its own block.
    ("AllToAll pairwise", coll.alltoall_pairwise, lambda n: (n - 1) * A + M * B, lambda n: M * n / (n - 1)),
    # Bruck forwards half of the rank's whole buffer per step: M = S (see alltoall_bruck)
    ("AllToAll Bruck", coll.alltoall_bruck, lambda n: lg(n) * A + (M / 2) * lg(n) * B, lambda n: M),
]


@pytest.mark.parametrize("n", POW2)
@pytest.mark.parametrize(("name", "fn", "expected", "size"), TABLE, ids=[t[0] for t in TABLE])
def test_references_table_exactly(name: str, fn, expected, size, n: int) -> None:
    assert fn(n, size(n), A, B, G) == pytest.approx(expected(n), rel=1e-12), name


@pytest.mark.parametrize("n", POW2)
def test_hierarchical_allreduce_is_the_documented_composition(n: int) -> None:
    # REFERENCES.md: intra-node reduce-scatter, inter-node all-reduce of M/k, intra-node all-gather.
    a2, b2 = 14e-6, 1 / 24e9
    for k in (1, 2, n):
        if n % k:
            continue
        nodes = n // k
        expected = (
            (k - 1) * A + (k - 1) / k * M * (B + G)  # RS ring over k
            + (2 * (nodes - 1) * a2 + 2 * (nodes - 1) / nodes * (M / k) * b2 + (nodes - 1) / nodes * (M / k) * G if nodes > 1 else 0.0)
            + (k - 1) * A + (k - 1) / k * M * B  # AG ring over k
        )
        got = coll.allreduce_hierarchical(n, M, A, B, G, gpus_per_node=k, alpha_inter_s=a2, beta_inter_s_per_byte=b2)
        assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 64])
def test_hierarchical_models_reduce_to_flat_ones(n: int) -> None:
    a2, b2 = 14e-6, 1 / 24e9
    pairs = [
        (coll.allreduce_hierarchical, coll.allreduce_ring),
        (coll.allgather_hierarchical, coll.allgather_ring),
        (coll.reducescatter_hierarchical, coll.reducescatter_ring),
        (coll.broadcast_hierarchical, coll.broadcast_ring),
        (coll.reduce_hierarchical, coll.reduce_ring),
        (coll.alltoall_hierarchical, coll.alltoall_pairwise),
    ]
    for hier, flat in pairs:
        # one node: the flat algorithm on the intra-node link
        one_node = hier(n, M, A, B, G, gpus_per_node=n, alpha_inter_s=a2, beta_inter_s_per_byte=b2)
        assert one_node == pytest.approx(flat(n, M, A, B, G), rel=1e-12), hier.__name__
        # one rank per node: the flat algorithm on the inter-node link
        one_per_node = hier(n, M, A, B, G, gpus_per_node=1, alpha_inter_s=a2, beta_inter_s_per_byte=b2)
        assert one_per_node == pytest.approx(flat(n, M, a2, b2, G), rel=1e-12), hier.__name__


def test_non_powers_of_two() -> None:
    # n = 6: p = 4, log2 p = 2, e = 1 (two extra ranks hand their data over and get it back).
    n, p = 6, 4
    assert coll.allreduce_recursive_doubling(n, M, A, B, G) == pytest.approx((2 + 2) * (A + M * B) + (2 + 1) * M * G)
    assert coll.allreduce_rabenseifner(n, M, A, B, G) == pytest.approx(
        2 * 2 * A + 2 * (p - 1) / p * M * B + (p - 1) / p * M * G + 2 * A + 2 * M * B + M * G
    )
    assert coll.reducescatter_recursive_halving(n, M, A, B, G) == pytest.approx(
        (2 + 2) * A + ((p - 1) / p + 1 + 1 / n) * M * B + ((p - 1) / p + 1) * M * G
    )
    assert coll.allgather_recursive_doubling(n, M, A, B) == pytest.approx((2 + 2) * A + ((p - 1) / p + 1) * M * B)
    assert coll.allgather_bruck(n, M, A, B) == pytest.approx(3 * A + 5 / 6 * M * B)  # ceil(log2 6) = 3
    assert coll.allreduce_double_binary_tree(n, M, A, B, G) == pytest.approx(2 * 3 * A + 2 * M * B + M * G)
    assert coll.broadcast_binomial_tree(5, M, A, B) == pytest.approx(3 * (A + M * B))
    assert coll.reduce_rabenseifner(n, M, A, B, G) == pytest.approx(
        2 * 2 * A + 2 * (p - 1) / p * M * B + (p - 1) / p * M * G + A + M * (B + G)
    )
    # Rabenseifner keeps full bandwidth (2 x the pow-2 part + the hand-over), never below the ring bound
    for n in range(2, 70):
        assert coll.allreduce_rabenseifner(n, M, 0.0, B) >= 2 * (n - 1) / n * M * B * (1 - 1e-12)


def test_remaining_formulas() -> None:
    n = 8
    assert coll.allreduce_double_binary_tree(n, M, A, B, G) == pytest.approx(2 * 3 * A + 2 * M * B + M * G)
    assert coll.allreduce_in_network(n, M, A, B, G) == pytest.approx(2 * A + M * B)  # the switch reduces: no gamma
    assert coll.allgather_direct(n, M, A, B) == pytest.approx(A + 7 / 8 * M * B)
    assert coll.reducescatter_direct(n, M, A, B, G) == pytest.approx(A + 7 / 8 * M * (B + G))
    assert coll.alltoall_direct(n, M, A, B) == pytest.approx(A + 7 / 8 * M * B)
    assert coll.reduce_binomial_tree(n, M, A, B, G) == pytest.approx(3 * (A + M * (B + G)))
    assert coll.sendrecv_direct(n, M, A, B) == pytest.approx(A + M * B)


@pytest.mark.parametrize(("kind", "algorithm"), [(k, a) for k in K for a in registered_algorithms(k)])
def test_vectorised_path_equals_the_scalar_one(kind: K, algorithm: Algorithm) -> None:
    rule = get_rule(kind, algorithm)
    ns = np.array([1, 2, 3, 5, 8, 12, 16, 100, 1024])
    sizes = np.array([0.0, 1.0, 1e3, 1e6, 3e7, 1e9, 7.7e9, 1e10, 4e12])
    got = collective_time_vec(kind, algorithm, ns, sizes, A, B, G, base_latency_s=5e-6, kernel_s_per_byte=1e-12)
    for n, s, t in zip(ns, sizes, got):
        expected = rule.time_s(int(n), float(s), A, B, G) + (5e-6 + 1e-12 * kernel_bytes(kind, int(n), float(s)) if n > 1 else 0.0)
        assert t == pytest.approx(expected, rel=1e-12, abs=1e-18)
    # broadcasting: one n against many sizes
    grid = collective_time_vec(kind, algorithm, 8, np.logspace(0, 10, 11), A, B)
    assert grid.shape == (11,) and np.all(np.diff(grid) >= 0)


def test_vectorised_two_level_closed_form() -> None:
    t = collective_time_vec(K.ALL_REDUCE, Algorithm.HIERARCHICAL, np.array([16, 64]), 1e9, A, B,
                            gpus_per_node=8, alpha_inter_s=14e-6, beta_inter_s_per_byte=1 / 24e9)
    assert t[0] == pytest.approx(coll.allreduce_hierarchical(16, 1e9, A, B, gpus_per_node=8, alpha_inter_s=14e-6,
                                                             beta_inter_s_per_byte=1 / 24e9))


@pytest.mark.parametrize("kind", list(K))
def test_busbw_is_algbw_times_the_nccl_tests_factor(kind: K) -> None:
    link = Link("test", 100e9, 2e-6, 0.9, {"bandwidth_bytes_per_s": "test"})
    expected_factor = {K.ALL_REDUCE: 2 * 7 / 8, K.ALL_GATHER: 7 / 8, K.REDUCE_SCATTER: 7 / 8, K.ALL_TO_ALL: 7 / 8}.get(kind, 1.0)
    assert busbw_factor(kind, 8) == pytest.approx(expected_factor)
    for algorithm in registered_algorithms(kind):
        if algorithm is Algorithm.IN_NETWORK:
            continue
        cost = collective_cost(kind, 8, 1e8, link, algorithm=algorithm)
        assert cost.algbw_bytes_per_s == pytest.approx(1e8 / cost.time_s, rel=1e-12)
        assert cost.busbw_bytes_per_s == pytest.approx(cost.algbw_bytes_per_s * expected_factor, rel=1e-12)
        assert cost.steps == int(get_rule(kind, algorithm).steps(8)) and cost.formula.startswith(get_rule(kind, algorithm).formula)


def test_every_rule_documents_itself() -> None:
    for kind in K:
        for algorithm in registered_algorithms(kind):
            rule = get_rule(kind, algorithm)
            assert rule.formula and "References" in (rule.time_s.__doc__ or ""), rule.home
    with pytest.raises(ConfigError, match="add one with"):
        get_rule(K.SEND_RECV, Algorithm.RING)


def test_collective_cost_refuses_in_network_on_a_plain_link() -> None:
    plain = Link("plain", 100e9, 2e-6)
    with pytest.raises(ConfigError, match="switch that reduces"):
        collective_cost(K.ALL_REDUCE, 8, M, plain, algorithm=Algorithm.IN_NETWORK)
    nvls = Link("nvls", 100e9, 2e-6, in_network_efficiency=0.5)
    assert collective_cost(K.ALL_REDUCE, 8, M, nvls, algorithm=Algorithm.IN_NETWORK).time_s == pytest.approx(2 * 2e-6 + M / 50e9)


def test_kernel_term_of_a_calibrated_link() -> None:
    link = Link("nv", 300e9, 0.0, 1.0, {}, kernel_s_per_byte=2e-12)
    # AllReduce: K = S; AllGather: K = (S + S/n) / 2
    assert collective_cost(K.ALL_REDUCE, 8, M, link).time_s == pytest.approx(1.75 * M / 300e9 + 2e-12 * M)
    assert collective_cost(K.ALL_GATHER, 8, M, link).time_s == pytest.approx(7 / 8 * M / 300e9 + 2e-12 * (M + M / 8) / 2)
