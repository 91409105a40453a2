"""Decoder-only transformers: GPT-2/Megatron GPT, Llama (GQA, SwiGLU, RoPE) and Mixtral MoE.

Each builder returns an ``onnx.ModelProto`` shaped like a PyTorch export of the Hugging Face
model of the same family (module names, class names and op decomposition as in
``transformers.models.gpt2/llama/mixtral``), with weights as never-written external data.

Inputs and outputs
------------------
``input_ids``: int64 ``[batch, seq_len]`` with ``dim_param "batch"``; output ``logits``
``[batch, seq_len, vocab]``.  Every other shape is static or carries ``batch`` through Reshape
targets of ``0`` ("copy this dim"), so ``onnx.shape_inference.infer_shapes`` infers all of them,
symbolically or once ``batch`` is bound.

Per-layer constants
-------------------
Each block computes its own causal mask (``ConstantOfShape`` + ``Trilu``) and, for Llama and
Mixtral, its own rotary tables (``Range`` -> ``Mul`` by ``inv_freq`` -> ``Cos``/``Sin``), in the
block's scope.  No rotary or mask table is an initializer, so none counts as a parameter, and
each block is self-contained when a pipeline cuts between blocks.  ``inv_freq`` (``head_dim/2``
floats) is a ``Constant`` node, like the non-persistent buffer it is in HF.

References
----------
Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2), 2019.
Narayanan et al., SC'21, arXiv:2104.04473, eq. (2) parameters and eq. (3) FLOPs.
Touvron et al., "Llama 2", arXiv:2307.09288; Ainslie et al., "GQA", arXiv:2305.13245;
Su et al., "RoFormer" (rotary embeddings), arXiv:2104.09864; Shazeer, "GLU Variants Improve
Transformer" (SwiGLU), arXiv:2002.05202.
Jiang et al., "Mixtral of Experts", arXiv:2401.04088; Zhou et al., "Mixture-of-Experts with
Expert Choice Routing", arXiv:2202.09368 (per-expert capacity ``k * n / e``).
"""

from __future__ import annotations

import math
from typing import Callable

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
    split_heads,
)

__all__ = ["build_gpt", "build_llama", "build_moe", "moe_capacity"]

_F32 = TensorProto.FLOAT

MlpFn = Callable[[GraphBuilder, str, str], str]
"""A block's MLP: ``(builder, residual, normed input) -> new residual``."""
_GPT2 = "transformers.models.gpt2.modeling_gpt2"
_LLAMA = "transformers.models.llama.modeling_llama"
_MIXTRAL = "transformers.models.mixtral.modeling_mixtral"
_EMBEDDING = "torch.nn.modules.sparse.Embedding"
_LAYER_NORM = "torch.nn.modules.normalization.LayerNorm"
_LINEAR = "torch.nn.modules.linear.Linear"
_CONV1D = "transformers.pytorch_utils.Conv1D"
_SILU = "torch.nn.modules.activation.SiLU"

GPT2_LN_EPS = 1e-5
"""GPT-2's ``layer_norm_epsilon`` (HF ``GPT2Config``)."""

LLAMA_RMS_EPS = 1e-5
"""Llama 2's ``rms_norm_eps`` (HF ``meta-llama/Llama-2-*-hf`` config.json)."""


# --------------------------------------------------------------------------------------------
# shared pieces
# --------------------------------------------------------------------------------------------


def _gelu_tanh(b: GraphBuilder, x: str) -> str:
    """GPT-2's ``NewGELUActivation``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Hendrycks & Gimpel, "Gaussian Error Linear Units", arXiv:1606.08415, eq. for the tanh
    approximation; decomposed into Mul/Pow/Add/Tanh as the legacy exporter emits it.
    """
    fx = b.fx("gelu", "aten.gelu.default")
    half = b.op("Mul", x, b.const(0.5), fx=fx)
    cube = b.op("Pow", x, b.const(3.0), fx=fx)
    inner = b.op("Add", x, b.op("Mul", cube, b.const(0.044715), fx=fx), fx=fx)
    inner = b.op("Mul", inner, b.const(math.sqrt(2.0 / math.pi)), fx=fx)
    t = b.op("Add", b.op("Tanh", inner, fx=fx), b.const(1.0), fx=fx)
    return b.op("Mul", half, t, fx=fx)


