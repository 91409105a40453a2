"""GPU presets, cluster presets, link choice and the (d, p, t) <-> rank mapping."""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import types

import pytest

from dml2comm.errors import ConfigError
from dml2comm.hardware import (
    CLUSTERS,
    GPU,
    GPU_ALIASES,
    GPUS,
    Cluster,
    Link,
    RankMap,
    cluster_names,
    get_cluster,
    get_gpu,
    gpu_names,
    make_cluster,
)
from dml2comm.hardware import cluster as cluster_mod

ORDERS = ["".join(p) for p in itertools.permutations("tdp")]


# ----------------------------------------------------------------------------- GPU presets


@pytest.mark.parametrize("gpu", list(GPUS.values()), ids=list(GPUS))
def test_every_gpu_number_has_a_source(gpu: GPU) -> None:
    assert gpu.unsourced_fields() == ()
    assert set(gpu.sources) == {f"peak_flops_per_s.{k}" for k in gpu.peak_flops_per_s} | {
        "hbm_bytes",
        "hbm_bytes_per_s",
        "nvlink_bytes_per_s",
        "pcie_bytes_per_s",
        "sm_count",
    } | ({"l2_bytes"} if gpu.l2_bytes else set()) | ({"kernel_bandwidth_share"} if gpu.kernel_bandwidth_share != 1.0 else set())
    assert gpu.sm_count > 0  # every preset knows its SMs/CUs (the GEMM model's wave quantisation)
    # every NVIDIA preset knows its L2 (the eager norm law's spill); MI300X has no one shared L2
    assert (gpu.l2_bytes > 0) == (gpu.name != "MI300X")
    assert all(len(s) > 20 for s in gpu.sources.values())


def test_presets_match_references_md() -> None:
    # shared/REFERENCES.md "GPU presets": dense 16-bit TFLOP/s, HBM GB, HBM TB/s, NVLink GB/s per direction.
    expected = {
        "a100": (312, 80, 2.0, 300),
        "h100": (989, 80, 3.35, 450),
        "h200": (989, 141, 4.8, 450),
        "v100": (125, 32, 0.9, 150),
    }
    for name, (tflops, hbm_gb, hbm_tbps, nvlink_gbps) in expected.items():
        gpu = get_gpu(name)
        key = "bf16" if "bf16" in gpu.peak_flops_per_s else "fp16"
        assert gpu.peak_flops(key) == pytest.approx(tflops * 1e12, rel=0.01)
        assert gpu.hbm_bytes == pytest.approx(hbm_gb * 1e9)
        assert gpu.hbm_bytes_per_s == pytest.approx(hbm_tbps * 1e12, rel=0.02)  # A100: 2.039 TB/s
        assert gpu.nvlink_bytes_per_s == pytest.approx(nvlink_gbps * 1e9)


def test_get_gpu_is_case_insensitive_and_knows_aliases() -> None:
    assert get_gpu("A100") is GPUS["A100-SXM4-80GB"]
    assert get_gpu("a100-40gb") is GPUS["A100-SXM4-40GB"]
    assert get_gpu(" H100_SXM ") is GPUS["H100-SXM5-80GB"]
    assert get_gpu("RTX A6000") is GPUS["RTX-A6000"]
    for canonical in GPUS:
        assert get_gpu(canonical) is GPUS[canonical]
        assert get_gpu(canonical.lower()) is GPUS[canonical]
    assert set(GPU_ALIASES.values()) == set(GPUS)


def test_unknown_gpu_error_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("b200")
    message = str(info.value)
    assert "'b200'" in message
    for name in gpu_names():
        assert name in message
    assert isinstance(info.value, ValueError)


def test_peak_flops_is_explicit_about_tf32() -> None:
    a100 = get_gpu("a100")
    assert a100.peak_flops("fp32") == 19.5e12  # CUDA cores (PyTorch default for float32 matmul)
    assert a100.peak_flops("float32", allow_tf32=True) == 156e12  # TF32 tensor cores
    assert a100.peak_flops("tf32") == 156e12
    assert a100.peak_flops("BFloat16") == 312e12
    assert get_gpu("h100").peak_flops("fp8") == 1978.9e12
    with pytest.raises(ConfigError, match="fp8"):
        a100.peak_flops("fp8")  # Ampere has no FP8 tensor cores


