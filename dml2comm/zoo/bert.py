"""BERT encoder with the masked-language-model head (HF ``BertForMaskedLM``).

Inputs: ``input_ids``, ``attention_mask`` and ``token_type_ids``, all int64 ``[batch, seq_len]``
(``dim_param "batch"``).  Output: ``logits`` ``[batch, seq_len, vocab]`` from the MLM head, whose
decoder is tied to the word embeddings (``Transpose(bert.embeddings.word_embeddings.weight)``,
plus its own bias ``cls.predictions.bias``).  With ``pooler=True`` the model also has
``bert.pooler`` and a second output ``pooler_output`` ``[batch, hidden]``.

The extended attention mask ``(1 - mask[:, None, None, :]) * finfo.min`` is computed once in the
``bert`` scope, as ``BertModel.get_extended_attention_mask`` does, and added to every layer's
scores.  Encoder blocks are post-LN; GELU is the exact Erf form.

References
----------
Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", NAACL 2019, arXiv:1810.04805 (Sec. 3, BERT-base/large shapes).
HF ``transformers.models.bert.modeling_bert`` (module names, LayerNorm eps 1e-12).
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

from dml2comm.errors import ConfigError
from dml2comm.zoo._builder import (
    GraphBuilder,
    check_divides,
    check_flag,
    check_name,
    check_positive,
    merge_heads,
    model_metadata,
    resolve_dtype,
    scaled_scores,
)

__all__ = ["build_bert"]

_BERT = "transformers.models.bert.modeling_bert"
_EMBEDDING = "torch.nn.modules.sparse.Embedding"
_LAYER_NORM = "torch.nn.modules.normalization.LayerNorm"
_LINEAR = "torch.nn.modules.linear.Linear"
_GELU = "transformers.activations.GELUActivation"

BERT_LN_EPS = 1e-12
"""``layer_norm_eps`` of the BERT checkpoints (HF ``BertConfig``)."""


def _gelu_erf(b: GraphBuilder, x: str) -> str:
    """Exact GELU ``0.5 x (1 + erf(x / sqrt 2))`` as exported: Div -> Erf -> Add -> Mul -> Mul.

    Hendrycks & Gimpel, arXiv:1606.08415.
    """
    fx = b.fx("gelu", "aten.gelu.default")
    e = b.op("Erf", b.op("Div", x, b.const(math.sqrt(2.0)), fx=fx), fx=fx)
    e = b.op("Add", e, b.const(1.0), fx=fx)
    return b.op("Mul", b.op("Mul", x, e, fx=fx), b.const(0.5), fx=fx)


def _dense(b: GraphBuilder, x: str, n_in: int, n_out: int) -> str:
    with b.scope("dense", _LINEAR):
        return b.linear(x, n_in, n_out, bias=True)


def build_bert(
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq_len: int,
    ffn_hidden: int | None = None,
    type_vocab: int = 2,
    max_positions: int | None = None,
    pooler: bool = False,
    dtype: str = "fp32",
    name: str = "bert",
) -> onnx.ModelProto:
    """BERT encoder + tied MLM head.

    Parameters
    ----------
    layers, hidden, heads, vocab, seq_len:
        ``L``, ``h``, ``a``, ``V``, ``s``.
    ffn_hidden:
        Intermediate width; default ``4 h``.
    type_vocab:
        Rows of ``token_type_embeddings`` (2 in the checkpoints).
    max_positions:
        Rows of ``position_embeddings``; default ``seq_len`` (the checkpoints have 512).
    pooler:
        Add ``bert.pooler`` (first token -> dense -> Tanh) and the ``pooler_output`` output.
    dtype, name:
        ``fp32``/``fp16``/``bf16``; graph name and weights-file stem.

    Returns
    -------
    onnx.ModelProto
        Parameters: embeddings ``(V + P + T) h + 2h``; per layer ``4 h^2 + 4 h`` (attention)
        ``+ 2 h f + f + h`` (MLP) ``+ 4 h`` (two LayerNorms); MLM head ``h^2 + h + 2 h + V``;
        pooler ``h^2 + h``.

    Raises
    ------
    ConfigError
        Non-positive sizes, ``heads`` not dividing ``hidden``, ``max_positions < seq_len``.

    References
    ----------
    Devlin et al., arXiv:1810.04805; HF ``BertForMaskedLM``.
    """
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    positions = seq_len if max_positions is None else max_positions
    _check_bert(layers, hidden, heads, vocab, seq_len, ffn, type_vocab, positions, pooler, name)
    dt = resolve_dtype(dtype)
    config = dict(
        layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len,
        ffn_hidden=ffn, type_vocab=type_vocab, max_positions=positions, pooler=pooler,
        dtype=dtype,
    )
    b = GraphBuilder(name, f"{_BERT}.BertForMaskedLM", dt)
    i64 = TensorProto.INT64
    ids = b.add_input("input_ids", i64, ["batch", seq_len])
    mask_in = b.add_input("attention_mask", i64, ["batch", seq_len])
    types = b.add_input("token_type_ids", i64, ["batch", seq_len])
    b.add_output("logits", dt, ["batch", seq_len, vocab])
    if pooler:
        b.add_output("pooler_output", dt, ["batch", hidden])

    with b.scope("bert", f"{_BERT}.BertModel"):
        ext = _extended_mask(b, mask_in, dt)
        wte, x = _embeddings(b, ids, types, vocab, hidden, type_vocab, positions, seq_len)
        with b.scope("encoder", f"{_BERT}.BertEncoder"):
            for i in range(layers):
                with b.scope(f"layer.{i}", f"{_BERT}.BertLayer"):
                    x = _layer(b, x, ext, hidden, heads, ffn)
        if pooler:
            _pooler(b, x, hidden)
    _mlm_head(b, x, wte, hidden, vocab)

    doc = (
        f"BERT encoder + MLM head L={layers} h={hidden} a={heads} V={vocab} s={seq_len} "
        f"f={ffn}; shape-only zoo model, weights are external data that is never written."
    )
    return b.model(doc, model_metadata("bert", config))


def _check_bert(layers: int, hidden: int, heads: int, vocab: int, seq_len: int, ffn: int, type_vocab: int,
                positions: int, pooler: bool, name: str) -> None:
    """Refuse sizes :func:`build_bert` cannot build (see its Raises)."""
    check_positive(
        layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len,
        ffn_hidden=ffn, type_vocab=type_vocab, max_positions=positions,
    )
    check_divides("heads", heads, "hidden", hidden)
    check_flag(pooler=pooler)
    if positions < seq_len:
        raise ConfigError(
            f"max_positions={positions} is smaller than seq_len={seq_len}; "
            f"pass max_positions >= {seq_len} or leave it unset"
        )
    check_name(name)


def _extended_mask(b: GraphBuilder, mask_in: str, dt: int) -> str:
    """get_extended_attention_mask: [b, s] -> [b, 1, 1, s], 0 where attended, min elsewhere."""
    ext = b.op("Unsqueeze", mask_in, b.const_i64([1, 2]))
    ext = b.op("Cast", ext, to=dt)
    ext = b.op("Sub", b.const(1.0), ext)
    return b.op("Mul", ext, b.const(b.finfo_min))


def _embeddings(b: GraphBuilder, ids: str, types: str, vocab: int, hidden: int, type_vocab: int, positions: int,
                seq_len: int) -> tuple[str, str]:
    """``bert.embeddings``: word + token type + position embeddings, then LayerNorm.  Returns the
    word embedding table (tied to the MLM decoder) and the embedded tokens."""
    with b.scope("embeddings", f"{_BERT}.BertEmbeddings"):
        with b.scope("word_embeddings", _EMBEDDING):
            wte = b.weight("weight", (vocab, hidden))
            x = b.op("Gather", wte, ids, axis=0)
        with b.scope("token_type_embeddings", _EMBEDDING):
            tt = b.op("Gather", b.weight("weight", (type_vocab, hidden)), types, axis=0)
        x = b.op("Add", x, tt)
        pos_ids = b.op("Range", b.const_i64(0), b.const_i64(seq_len), b.const_i64(1))
        with b.scope("position_embeddings", _EMBEDDING):
            pe = b.op("Gather", b.weight("weight", (positions, hidden)), pos_ids, axis=0)
        x = b.op("Add", x, pe)
        with b.scope("LayerNorm", _LAYER_NORM):
            x = b.layer_norm(x, hidden, BERT_LN_EPS)
    return wte, x


def _self_attention(b: GraphBuilder, x: str, ext: str, hidden: int, heads: int) -> str:
    """``attention.self``: Q, K, V projections, masked softmax(Q K^T / sqrt(d)) V, heads merged."""
    d = hidden // heads
    with b.scope("self", f"{_BERT}.BertSelfAttention"):
        with b.scope("query", _LINEAR):
            q = b.linear(x, hidden, hidden, bias=True)
        with b.scope("key", _LINEAR):
            k = b.linear(x, hidden, hidden, bias=True)
        with b.scope("value", _LINEAR):
            v = b.linear(x, hidden, hidden, bias=True)
        scores, v = scaled_scores(b, q, k, v, heads, d)
        scores = b.op("Add", scores, ext)
        probs = b.op("Softmax", scores, axis=-1)
        return merge_heads(b, b.op("MatMul", probs, v), hidden)


def _layer(b: GraphBuilder, x: str, ext: str, hidden: int, heads: int, ffn: int) -> str:
    """One ``encoder.layer.{i}`` (post-LN): attention + residual + LayerNorm, MLP + residual + LayerNorm."""
    with b.scope("attention", f"{_BERT}.BertAttention"):
        ctx = _self_attention(b, x, ext, hidden, heads)
        with b.scope("output", f"{_BERT}.BertSelfOutput"):
            y = _dense(b, ctx, hidden, hidden)
            y = b.op("Add", y, x)
            with b.scope("LayerNorm", _LAYER_NORM):
                x = b.layer_norm(y, hidden, BERT_LN_EPS)
    with b.scope("intermediate", f"{_BERT}.BertIntermediate"):
        y = _dense(b, x, hidden, ffn)
        with b.scope("intermediate_act_fn", _GELU):
            y = _gelu_erf(b, y)
    with b.scope("output", f"{_BERT}.BertOutput"):
        y = _dense(b, y, ffn, hidden)
        y = b.op("Add", y, x)
        with b.scope("LayerNorm", _LAYER_NORM):
            return b.layer_norm(y, hidden, BERT_LN_EPS)


def _pooler(b: GraphBuilder, x: str, hidden: int) -> None:
    """``bert.pooler``: the first token -> dense -> Tanh, written to the ``pooler_output`` output."""
    with b.scope("pooler", f"{_BERT}.BertPooler"):
        select = b.fx("select", "aten.select.int")
        first = b.op("Gather", x, b.const_i64(0), axis=1, fx=select)
        with b.scope("dense", _LINEAR):
            fx = b.fx("linear", "aten.linear.default")
            pooled = b.op("MatMul", first, b.weight("weight", (hidden, hidden)), fx=fx)
            pooled = b.op("Add", pooled, b.weight("bias", (hidden,)), fx=fx)
        with b.scope("activation", "torch.nn.modules.activation.Tanh"):
            b.node("Tanh", [pooled], outputs=["pooler_output"])


def _mlm_head(b: GraphBuilder, x: str, wte: str, hidden: int, vocab: int) -> None:
    """``cls.predictions``: dense + GELU + LayerNorm, then the decoder tied to the word embeddings,
    written to the ``logits`` output."""
    with b.scope("cls", f"{_BERT}.BertOnlyMLMHead"):
        with b.scope("predictions", f"{_BERT}.BertLMPredictionHead"):
            bias = b.weight("bias", (vocab,))
            with b.scope("transform", f"{_BERT}.BertPredictionHeadTransform"):
                y = _dense(b, x, hidden, hidden)
                with b.scope("transform_act_fn", _GELU):
                    y = _gelu_erf(b, y)
                with b.scope("LayerNorm", _LAYER_NORM):
                    y = b.layer_norm(y, hidden, BERT_LN_EPS)
            with b.scope("decoder", _LINEAR):
                fx = b.fx("linear", "aten.linear.default")
                w = b.op("Transpose", wte, perm=[1, 0], fx=fx)
                y = b.op("MatMul", y, w, fx=fx)
                b.node("Add", [y, bias], outputs=["logits"], fx=fx)