def _silu(b: GraphBuilder, x: str) -> str:
    """``nn.SiLU``: ``x * sigmoid(x)`` (Elfwing et al., arXiv:1702.03118)."""
    fx = b.fx("silu", "aten.silu.default")
    return b.op("Mul", x, b.op("Sigmoid", x, fx=fx), fx=fx)


def _rms_norm(b: GraphBuilder, x: str, width: int, eps: float) -> str:
    """``LlamaRMSNorm`` as exported: [Cast f32] Pow 2 -> ReduceMean -> Add eps -> Sqrt ->
    Reciprocal -> Mul -> [Cast back] -> Mul weight.

    Zhang & Sennrich, "Root Mean Square Layer Normalization", arXiv:1910.07467; HF computes the
    statistics in float32 whatever the model dtype.
    """
    w = b.weight("weight", (width,))
    h = x if b.dtype == _F32 else b.op("Cast", x, to=_F32)
    var = b.op("Pow", h, b.const(2.0, _F32))
    var = b.op("ReduceMean", var, b.const_i64([-1]), keepdims=1)
    var = b.op("Add", var, b.const(eps, _F32))
    inv = b.op("Reciprocal", b.op("Sqrt", var))
    h = b.op("Mul", h, inv)
    if b.dtype != _F32:
        h = b.op("Cast", h, to=b.dtype)
    return b.op("Mul", w, h)