def test_peak_flops_errors_name_what_is_known() -> None:
    v100 = get_gpu("v100")
    with pytest.raises(ConfigError, match="known: fp32, fp16"):
        v100.peak_flops("bf16")
    with pytest.raises(ConfigError, match="allow_tf32=False"):
        v100.peak_flops("fp32", allow_tf32=True)
    with pytest.raises(ConfigError, match="unknown dtype"):
        v100.peak_flops("int4")


def test_gpu_is_immutable_hashable_and_validated() -> None:
    a100 = get_gpu("a100")
    with pytest.raises(TypeError):
        a100.peak_flops_per_s["bf16"] = 1.0  # type: ignore[index]
    assert hash(a100) == hash(get_gpu("A100-SXM4-80GB"))
    json.dumps(a100.to_dict())
    with pytest.raises(ConfigError, match="unknown peak-FLOP/s key"):
        GPU("x", {"int8": 1.0}, 1.0, 1.0, 0.0, 1.0, {})
    with pytest.raises(ConfigError, match="hbm_bytes_per_s"):
        GPU("x", {"fp32": 1.0}, 1.0, -1.0, 0.0, 1.0, {})


def test_presets_survive_pickle_and_deepcopy() -> None:
    cluster = get_cluster("dgx-h100", 16)
    assert pickle.loads(pickle.dumps(cluster)) == cluster
    assert copy.deepcopy(cluster) == cluster
    ranks = RankMap(2, 2, 2, order="dpt")
    assert pickle.loads(pickle.dumps(ranks)).rank(1, 1, 1) == ranks.rank(1, 1, 1)


def test_a6000_documents_its_nvlink_bridge_and_l40s_has_none() -> None:
    a6000 = get_gpu("a6000")
    assert a6000.nvlink_bytes_per_s == 56.25e9  # 112.5 GB/s bidirectional bridge, two GPUs only
    assert "2-way" in a6000.sources["nvlink_bytes_per_s"]
    assert get_gpu("l40s").nvlink_bytes_per_s == 0.0


# ----------------------------------------------------------------------------- links and clusters


def _preset_links() -> list[Link]:
    links = [v for v in vars(cluster_mod).values() if isinstance(v, Link)]
    for preset in CLUSTERS.values():
        built = preset.build()
        links += [built.intra_node, built.inter_node]
    return links


def test_every_link_number_has_a_source() -> None:
    links = _preset_links()
    assert len(links) >= 7
    for link in links:
        assert link.unsourced_fields() == (), link.name


def test_link_efficiencies_are_the_maintainers_figures() -> None:
    # NVLink runs at line rate; the kernel term delta brings the 8-GPU ring busbw to the expected figure.
    a100 = get_cluster("dgx-a100")
    assert a100.intra_node.effective_bytes_per_s == pytest.approx(300e9)
    assert a100.intra_node.expected_allreduce_busbw(8) == pytest.approx(230e9)  # sjeaugey, nccl-tests#149
    h100 = get_cluster("dgx-h100")
    assert h100.intra_node.expected_allreduce_busbw(8) == pytest.approx(370e9)  # nccl-tests#212
    # NVLS: t = S (beta_nvls + delta) per byte, efficiency 0.57 fitted to the measured H100 table
    # (benchmarks/fit_h100_collectives.py) -> busbw 1.75 / (1/(0.57 x 450e9) + 0.8408e-12) = 369.3 GB/s,
    # not the 480 GB/s quoted by the maintainers (the f32 table measures 402 GB/s at 2 GiB)
    nvls_s_per_byte = 1 / (450e9 * h100.intra_node.in_network_efficiency) + h100.intra_node.kernel_s_per_byte
    assert 1.75 / nvls_s_per_byte == pytest.approx(369.3e9, rel=1e-3)
    assert h100.inter_node.effective_bytes_per_s == pytest.approx(47e9)  # 46-48 of 50
    assert a100.inter_node.effective_bytes_per_s == pytest.approx(24e9)  # 24 of 25 per HDR NIC
    assert a100.intra_node.beta_s_per_byte == pytest.approx(1 / 300e9)
    assert a100.intra_node.kernel_s_per_byte == pytest.approx(1.75 * (1 / 230e9 - 1 / 300e9))
    assert a100.intra_node.latency_s == 3.4e-6 and a100.inter_node.latency_s == 14.0e-6
    # The same delta predicts the measured 1 GiB busbw at n = 2 and 4 (197.28 and 221.86 GB/s) within 3 %.
    assert a100.intra_node.expected_allreduce_busbw(2) == pytest.approx(197.28e9, rel=0.03)
    assert a100.intra_node.expected_allreduce_busbw(4) == pytest.approx(221.86e9, rel=0.03)


