"""Attention heads and the tensor-parallel plan of fused QKV projections whose head-splitting
views are not ``[.., n, d]`` of the query heads (real exports, both torch exporters):

- Falcon with multi-query attention: one projection ``128 -> 192`` viewed as ``[.., 4 + 2, 32]``
  (4 query heads, one K and one V head), K and V picked out with ``Slice`` (legacy) or
  ``GatherND`` (dynamo);
- BLOOM: ``128 -> 384`` viewed per head as ``[.., 4, 3, 32]`` and picked apart with ``Gather``;
- GPT-NeoX: ``128 -> 384`` viewed per head as ``[.., 4, 96]`` and sliced along the last axis.

A Reshape-based count reads the fused views as 6, 3 and 12 heads; the tool counts heads from
sizes (:func:`dml2comm.parallel.tensor._heads_by_size`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dml2comm.errors import ConfigError
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.parallel.tensor import attention_heads, shard_tensor_parallel

FIXTURES = Path(__file__).parent / "fixtures"
#: model -> (query heads, KV heads, blocks) as the transformers configs of export_models.py set them
HEADS = {"falcon_mqa": (4, 1, 2), "bloom": (4, 4, 2), "gpt_neox": (4, 4, 2)}
TIED = {"falcon_mqa", "bloom"}


def _graph(model: str, exporter: str):
    tie = model in TIED and exporter == "legacy"
    return load_model(FIXTURES / f"{model}_{exporter}.onnx", ImportOptions(batch_size=2, seq_len=16, tie_embeddings=tie)).graph


def _qkv_ops(graph) -> list[int]:
    """The fused projections (``query_key_value``): the Q projections of the attention cores,
    which here also produce K and V."""
    from dml2comm.parallel.tensor import find_attention

    return sorted({p for core in find_attention(graph) for p in core.q_projections})


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("model", sorted(HEADS))
def test_heads_are_counted_from_sizes(model, exporter):
    q, kv, _ = HEADS[model]
    assert attention_heads(_graph(model, exporter)) == (q, kv)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("model", sorted(HEADS))
def test_a_t_that_does_not_divide_the_heads_is_refused(model, exporter):
    with pytest.raises(ConfigError, match="does not divide the 4 attention heads"):
        shard_tensor_parallel(_graph(model, exporter), 3)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("model", ["bloom", "gpt_neox"])
@pytest.mark.parametrize("t", [2, 4])
def test_per_head_fused_qkv_is_column_parallel_by_heads(model, exporter, t):
    """Each rank holds whole heads of the fused projection (q, k and v of its heads side by
    side): nothing is replicated or gathered, and each block has Megatron's two forward
    all-reduces (after the attention output and the MLP's second projection; BLOOM) or one
    when the block adds the two partial sums before reducing (GPT-NeoX's parallel residual:
    tests/test_parallel_block.py); plus the embedding's."""
    g = _graph(model, exporter)
    plan = shard_tensor_parallel(g, t)
    assert not plan.warnings
    qkv = _qkv_ops(g)
    assert len(qkv) == HEADS[model][2]
    for at in qkv:
        assert plan.shards[at].rule.startswith("column-parallel"), (at, plan.shards[at].rule)
    kinds = Counter(c.kind for c in plan.comms)
    assert set(kinds) == {CollectiveKind.ALL_REDUCE}
    block_forward = [c for c in plan.comms if c.phase is Phase.FORWARD and "row-parallel output" in c.reason]
    per_block = {"bloom": 2, "gpt_neox": 1}[model]
    assert len(block_forward) == per_block * HEADS[model][2] + 1


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_multi_query_fused_qkv_is_replicated_for_any_t(exporter):
    """One K and one V head: no t > 1 splits them (Megatron-LM requires t to divide the query
    groups), so the fused projection stays whole on every rank, with the warning naming the heads,
    instead of splitting the [.., 6, 32] view as if it held 6 heads."""
    g = _graph("falcon_mqa", exporter)
    for t in (2, 4):
        plan = shard_tensor_parallel(g, t)
        for at in _qkv_ops(g):
            assert plan.shards[at].rule.startswith("replicated"), plan.shards[at].rule
        assert sum("does not divide its grouped-query KV heads (1 KV, 4 query heads)" in w for w in plan.warnings) == 2


def test_stages_with_different_head_counts_are_not_grouped_query():
    """Swin's stages hold 2, then 4 heads, each with as many KV heads: reported as 4 query / 4 KV
    heads, not 4 / 2 (which reads as grouped-query attention); a grouped-query core still
    reports its KV heads."""
    from dml2comm.parallel.tensor import AttentionCore, _heads_of

    def core(q, kv):
        return AttentionCore(0, 1, 32, q, kv, frozenset(), frozenset())

    assert _heads_of((core(2, 2), core(2, 2), core(4, 4), core(4, 4))) == (4, 4)
    assert _heads_of((core(8, 2), core(8, 2))) == (8, 2)
    assert _heads_of((core(4, 4), core(8, 2))) == (8, 2)