def _swiglu_mlp(b: GraphBuilder, x: str, hidden: int, ffn: int, names: tuple[str, str, str]) -> str:
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))`` with bias-free projections.

    ``names`` are the (gate, up, down) submodule names: ``gate_proj, up_proj, down_proj`` in
    Llama, ``w1, w3, w2`` in Mixtral experts.
    """
    gate_name, up_name, down_name = names
    with b.scope(gate_name, _LINEAR):
        g = b.linear(x, hidden, ffn, bias=False)
    with b.scope("act_fn", _SILU):
        g = _silu(b, g)
    with b.scope(up_name, _LINEAR):
        u = b.linear(x, hidden, ffn, bias=False)
    y = b.op("Mul", g, u)
    with b.scope(down_name, _LINEAR):
        return b.linear(y, ffn, hidden, bias=False)


def _lm_head(b: GraphBuilder, x: str, hidden: int, vocab: int, tied_to: str | None) -> str:
    """``lm_head`` (``nn.Linear(hidden, vocab, bias=False)``) writing the ``logits`` output.

    Tied: MatMul with ``Transpose(token embedding)`` so the ``[V, h]`` table is one initializer
    and its parameters are counted once.  Untied: its own ``lm_head.weight`` ``[h, V]``.
    """
    with b.scope("lm_head", _LINEAR):
        fx = b.fx("linear", "aten.linear.default")
        if tied_to is None:
            w = b.weight("weight", (hidden, vocab))
        else:
            w = b.op("Transpose", tied_to, perm=[1, 0], fx=fx)
        return b.node("MatMul", [x, w], outputs=["logits"], fx=fx)[0]


def _io(b: GraphBuilder, seq_len: int, vocab: int) -> str:
    b.add_output("logits", b.dtype, ["batch", seq_len, vocab])
    return b.add_input("input_ids", TensorProto.INT64, ["batch", seq_len])


# --------------------------------------------------------------------------------------------
# GPT
# --------------------------------------------------------------------------------------------


def build_gpt(
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq_len: int,
    ffn_hidden: int | None = None,
    tied_embeddings: bool = True,
    final_norm: bool = True,
    max_positions: int | None = None,
    dropout: float = 0.1,
    dtype: str = "fp32",
    name: str = "gpt",
) -> onnx.ModelProto:
    """GPT-2 / Megatron GPT decoder with learned positions and a tied LM head.

    Parameters
    ----------
    layers, hidden, heads, vocab, seq_len:
        ``L``, ``h``, ``a``, ``V``, ``s`` of Narayanan et al. (head dim ``h / a``).
    ffn_hidden:
        MLP width; default ``4 h``.
    tied_embeddings:
        LM head = ``Transpose(transformer.wte.weight)`` (default) or its own ``lm_head.weight``.
    final_norm:
        Add ``transformer.ln_f`` before the head.
    max_positions:
        Rows of the position table ``transformer.wpe.weight``; default ``seq_len`` (eq. 2's
        ``s``).  GPT-2 checkpoints have 1024.
    dropout:
        Probability of the training-mode ``Dropout`` nodes a training step runs (embeddings,
        attention probabilities, both residual branches; GPT-2 and Megatron-LM default 0.1).
        Exports are inference graphs without them; their masks are part of the activation
        memory (Korthikanti et al. 2022, Sec. 4.1).  0 leaves them out.
    dtype:
        ``fp32``, ``fp16`` or ``bf16`` for weights and activations.
    name:
        Graph name and weights-file stem.

    Returns
    -------
    onnx.ModelProto
        With ``f = 4h``, tied head and no final norm, the parameter count is exactly eq. (2),
        ``12 L h^2 + 13 L h + (V + s) h``; ``final_norm`` adds ``2 h``.  Forward MatMul FLOPs
        per sample are ``L (24 s h^2 + 4 s^2 h) + 2 s h V`` (eq. 3 without the factor 4 for
        backward and recomputation).

    Raises
    ------
    ConfigError
        Non-positive sizes, ``heads`` not dividing ``hidden``, ``max_positions < seq_len``.

    References
    ----------
    Narayanan et al., SC'21, arXiv:2104.04473, eqs. (2) and (3); HF ``GPT2LMHeadModel``.
    """
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    positions = seq_len if max_positions is None else max_positions
    _check_gpt(layers, hidden, heads, vocab, seq_len, ffn, positions, tied_embeddings, final_norm, dropout, name)
    dt = resolve_dtype(dtype)
    config = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len, ffn_hidden=ffn,
                  tied_embeddings=tied_embeddings, final_norm=final_norm, max_positions=positions, dropout=dropout, dtype=dtype)
    b = GraphBuilder(name, f"{_GPT2}.GPT2LMHeadModel", dt)
    ids = _io(b, seq_len, vocab)

    with b.scope("transformer", f"{_GPT2}.GPT2Model"):
        wte, x = _gpt_embeddings(b, ids, vocab, hidden, positions, seq_len, dropout)
        for i in range(layers):
            with b.scope(f"h.{i}", f"{_GPT2}.GPT2Block"):
                x = _gpt_block(b, x, hidden, heads, ffn, seq_len, dropout)
        if final_norm:
            with b.scope("ln_f", _LAYER_NORM):
                x = b.layer_norm(x, hidden, GPT2_LN_EPS)

    _lm_head(b, x, hidden, vocab, wte if tied_embeddings else None)
    doc = (f"GPT decoder L={layers} h={hidden} a={heads} V={vocab} s={seq_len} f={ffn}; "
           "shape-only zoo model, weights are external data that is never written.")
    return b.model(doc, model_metadata("gpt", config))


def _check_gpt(layers: int, hidden: int, heads: int, vocab: int, seq_len: int, ffn: int, positions: int,
               tied_embeddings: bool, final_norm: bool, dropout: float, name: str) -> None:
    """Refuse what :func:`build_gpt` cannot build (see its Raises)."""
    check_positive(
        layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len,
        ffn_hidden=ffn, max_positions=positions,
    )
    check_divides("heads", heads, "hidden", hidden)
    check_flag(tied_embeddings=tied_embeddings, final_norm=final_norm)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout={dropout} must be in [0, 1); use 0.1 (GPT-2 default) or 0 for none")
    if positions < seq_len:
        raise ConfigError(
            f"max_positions={positions} is smaller than seq_len={seq_len}; "
            f"pass max_positions >= {seq_len} or leave it unset"
        )
    check_name(name)


def _gpt_embeddings(b: GraphBuilder, ids: str, vocab: int, hidden: int, positions: int, seq_len: int,
                    dropout: float) -> tuple[str, str]:
    """``wte`` + ``wpe`` and the embedding dropout.  Returns the token table (the tied head's
    weight) and the embedded tokens."""
    with b.scope("wte", _EMBEDDING):
        wte = b.weight("weight", (vocab, hidden))
        tok = b.op("Gather", wte, ids, axis=0)
    pos_ids = b.op(
        "Range", b.const_i64(0), b.const_i64(seq_len), b.const_i64(1)
    )
    with b.scope("wpe", _EMBEDDING):
        pos = b.op("Gather", b.weight("weight", (positions, hidden)), pos_ids, axis=0)
    return wte, b.dropout(b.op("Add", tok, pos), dropout)


def _gpt_attention(b: GraphBuilder, y: str, hidden: int, heads: int, seq_len: int, dropout: float) -> str:
    """``attn`` (GPT2Attention): fused QKV ``c_attn``, causal softmax with dropout, ``c_proj``, dropout."""
    head_dim = hidden // heads
    with b.scope("attn", f"{_GPT2}.GPT2Attention"):
        with b.scope("c_attn", _CONV1D):
            qkv = b.linear(y, hidden, 3 * hidden, bias=True)
        q, k, v = b.node("Split", [qkv], n_out=3, axis=2, num_outputs=3)
        scores, v = scaled_scores(b, q, k, v, heads, head_dim)
        mask = b.causal_mask(seq_len)
        scores = b.op("Where", mask, scores, b.const(b.finfo_min))
        probs = b.dropout(b.op("Softmax", scores, axis=-1), dropout)
        ctx = merge_heads(b, b.op("MatMul", probs, v), hidden)
        with b.scope("c_proj", _CONV1D):
            attn = b.linear(ctx, hidden, hidden, bias=True)
        return b.dropout(attn, dropout)


def _gpt_block(b: GraphBuilder, x: str, hidden: int, heads: int, ffn: int, seq_len: int, dropout: float) -> str:
    """One pre-LN ``h.{i}`` block: ln_1, attention, residual; ln_2, GELU MLP with dropout, residual."""
    with b.scope("ln_1", _LAYER_NORM):
        y = b.layer_norm(x, hidden, GPT2_LN_EPS)
    attn = _gpt_attention(b, y, hidden, heads, seq_len, dropout)
    x = b.op("Add", attn, x)
    with b.scope("ln_2", _LAYER_NORM):
        y = b.layer_norm(x, hidden, GPT2_LN_EPS)
    with b.scope("mlp", f"{_GPT2}.GPT2MLP"):
        with b.scope("c_fc", _CONV1D):
            y = b.linear(y, hidden, ffn, bias=True)
        with b.scope("act", "transformers.activations.NewGELUActivation"):
            y = _gelu_tanh(b, y)
        with b.scope("c_proj", _CONV1D):
            y = b.linear(y, ffn, hidden, bias=True)
        y = b.dropout(y, dropout)
    return b.op("Add", x, y)


# --------------------------------------------------------------------------------------------
# Llama and Mixtral
# --------------------------------------------------------------------------------------------


def _check_decoder(
    layers: int, hidden: int, heads: int, kv_heads: int, ffn_hidden: int, vocab: int,
    seq_len: int, rope_theta: float, name: str,
) -> None:
    check_positive(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        ffn_hidden=ffn_hidden, vocab=vocab, seq_len=seq_len,
    )
    check_divides("heads", heads, "hidden", hidden)
    check_divides("kv_heads", kv_heads, "heads", heads)
    if (hidden // heads) % 2:
        raise ConfigError(
            f"head_dim = hidden/heads = {hidden // heads} is odd; rotary embeddings rotate "
            "pairs of channels, so choose hidden and heads with an even hidden/heads"
        )
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or rope_theta <= 1:
        raise ConfigError(f"rope_theta={rope_theta!r} must be a number above 1 (Llama 2: 10000)")
    check_name(name)


def _rotary_tables(b: GraphBuilder, seq_len: int, head_dim: int, theta: float) -> tuple[str, str]:
    """``LlamaRotaryEmbedding``: cos and sin tables ``[s, head_dim]`` computed in float32.

    ``inv_freq[j] = theta^(-2j/d)``; ``freqs = positions x inv_freq``; ``emb = [freqs, freqs]``
    (Su et al., arXiv:2104.09864, eq. 34, in HF's half-split layout).
    """
    inv_freq = [theta ** (-(2.0 * j) / head_dim) for j in range(head_dim // 2)]
    t = b.op("Range", b.const(0.0, _F32), b.const(float(seq_len), _F32), b.const(1.0, _F32))
    t = b.op("Unsqueeze", t, b.const_i64([1]))
    freqs = b.op("Mul", t, b.const(inv_freq, _F32))
    emb = b.op("Concat", freqs, freqs, axis=-1)
    cos = b.op("Cos", emb)
    sin = b.op("Sin", emb)
    if b.dtype != _F32:
        cos = b.op("Cast", cos, to=b.dtype)
        sin = b.op("Cast", sin, to=b.dtype)
    return cos, sin


def _apply_rotary(b: GraphBuilder, x: str, cos: str, sin: str) -> str:
    """``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = [-x2, x1]``."""
    fx = b.fx("apply_rotary_pos_emb", "aten.add.Tensor")
    x1, x2 = b.node("Split", [x], n_out=2, axis=-1, num_outputs=2)
    rot = b.op("Concat", b.op("Neg", x2), x1, axis=-1)
    return b.op("Add", b.op("Mul", x, cos, fx=fx), b.op("Mul", rot, sin, fx=fx), fx=fx)


def _repeat_kv(
    b: GraphBuilder, x: str, kv_heads: int, heads: int, seq_len: int, head_dim: int
) -> str:
    """HF ``repeat_kv``: ``[b, kv, s, d] -> [b, kv, n_rep, s, d] -> [b, a, s, d]`` (GQA)."""
    n_rep = heads // kv_heads
    if n_rep == 1:
        return x
    x = b.op("Unsqueeze", x, b.const_i64([2]))
    x = b.op("Expand", x, b.const_i64([1, 1, n_rep, 1, 1]))
    return b.op("Reshape", x, b.const_i64([0, heads, seq_len, head_dim]))


def _llama_attention(
    b: GraphBuilder, y: str, hidden: int, heads: int, kv_heads: int, seq_len: int,
    theta: float, prefix: str,
) -> str:
    """``LlamaAttention`` (also Mixtral's): bias-free q/k/v/o, RoPE, GQA, causal softmax."""
    d = hidden // heads
    with b.scope("self_attn", f"{prefix}Attention"):
        with b.scope("q_proj", _LINEAR):
            q = b.linear(y, hidden, heads * d, bias=False)
        with b.scope("k_proj", _LINEAR):
            k = b.linear(y, hidden, kv_heads * d, bias=False)
        with b.scope("v_proj", _LINEAR):
            v = b.linear(y, hidden, kv_heads * d, bias=False)
        q = split_heads(b, q, b.const_i64([0, 0, heads, d]), [0, 2, 1, 3])
        kv_shape = b.const_i64([0, 0, kv_heads, d])
        k = split_heads(b, k, kv_shape, [0, 2, 1, 3])
        v = split_heads(b, v, kv_shape, [0, 2, 1, 3])
        with b.scope("rotary_emb", f"{prefix}RotaryEmbedding"):
            cos, sin = _rotary_tables(b, seq_len, d, theta)
        q = _apply_rotary(b, q, cos, sin)
        k = _apply_rotary(b, k, cos, sin)
        k = _repeat_kv(b, k, kv_heads, heads, seq_len, d)
        v = _repeat_kv(b, v, kv_heads, heads, seq_len, d)
        scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
        scores = b.op("Div", scores, b.const(math.sqrt(d)))
        scores = b.op("Where", b.causal_mask(seq_len), scores, b.const(b.finfo_min))
        if b.dtype == _F32:
            probs = b.op("Softmax", scores, axis=-1)
        else:  # HF: softmax(..., dtype=torch.float32).to(query.dtype)
            probs = b.op("Softmax", b.op("Cast", scores, to=_F32), axis=-1)
            probs = b.op("Cast", probs, to=b.dtype)
        ctx = merge_heads(b, b.op("MatMul", probs, v), heads * d)
        with b.scope("o_proj", _LINEAR):
            return b.linear(ctx, heads * d, hidden, bias=False)


def _llama_stack(
    b: GraphBuilder, ids: str, layers: int, hidden: int, heads: int, kv_heads: int,
    vocab: int, seq_len: int, theta: float, prefix: str, mlp: MlpFn,
) -> tuple[str, str]:
    """Embeddings, ``layers`` decoder blocks and the final RMSNorm under scope ``model``.

    Returns the final hidden state and the token-embedding initializer name.
    """
    with b.scope("model", f"{prefix}Model"):
        with b.scope("embed_tokens", _EMBEDDING):
            wte = b.weight("weight", (vocab, hidden))
            x = b.op("Gather", wte, ids, axis=0)
        for i in range(layers):
            with b.scope(f"layers.{i}", f"{prefix}DecoderLayer"):
                with b.scope("input_layernorm", f"{prefix}RMSNorm"):
                    y = _rms_norm(b, x, hidden, LLAMA_RMS_EPS)
                attn = _llama_attention(b, y, hidden, heads, kv_heads, seq_len, theta, prefix)
                x = b.op("Add", x, attn)
                with b.scope("post_attention_layernorm", f"{prefix}RMSNorm"):
                    y = _rms_norm(b, x, hidden, LLAMA_RMS_EPS)
                x = mlp(b, x, y)
        with b.scope("norm", f"{prefix}RMSNorm"):
            x = _rms_norm(b, x, hidden, LLAMA_RMS_EPS)
    return x, wte


class _DenseSwiGLU:
    """``LlamaMLP`` plus the residual Add that follows it in ``LlamaDecoderLayer``."""

    def __init__(self, hidden: int, ffn: int) -> None:
        self.hidden, self.ffn = hidden, ffn

    def __call__(self, b: GraphBuilder, x: str, y: str) -> str:
        with b.scope("mlp", f"{_LLAMA}.LlamaMLP"):
            y = _swiglu_mlp(b, y, self.hidden, self.ffn, ("gate_proj", "up_proj", "down_proj"))
        return b.op("Add", x, y)


def build_llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    vocab: int,
    seq_len: int,
    rope_theta: float = 10000.0,
    tied_embeddings: bool = False,
    dtype: str = "fp32",
    name: str = "llama",
) -> onnx.ModelProto:
    """Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, no biases.

    Parameters
    ----------
    layers, hidden, heads:
        ``L``, ``h``, query heads ``a`` (head dim ``d = h / a``, must be even for RoPE).
    kv_heads:
        Key/value heads (``a`` for MHA, 1 for MQA); ``k_proj``/``v_proj`` are ``[h, kv d]``.
    ffn_hidden:
        SwiGLU width ``f`` (gate and up ``[h, f]``, down ``[f, h]``).
    vocab, seq_len:
        ``V`` and ``s``.
    rope_theta:
        RoPE base (10000 in Llama 2, 500000 in Llama 3).
    tied_embeddings:
        Head = ``Transpose(model.embed_tokens.weight)`` instead of ``lm_head.weight [h, V]``.
    dtype, name:
        As in :func:`build_gpt`.

    Returns
    -------
    onnx.ModelProto
        Parameters ``L (2 h a d + 2 h kv d + 3 h f + 2 h) + V h (2 if untied) + h``.

    Raises
    ------
    ConfigError
        Non-positive sizes, ``heads`` not dividing ``hidden``, ``kv_heads`` not dividing
        ``heads``, odd head dim.

    References
    ----------
    Touvron et al., arXiv:2307.09288; Ainslie et al., arXiv:2305.13245; HF ``LlamaForCausalLM``.
    """
    _check_decoder(layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, rope_theta, name)
    check_flag(tied_embeddings=tied_embeddings)
    dt = resolve_dtype(dtype)
    config = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden,
        vocab=vocab, seq_len=seq_len, rope_theta=rope_theta, tied_embeddings=tied_embeddings,
        dtype=dtype,
    )
    b = GraphBuilder(name, f"{_LLAMA}.LlamaForCausalLM", dt)
    ids = _io(b, seq_len, vocab)
    x, wte = _llama_stack(
        b, ids, layers, hidden, heads, kv_heads, vocab, seq_len, float(rope_theta),
        f"{_LLAMA}.Llama", _DenseSwiGLU(hidden, ffn_hidden),
    )
    _lm_head(b, x, hidden, vocab, wte if tied_embeddings else None)
    doc = (
        f"Llama decoder L={layers} h={hidden} a={heads} kv={kv_heads} f={ffn_hidden} "
        f"V={vocab} s={seq_len}; shape-only zoo model, weights are external data never written."
    )
    return b.model(doc, model_metadata("llama", config))