def test_v100_cube_mesh_matrix() -> None:
    v100 = get_cluster("dgx-v100")
    m = v100.nvlink_matrix
    assert v100.intra_topology == "hybrid-cube-mesh" and m == cluster_mod.DGX1_V100_NVLINK_MATRIX
    assert all(sum(row) == 6 for row in m)  # six NVLink2 links per V100
    assert all(m[i][j] == m[j][i] for i in range(8) for j in range(8))
    assert m[0][1] == 1 and m[0][3] == 2 and m[0][5] == 0  # NV1, NV2, SYS in nvidia-smi topo -m
    assert v100.intra_node.per_link_bytes_per_s == 25e9 and v100.intra_node.efficiency == 0.90
    assert dict(v100.sources)["nvlink_matrix"]
    # A smaller node keeps the top-left corner of the matrix.
    assert CLUSTERS["dgx-v100"].build(4, 4).nvlink_matrix == tuple(row[:4] for row in m[:4])
    with pytest.raises(ConfigError, match="too many"):
        CLUSTERS["dgx-v100"].build(16, 16)


def test_cluster_network_fields() -> None:
    a100 = get_cluster("dgx-a100", 16)
    assert a100.collective_library == "nccl" and a100.nics_per_node == 8
    assert a100.collective_overhead_s == cluster_mod.NCCL_CALL_OVERHEAD_S
    assert dict(a100.sources)["collective_overhead_s"]
    for preset in CLUSTERS.values():
        built = preset.build()
        assert built.collective_library == "nccl" and dict(built.sources).get("collective_overhead_s")
    block = a100.to_dict()["network"]
    assert block["collective_library"] == "nccl" and block["intra_topology"] == "switch"  # type: ignore[index]
    assert any("51.5 µs per call" in a for a in a100.assumptions)  # copied into data.json warnings
    custom = make_cluster("a100", 8, collective_library="textbook", collective_overhead_s=0.0)
    assert custom.collective_library == "textbook" and custom.collective_overhead_s == 0.0
    assert not any("per call" in a for a in custom.assumptions)
    assert make_cluster("v100", 16).intra_topology == "hybrid-cube-mesh"
    link = Link("x", 1e9, 1e-6)
    assert make_cluster("v100", 8, intra_node=link).intra_topology == "switch"  # a custom link has no matrix
    with pytest.raises(ConfigError, match="collective_library"):
        make_cluster("a100", 8, collective_library="mpi")
    with pytest.raises(ConfigError, match="nvlink_matrix"):
        Cluster(get_gpu("v100"), 2, 2, link, link, "t", "n", intra_topology="hybrid-cube-mesh", nvlink_matrix=((0, 1), (2, 0)))
    with pytest.raises(ConfigError, match="intra_topology"):
        Cluster(get_gpu("v100"), 2, 2, link, link, "t", "n", intra_topology="torus")
    with pytest.raises(ConfigError, match="overhead"):
        Cluster(get_gpu("v100"), 2, 2, link, link, "t", "n", collective_overhead_s=-1.0)


