"""Topologies: construction and validation, how a group spreads over levels, hop counts, and the
per-pattern hop/link-sharing multipliers (hand-computed)."""

from __future__ import annotations

import pytest

from dml2comm.errors import ConfigError
from dml2comm.hardware import Link, get_cluster
from dml2comm.network.topology import (
    TOPOLOGY_NAMES,
    LevelKind,
    LevelUse,
    Pattern,
    cluster_topology,
    direct_path,
    make_topology,
    path,
    ring_path,
)

L = Link("l", 100e9, 5e-6, 1.0, {"bandwidth_bytes_per_s": "test"})


def _use(topo, i=0):
    return topo.uses()[i]


def test_every_name_builds() -> None:
    built = {}
    for name in TOPOLOGY_NAMES:
        kwargs = {"gpus_per_node": 4, "inter_link": L} if name == "hierarchical" else {}
        built[name] = make_topology(name, 16, L, **kwargs)
        assert built[name].num_ranks == 16
    assert [lv.size for lv in built["torus2d"].levels] == [4, 4]
    assert [lv.size for lv in built["torus3d"].levels] == [4, 2, 2]
    assert [lv.size for lv in built["fat-tree"].levels] == [8, 2]
    assert [lv.size for lv in built["tree"].levels] == [2, 2, 2, 2]
    assert built["mesh2d"].levels[0].kind is LevelKind.LINE
    assert make_topology("FAT_TREE", 16, L, radix=4).name == "fat-tree"


def test_bad_topologies_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="valid topologies: ring, tree, switch"):
        make_topology("hypercube", 8, L)
    with pytest.raises(ConfigError, match="multiply to 12, not n=16"):
        make_topology("torus2d", 16, L, dims=(4, 3))
    with pytest.raises(ConfigError, match="multiply to 8, not n=16"):
        make_topology("mesh2d", 16, L, dims=(4, 2))
    with pytest.raises(ConfigError, match="give 3 positive dimensions"):
        make_topology("torus3d", 16, L, dims=(4, 4))
    with pytest.raises(ConfigError, match="positive integer"):
        make_topology("ring", 0, L)
    with pytest.raises(ConfigError, match="multiple of"):
        make_topology("fat-tree", 12, L, radix=8)
    with pytest.raises(ConfigError, match="does not fit"):
        make_topology("fat-tree", 64, L, radix=4, levels=2)
    with pytest.raises(ConfigError, match="oversubscription"):
        make_topology("fat-tree", 8, L, oversubscription=0.5)
    with pytest.raises(ConfigError, match="needs a switch"):
        make_topology("ring", 8, L, in_network=True)
    with pytest.raises(ConfigError, match="gpus_per_node"):
        make_topology("hierarchical", 12, L, gpus_per_node=8, inter_link=L)
    for message in ("\n",):
        with pytest.raises(ConfigError) as info:
            make_topology("torus2d", 16, L, dims=(5, 5))
        assert message not in str(info.value)


def test_group_spread_and_hops() -> None:
    c = get_cluster("dgx-a100", 32)
    topo = cluster_topology(c)
    assert [(u.extent) for u in topo.uses([0, 1, 2, 3])] == [4, 1]  # inside one node
    assert [(u.extent) for u in topo.uses([0, 8, 16, 24])] == [1, 4]  # one GPU per node
    assert [(u.extent) for u in topo.uses(range(16))] == [8, 2]
    assert [(u.extent) for u in topo.uses([0, 1, 2, 8])] == [3, 2]  # uneven: the fullest node counts
    with pytest.raises(ConfigError, match="at least one rank"):
        topo.uses([])
    torus = make_topology("torus2d", 16, L, dims=(4, 4))
    assert torus.hops(0, 2) == 2 and torus.hops(0, 3) == 1 and torus.hops(0, 15) == 2  # wrap-around
    mesh = make_topology("mesh2d", 16, L, dims=(4, 4))
    assert mesh.hops(0, 3) == 3 and mesh.hops(0, 15) == 6
    assert topo.hops(0, 1) == 1 and topo.hops(0, 8) == 3  # GPU -> leaf -> GPU; via the fabric: 3 switch hops
    v100 = cluster_topology(get_cluster("dgx-v100"))
    assert v100.hops(0, 1) == 1 and v100.hops(0, 5) == 2  # SYS pair: relayed