def moe_capacity(seq_len: int, top_k: int, experts: int) -> int:
    """Tokens each expert processes per sequence: ``C = ceil(s k / E)`` (capacity factor 1).

    With top-``k`` routing every token is processed ``k`` times, so ``s k`` token-expert pairs
    share ``E`` experts; Zhou et al. (arXiv:2202.09368, Sec. 3.1) fix each expert's bucket at
    ``k n / e`` tokens.  Routing is per sequence, so ``C`` does not depend on the batch size.
    """
    return -(-seq_len * top_k // experts)


class _MoE:
    """``MixtralSparseMoeBlock`` with static shapes (expert-choice dispatch of ``C`` tokens).

    Router ``gate`` ``[h, E]`` -> Softmax over experts (float32, as HF) -> Transpose to
    ``[b, E, s]`` -> TopK(``C``) over tokens: each expert takes the ``C`` tokens that score it
    highest.  For expert ``j``: GatherElements picks its ``[b, C, h]`` tokens, the expert's
    SwiGLU (``experts.{j}.w1/w3/w2``) runs on them, the output is scaled by the router weight and
    ScatterElements(reduction="add") adds it into the residual stream.  Dispatch and combine ops
    live in the ``block_sparse_moe`` scope; only the expert MLP is in ``experts.{j}``.
    """

    def __init__(self, hidden: int, ffn: int, experts: int, capacity: int) -> None:
        self.hidden, self.ffn, self.experts, self.capacity = hidden, ffn, experts, capacity

    def __call__(self, b: GraphBuilder, x: str, y: str) -> str:
        h, e, c = self.hidden, self.experts, self.capacity
        with b.scope("block_sparse_moe", f"{_MIXTRAL}.MixtralSparseMoeBlock"):
            with b.scope("gate", _LINEAR):
                logits = b.linear(y, h, e, bias=False)
            if b.dtype != _F32:
                logits = b.op("Cast", logits, to=_F32)
            probs = b.op("Softmax", logits, axis=-1)
            probs = b.op("Transpose", probs, perm=[0, 2, 1])
            weights, index = b.node("TopK", [probs, b.const_i64([c])], n_out=2, axis=-1)
            if b.dtype != _F32:
                weights = b.op("Cast", weights, to=b.dtype)
            if e > 1:
                weight_parts = b.node("Split", [weights], n_out=e, axis=1, num_outputs=e)
                index_parts = b.node("Split", [index], n_out=e, axis=1, num_outputs=e)
            else:
                weight_parts, index_parts = [weights], [index]
            column = b.const_i64([0, c, 1])
            widen = b.const_i64([1, 1, h])
            for j in range(e):
                idx = b.op("Expand", b.op("Reshape", index_parts[j], column), widen)
                tokens = b.op("GatherElements", y, idx, axis=1)
                with b.scope(f"experts.{j}", f"{_MIXTRAL}.MixtralBlockSparseTop2MLP"):
                    out = _swiglu_mlp(b, tokens, h, self.ffn, ("w1", "w3", "w2"))
                out = b.op("Mul", out, b.op("Reshape", weight_parts[j], column))
                x = b.op("ScatterElements", x, idx, out, axis=1, reduction="add")
        return x


def build_moe(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    experts: int,
    top_k: int,
    vocab: int,
    seq_len: int,
    rope_theta: float = 1e6,
    dtype: str = "fp32",
    name: str = "moe",
) -> onnx.ModelProto:
    """Mixtral-style sparse MoE decoder: Llama attention + a router and ``experts`` SwiGLU MLPs.

    Expert FLOPs reflect routed tokens: each expert's MatMuls see ``C = ceil(s k / E)`` rows
    per sample (:func:`moe_capacity`), so all experts together do ``k`` dense MLPs' worth of
    work, not ``E``.  The routed outputs are scatter-added straight into the residual stream
    (equal to ``residual + sum of expert outputs``), so the block has no separate residual Add.

    Parameters
    ----------
    layers, hidden, heads, kv_heads, vocab, seq_len:
        As in :func:`build_llama`.
    ffn_hidden:
        Width of each expert's SwiGLU.
    experts, top_k:
        ``E`` experts, ``k`` of them per token (``1 <= k <= E``).
    rope_theta:
        RoPE base (Mixtral: 1e6).
    dtype, name:
        As in :func:`build_gpt`.

    Returns
    -------
    onnx.ModelProto
        Weights ``model.layers.{i}.block_sparse_moe.gate.weight [h, E]`` and
        ``model.layers.{i}.block_sparse_moe.experts.{j}.w1/w3.weight [h, f]``, ``w2 [f, h]``;
        expert nodes under ``/model/layers.{i}/block_sparse_moe/experts.{j}/``.

    Raises
    ------
    ConfigError
        As :func:`build_llama`, plus ``top_k > experts``.

    References
    ----------
    Jiang et al., arXiv:2401.04088; Zhou et al., arXiv:2202.09368; HF ``MixtralForCausalLM``.
    """
    _check_decoder(layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, rope_theta, name)
    check_positive(experts=experts, top_k=top_k)
    if top_k > experts:
        raise ConfigError(
            f"top_k={top_k} exceeds experts={experts}; a token cannot use more experts than "
            f"exist, pass top_k <= {experts}"
        )
    dt = resolve_dtype(dtype)
    capacity = moe_capacity(seq_len, top_k, experts)
    config = dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden,
        experts=experts, top_k=top_k, vocab=vocab, seq_len=seq_len, rope_theta=rope_theta,
        capacity=capacity, dtype=dtype,
    )
    b = GraphBuilder(name, f"{_MIXTRAL}.MixtralForCausalLM", dt)
    ids = _io(b, seq_len, vocab)
    x, _ = _llama_stack(
        b, ids, layers, hidden, heads, kv_heads, vocab, seq_len, float(rope_theta),
        f"{_MIXTRAL}.Mixtral", _MoE(hidden, ffn_hidden, experts, capacity),
    )
    _lm_head(b, x, hidden, vocab, None)
    doc = (
        f"Mixtral-style MoE L={layers} h={hidden} a={heads} kv={kv_heads} f={ffn_hidden} "
        f"E={experts} k={top_k} C={capacity} V={vocab} s={seq_len}; shape-only zoo model."
    )
    return b.model(doc, model_metadata("moe", config))
