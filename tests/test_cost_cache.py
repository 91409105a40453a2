"""The typed caches of :mod:`dml2comm.cost.cache`: keys are frozen dataclasses, values that depend on
the cluster never leak from one cluster to another."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.cache import CacheKey, LayersKey, NeedsGradKey, cached, derived
from dml2comm.hardware.cluster import get_cluster, make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig
from dml2comm.model import FastEvaluator


@dataclass(frozen=True, slots=True)
class _SizeKey(CacheKey):
    size: int


@dataclass(frozen=True, slots=True)
class _OtherSizeKey(CacheKey):
    size: int


def test_a_value_is_built_once_per_key_and_keys_of_two_classes_never_meet():
    store: dict[object, object] = {}
    calls: list[str] = []

    def build(tag: str):
        def make():
            calls.append(tag)
            return tag
        return make

    assert cached(store, _SizeKey(2), build("a")) == "a"
    assert cached(store, _SizeKey(2), build("again")) == "a"  # equal key: the stored value, no build
    assert cached(store, _SizeKey(3), build("b")) == "b"
    assert cached(store, _OtherSizeKey(2), build("c")) == "c"  # same fields, another quantity
    assert cached(store, LayersKey(), build("d")) == "d"
    assert cached(store, NeedsGradKey(), build("e")) == "e"  # two field-less keys are two entries too
    assert calls == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("key", [("layers",), "layers", 3])
def test_untyped_keys_are_refused(key):
    with pytest.raises(TypeError, match="CacheKey"):
        cached({}, key, lambda: None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=8, hidden=1024, heads=16, vocab=51200, seq_len=1024), path)
    return load_model(str(path), ImportOptions(batch_size=1))


@pytest.mark.parametrize("first", ["dgx-a100", "4-per-node"])
def test_one_import_on_two_clusters_gets_each_clusters_numbers(gpt, first):
    # two 32-GPU clusters of the same GPU (A100-SXM4-80GB) that differ only in their network:
    # DGX A100 nodes of 8 GPUs, and nodes of 4.  The fast path used to key its stage tables on
    # the graph and the GPU only, so the second cluster read the first one's send and
    # data-parallel times (issue 17: 61.375 ms by the analysis, 56.934 ms by the fast path).
    dgx = get_cluster("dgx-a100", 32)
    small = make_cluster(dgx.gpu.name, 32, gpus_per_node=4)
    clusters = {"dgx-a100": dgx, "4-per-node": small}
    order = [first] + [name for name in clusters if name != first]
    config = ParallelConfig(dp_size=4, tp_size=4, pp_size=2, global_batch_size=32, micro_batch_size=1)
    fast, full = {}, {}
    for name in order:
        fast[name] = FastEvaluator(gpt, clusters[name]).evaluate([config])[0]
        full[name] = analyze_graph(gpt, config, clusters[name], advise=False, timeline=False).summary
    for name in order:
        for k in ("iteration_time_s", "exposed_comm_time_s", "bubble_time_s", "peak_memory_bytes"):
            assert fast[name][k] == pytest.approx(full[name][k], rel=1e-9), (name, k)
    # 4-GPU nodes put the 4 data-parallel replicas and the 2 pipeline stages on other nodes: slower
    # (by little: this small model's step is mostly host time, dml2comm.cost.host)
    assert full["4-per-node"]["iteration_time_s"] > full["dgx-a100"]["iteration_time_s"] * 1.0005


def test_every_value_on_a_graph_is_under_a_typed_key(gpt):
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=2, global_batch_size=8, micro_batch_size=1, recompute="selective")
    cluster = get_cluster("dgx-a100", 8)
    analyze_graph(gpt, config, cluster, advise=False, timeline=False)
    FastEvaluator(gpt, cluster).evaluate([config])
    assert gpt.graph.derived and all(isinstance(k, CacheKey) for k in gpt.graph.derived)
    assert derived(gpt.graph, LayersKey(), lambda: None) is not None  # filled by the analysis


def test_shardings_of_one_graph_share_its_attention_cores_and_gradient_set(monkeypatch, tmp_path):
    """What every tensor-parallel sharding reads but no sharding changes (the attention cores, the
    tensors that need a gradient) is found once per graph, however many (t, SP) it is sharded by."""
    import dml2comm.cost.cache as cache
    import dml2comm.parallel.tensor as tensor

    calls = {"cores": 0, "grad": 0}
    find, needs = tensor.find_attention, tensor.requires_grad

    def counted_find(graph):
        calls["cores"] += 1
        return find(graph)

    def counted_needs(graph):
        calls["grad"] += 1
        return needs(graph)

    monkeypatch.setattr(cache, "find_attention_cores", counted_find)
    monkeypatch.setattr(tensor, "find_attention", counted_find)
    for module in (cache, tensor):
        monkeypatch.setattr(module, "requires_grad", counted_needs)
    zoo.save(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=128, seq_len=16), tmp_path / "gpt.onnx")
    graph = load_model(str(tmp_path / "gpt.onnx"), ImportOptions(batch_size=1)).graph
    plans = [cache.tensor_parallel_of(graph, t, sp, 2) for t in (2, 4) for sp in (False, True)]
    assert len({id(p) for p in plans}) == 4 and all(p.heads == 4 for p in plans)
    assert calls == {"cores": 1, "grad": 1}