def test_switch_and_fully_connected_paths_are_exact() -> None:
    sw = _use(make_topology("switch", 8, L))
    for pattern in Pattern:
        if pattern is not Pattern.IN_NETWORK:
            assert path(sw, pattern) == path(sw, Pattern.RING) and path(sw, pattern).beta_share == 1.0
    with pytest.raises(ConfigError, match="no in-network"):
        path(sw, Pattern.IN_NETWORK)
    fc = _use(make_topology("fully-connected", 8, L))
    assert path(fc, Pattern.RING).beta_share == pytest.approx(1 / 6)  # 6 edge-disjoint directed rings in K8
    assert path(fc, Pattern.ALL_CONCURRENT).beta_share == pytest.approx(1 / 7)  # one link to each peer
    assert path(fc, Pattern.LOG_EQUAL).beta_share == 1.0
    assert path(_use(make_topology("fully-connected", 7, L)), Pattern.RING).beta_share == pytest.approx(1 / 6)


def test_ring_and_line_paths_hand_computed() -> None:
    ring8 = _use(make_topology("ring", 8, L))
    assert path(ring8, Pattern.RING).beta_share == 0.5  # two counter-rotating rings
    # butterfly distances 1, 2, 4 on a ring of 8: hops 1, 2, 4 -> mean 7/3; recursive doubling pays 7 alphas
    assert path(ring8, Pattern.LOG_EQUAL).alpha_hops == pytest.approx(7 / 3)
    # halving, nearest partner gets the largest piece: 1/2 + 2/4 + 4/8 = 1.5 of S, over (7/8) S
    assert path(ring8, Pattern.LOG_GEOMETRIC).beta_share == pytest.approx(1.5 / (7 / 8))
    # pairwise shifts by 1..7: hops 1,2,3,4,3,2,1 -> mean 16/7
    assert path(ring8, Pattern.ALL_SEQUENTIAL).alpha_hops == pytest.approx(16 / 7)
    # all at once: bisection m/8 = 1 of S per directed link, over (7/8) S
    assert path(ring8, Pattern.ALL_CONCURRENT).beta_share == pytest.approx(1 / (7 / 8))
    line8 = _use(make_topology("mesh2d", 8, L, dims=(8, 1)))
    assert path(line8, Pattern.RING).alpha_hops == 2.0 and path(line8, Pattern.RING).beta_share == 1.0  # folded ring
    # middle link: 4 x 4 pairs x S/8 = 2 S per direction, over (7/8) S
    assert path(line8, Pattern.ALL_CONCURRENT).beta_share == pytest.approx(2 / (7 / 8))
    assert path(LevelUse(ring8.level, 1), Pattern.LOG_EQUAL).beta_share == 1.0


def test_oversubscribed_fat_tree_levels() -> None:
    ft = make_topology("fat-tree", 64, L, radix=4, oversubscription=2)
    assert [lv.size for lv in ft.levels] == [4, 4, 4]
    assert [lv.oversubscription for lv in ft.levels] == [1.0, 2.0, 4.0]
    assert [path(u, Pattern.LOG_EQUAL).beta_share for u in ft.uses()] == [1.0, 2.0, 4.0]
    # a flat ring crosses each subtree boundary once per ring: s_l rings share the uplinks -> not limited
    _, beta, _, limiting = ring_path(ft.uses())
    assert beta == pytest.approx(L.beta_s_per_byte) and limiting.level is ft.levels[0]


def test_cluster_ring_uses_one_nic_share_per_gpu_of_the_node() -> None:
    c = get_cluster("dgx-a100", 32)
    topo = cluster_topology(c)
    nic = c.inter_node
    for k in (1, 2, 4, 8):
        ranks = [node * 8 + i for node in range(4) for i in range(k)]
        alpha, beta, _, limiting = ring_path(topo.uses(ranks))
        # k rings leave each node through k NIC shares (the baseline used one share)
        assert beta == pytest.approx(max(c.intra_node.beta_s_per_byte if k > 1 else 0.0, nic.beta_s_per_byte / k))
        assert limiting.level.name.startswith("inter-node")
        n = 4 * k
        assert alpha == pytest.approx(((n - 4) * 3.4e-6 + 4 * 14e-6) / n)  # NCCL: intra and inter steps