def test_new_link_fields_are_validated_and_sourced() -> None:
    with pytest.raises(ConfigError, match="kernel_s_per_byte"):
        Link("x", 1e9, 1e-6, kernel_s_per_byte=-1.0)
    with pytest.raises(ConfigError, match="hw"):
        Link("x", 1e9, 1e-6, hw="infiniband")
    with pytest.raises(ConfigError, match="links_per_gpu"):
        Link("x", 1e9, 1e-6, links_per_gpu=0)
    with pytest.raises(ConfigError, match="in_network_efficiency"):
        Link("x", 1e9, 1e-6, in_network_efficiency=1.5)
    sourced = {"bandwidth_bytes_per_s": "a", "latency_s": "b", "efficiency": "c"}
    assert Link("x", 1e9, 1e-6, 1.0, sourced, kernel_s_per_byte=1e-12).unsourced_fields() == ("kernel_s_per_byte",)
    link = get_cluster("dgx-h100").intra_node
    assert pickle.loads(pickle.dumps(link)) == link and hash(copy.deepcopy(link)) == hash(link)
    assert link.to_dict()["links_per_gpu"] == 18 and link.per_link_bytes_per_s == 25e9


def test_link_validation() -> None:
    with pytest.raises(ConfigError, match="efficiency"):
        Link("x", 1e9, 1e-6, efficiency=1.5)
    with pytest.raises(ConfigError, match="bandwidth"):
        Link("x", 0.0, 1e-6)
    with pytest.raises(ConfigError, match="latency"):
        Link("x", 1e9, -1.0)


def test_nic_share_per_gpu() -> None:
    # DGX A100: 8 x 25 GB/s NICs for 8 GPUs -> 25 GB/s each; DGX-1: 4 x 12.5 GB/s for 8 -> 6.25.
    assert get_cluster("dgx-a100").inter_node.bandwidth_bytes_per_s == 25e9
    assert get_cluster("dgx-v100").inter_node.bandwidth_bytes_per_s == 6.25e9
    assert get_cluster("pcie-a6000").inter_node.bandwidth_bytes_per_s == 25e9 / 8
    # Four GPUs per node keep one NIC each.
    assert make_cluster("a100", 16, 4).inter_node.bandwidth_bytes_per_s == 25e9


def test_cluster_presets_and_unknown_name() -> None:
    assert set(cluster_names()) >= {"dgx-a100", "dgx-h100", "hgx-h200", "dgx-v100", "pcie-a6000"}
    cluster = get_cluster("DGX-A100", 64)
    assert cluster.gpu is get_gpu("a100") and cluster.num_gpus == 64 and cluster.num_nodes == 8
    assert get_cluster("dgx-v100").gpu is get_gpu("v100")
    assert get_cluster("pcie-a6000").intra_node is cluster_mod.PCIE_GEN4_X16
    assert get_cluster("pcie-a6000").assumptions  # the NIC and PCIe limits are stated
    with pytest.raises(ConfigError) as info:
        get_cluster("dgx-b200")
    for name in cluster_names():
        assert name in str(info.value)