def test_direct_path_over_nodes() -> None:
    c = get_cluster("dgx-a100", 16)
    alpha, beta, _, limiting = direct_path(cluster_topology(c).uses(range(16)))
    # 8 of 15 peers are on the other node: (8/16) S over the NIC share, 7/16 S over NVLink at once
    assert beta * 15 / 16 == pytest.approx(8 / 16 * c.inter_node.beta_s_per_byte)
    assert alpha == pytest.approx(14e-6) and limiting.level.name.startswith("inter-node")


def test_cube_mesh_links_of_a_subgroup() -> None:
    topo = cluster_topology(get_cluster("dgx-v100"))
    one_link = topo.levels[0].link.bandwidth_bytes_per_s
    assert one_link == 25e9 and topo.levels[0].kind is LevelKind.LINK_MATRIX
    pair01, pair03, pair05 = (topo.uses(g)[0] for g in ([0, 1], [0, 3], [0, 5]))
    assert path(pair01, Pattern.RING).beta_share == 1.0  # NV1
    assert path(pair03, Pattern.RING).beta_share == 0.5  # NV2
    assert path(pair05, Pattern.RING) .alpha_hops == 2.0  # SYS: through another GPU
    quad = topo.uses([0, 1, 2, 3])[0]
    assert path(quad, Pattern.RING).beta_share == pytest.approx(1 / 4)  # GPU 0 has 1 + 1 + 2 links in the quad
    assert path(topo.uses(range(8))[0], Pattern.RING).beta_share == pytest.approx(1 / 6)


def test_in_network_reduction_up_a_fat_tree() -> None:
    from dml2comm.network.topology import in_network_path

    ft = make_topology("fat-tree", 64, L, radix=4, oversubscription=8, in_network=True)
    alpha, beta, _, limiting = in_network_path(ft.uses())
    # tier l carries the reduced buffer once on s_l shares of link/o_l: max(1, 8/4, 64/16) = 4 x beta
    assert beta == pytest.approx(4 * L.beta_s_per_byte) and limiting.level is ft.levels[2]
    assert alpha == pytest.approx(3 * L.latency_s)  # up and down through three tiers: 2 a x 3
    with pytest.raises(ConfigError, match="no in-network"):
        in_network_path(make_topology("fat-tree", 16, L, radix=4).uses())


def test_torus_hierarchical_is_dimension_ordered_rings() -> None:
    from dml2comm.network.collectives import Algorithm
    from dml2comm.network.kinds import CollectiveKind
    from dml2comm.network.model import cost_on_topology

    torus = make_topology("torus2d", 64, L, dims=(8, 8))
    size = 1e9  # large enough that a ring is the best algorithm along each dimension
    flat = cost_on_topology(torus, CollectiveKind.ALL_REDUCE, size, algorithm=Algorithm.RING)
    dims = cost_on_topology(torus, CollectiveKind.ALL_REDUCE, size, algorithm=Algorithm.HIERARCHICAL)
    assert flat.steps == 2 * 63 and dims.steps == 7 + 2 * 7 + 7  # RS along x, AR along y, AG along x
    # RS over x on S, AR over y on S/8, AG over x; two counter-rotating rings per dimension (200 GB/s)
    one = 7 * L.latency_s + 7 / 8 * size / 200e9
    expected = 2 * one + (2 * 7 * L.latency_s + 2 * 7 / 8 * (size / 8) / 200e9)
    assert dims.time_s == pytest.approx(expected, rel=1e-12) and dims.time_s < flat.time_s
    # for small messages each dimension may pick another algorithm, never slower than its ring
    small = cost_on_topology(torus, CollectiveKind.ALL_REDUCE, 1e6, algorithm=Algorithm.HIERARCHICAL)
    one = 7 * L.latency_s + 7 / 8 * 1e6 / 200e9
    assert small.time_s <= 2 * one + (2 * 7 * L.latency_s + 2 * 7 / 8 * (1e6 / 8) / 200e9)