def test_node_of_and_link_for_group() -> None:
    cluster = get_cluster("dgx-a100", 16)
    assert [cluster.node_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    nvlink, nic = cluster.intra_node, cluster.inter_node
    assert cluster.link_for_group(range(8)) is nvlink
    assert cluster.link_for_group([9, 12]) is nvlink
    assert cluster.link_for_group([3]) is nvlink
    assert cluster.link_for_group([0, 8]) is nic
    assert cluster.link_for_group(range(16)) is nic
    with pytest.raises(ConfigError, match="outside"):
        cluster.node_of(16)
    with pytest.raises(ConfigError, match="outside"):
        cluster.link_for_group([0, 99])
    with pytest.raises(ConfigError, match="at least one rank"):
        cluster.link_for_group([])


def test_megatron_tensor_groups_stay_in_a_node() -> None:
    cluster = get_cluster("dgx-h100", 32)
    ranks = RankMap(dp=2, tp=8, pp=2)
    assert all(cluster.link_for_group(g) is cluster.intra_node for g in ranks.tp_groups())
    assert all(cluster.link_for_group(g) is cluster.inter_node for g in ranks.dp_groups())


def test_cluster_to_dict_has_the_data_json_fields() -> None:
    block = get_cluster("dgx-a100", 16).to_dict()
    assert {"gpu", "num_gpus", "gpus_per_node", "topology", "links"} <= set(block)
    assert block["gpu"] == "A100-SXM4-80GB" and block["num_gpus"] == 16
    assert set(block["links"]) == {"intra_node", "inter_node"}  # type: ignore[arg-type]
    json.dumps(block, sort_keys=True)


def test_make_cluster_defaults_and_overrides() -> None:
    a100 = make_cluster("a100", 16)
    assert a100.intra_node is cluster_mod.NVLINK3_NVSWITCH_A100 and a100.topology == "nvswitch/fat-tree"
    assert make_cluster("a100-40gb", 8).gpu is get_gpu("a100-40gb")
    assert make_cluster("l40s", 8).intra_node is cluster_mod.PCIE_GEN4_X16
    with pytest.raises(ConfigError, match="intra_node= and inter_node="):
        make_cluster("mi300x", 8)
    custom = Link("test link", 100e9, 1e-6, 0.5, {"bandwidth_bytes_per_s": "test"})
    mi300x = make_cluster("mi300x", 16, intra_node=custom, inter_node=cluster_mod.IB_NDR_400G, topology="xgmi/fat-tree")
    assert mi300x.intra_node is custom and mi300x.topology == "xgmi/fat-tree"
    with pytest.raises(ConfigError, match="num_gpus"):
        Cluster(get_gpu("a100"), 0, 8, custom, custom, "t", "n")


# ----------------------------------------------------------------------------- rank mapping


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 4, 2), (3, 2, 4)])
def test_rank_round_trip(dp: int, pp: int, tp: int, order: str) -> None:
    ranks = RankMap(dp=dp, tp=tp, pp=pp, order=order)
    seen = set()
    for d, p, t in itertools.product(range(dp), range(pp), range(tp)):
        r = ranks.rank(d, p, t)
        assert ranks.coords(r) == (d, p, t)
        seen.add(r)
    assert seen == set(range(dp * pp * tp)) == set(range(ranks.world_size))
    for r in range(ranks.world_size):
        assert ranks.rank(*ranks.coords(r)) == r


@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 4, 2), (3, 2, 4)])
def test_megatron_order_formula_and_contiguous_tensor_groups(dp: int, pp: int, tp: int) -> None:
    ranks = RankMap(dp=dp, tp=tp, pp=pp)
    assert ranks.order == "tdp"
    for d, p, t in itertools.product(range(dp), range(pp), range(tp)):
        assert ranks.rank(d, p, t) == t + tp * (d + dp * p)
    for d, p in itertools.product(range(dp), range(pp)):
        group = ranks.tp_group(d, p)
        assert group == tuple(range(group[0], group[0] + tp))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 4, 2), (3, 2, 4)])
def test_groups_partition_all_ranks(dp: int, pp: int, tp: int, order: str) -> None:
    ranks = RankMap(dp=dp, tp=tp, pp=pp, order=order)
    everyone = list(range(ranks.world_size))
    for groups, size, fixed in (
        (list(ranks.tp_groups()), tp, lambda c: (c[0], c[1])),  # same (d, p)
        (list(ranks.dp_groups()), dp, lambda c: (c[1], c[2])),  # same (p, t)
        (list(ranks.pp_groups()), pp, lambda c: (c[0], c[2])),  # same (d, t)
    ):
        assert sorted(r for g in groups for r in g) == everyone
        assert all(len(g) == size for g in groups)
        for g in groups:
            assert len({fixed(ranks.coords(r)) for r in g}) == 1
    d, p, t = ranks.coords(5)
    assert ranks.tp_group(d, p)[t] == ranks.dp_group(p, t)[d] == ranks.pp_group(d, t)[p] == 5


def test_group_generators_are_lazy() -> None:
    ranks = RankMap(dp=1024, tp=8, pp=16)
    assert isinstance(ranks.dp_groups(), types.GeneratorType)
    assert next(ranks.tp_groups()) == tuple(range(8))
    assert ranks.dp_group(15, 7)[-1] == ranks.world_size - 1


def test_rank_map_validation() -> None:
    with pytest.raises(ConfigError, match="permutation"):
        RankMap(2, 2, 2, order="tdd")
    with pytest.raises(ConfigError, match="permutation"):
        RankMap(2, 2, 2, order="tdpx")
    assert RankMap(2, 2, 2, order="PDT").order == "pdt"
    with pytest.raises(ConfigError, match="tp"):
        RankMap(dp=2, tp=0, pp=1)
    with pytest.raises(ConfigError, match="dp"):
        RankMap(dp=1.5, tp=1, pp=1)  # type: ignore[arg-type]
    ranks = RankMap(2, 2, 2)
    with pytest.raises(ConfigError, match="rank"):
        ranks.coords(8)
    with pytest.raises(ConfigError, match="d="):
        ranks.rank(2, 0, 0)


def test_nics_per_node_sets_the_inter_node_share_a_tensor_group_across_nodes_runs_on():
    """--nics-per-node (issue 18): a DGX A100 node has 8 x 200 Gb/s NICs (25 GB/s each); with 2 per
    node each GPU's share is 2 x 25 / 8 = 6.25 GB/s, and a 16-GPU tensor group spanning two nodes
    (8 GPUs a node, so 8 shares: the node's 2 NICs) takes longer on its inter-node phase."""
    from dml2comm.network.kinds import CollectiveKind
    from dml2comm.network.model import collective_cost_for_group

    eight = make_cluster("a100", 16, 8)
    two = make_cluster("a100", 16, 8, nics_per_node=2)
    assert two.nics_per_node == 2 and eight.nics_per_node == 8
    assert two.inter_node.bandwidth_bytes_per_s == pytest.approx(eight.inter_node.bandwidth_bytes_per_s / 4)
    size = 256 * 2**20
    t8 = collective_cost_for_group(eight, CollectiveKind.ALL_REDUCE, range(16), size).time_s
    t2 = collective_cost_for_group(two, CollectiveKind.ALL_REDUCE, range(16), size).time_s
    assert t2 > 2 * t8  # the inter-node phase dominates at 256 MiB and is 4x slower
    # a group inside one node does not see the NICs
    assert collective_cost_for_group(two, CollectiveKind.ALL_REDUCE, range(8), size).time_s == pytest.approx(
        collective_cost_for_group(eight, CollectiveKind.ALL_REDUCE, range(8), size).time_s)
    with pytest.raises(ConfigError, match="--nics-per-node must be a positive integer"):
        get_cluster("dgx-a100", 16, nics_per_node=0)


def test_nics_per_node_is_refused_where_it_cannot_be_honoured(tmp_path):
    # a cluster file's inter_node link is already the per-GPU share: nothing to split
    with pytest.raises(ConfigError, match="a cluster file gives its own per-GPU inter_node"):
        get_cluster(str(tmp_path / "c.yaml"), 8, nics_per_node=4)
    # a GPU without a node preset has no NIC to share
    with pytest.raises(ConfigError, match="--nics-per-node needs the NIC of a node preset"):
        make_cluster("a100", 16, 8, nics_per_node=4, inter_node=make_cluster("a100", 16, 8).inter_node)


def test_plan_cluster_is_what_the_hardware_flags_build():
    """One reading of --gpu/--cluster/--gpus-per-node/--nics-per-node for the main command, sweep and compare."""
    small = cluster_mod.plan_cluster(None, None, 4)  # a plan smaller than a node: one node of its GPUs
    assert (small.gpu.name, small.gpus_per_node, small.num_nodes) == (cluster_mod.get_gpu("a100").name, 4, 1)
    nodes = cluster_mod.plan_cluster("h100", None, 32, 8, nics_per_node=4)
    assert (nodes.gpu.name, nodes.gpus_per_node, nodes.num_nodes, nodes.nics_per_node) == (cluster_mod.get_gpu("h100").name, 8, 4, 4)
    preset = cluster_mod.plan_cluster("h100", "dgx-h100", 16)  # the preset's own GPU may be named
    assert preset.name == cluster_mod.get_cluster("dgx-h100", 16).name and preset.num_nodes == 2
    with pytest.raises(ConfigError, match="--gpu v100 conflicts with --cluster dgx-a100"):
        cluster_mod.plan_cluster("v100", "dgx-a100", 8)
