"""What the zoo can build: kinds with their parameters, and named presets with sources.

``KINDS`` maps a kind name to a :class:`Kind`: its builder, a one-line help and its
:class:`Param` list (name, element type, default or :data:`REQUIRED`, help, ``many`` for list
parameters, ``choices``), enough to generate ``python main.py zoo KIND --param ...``.
``PRESETS`` maps a preset name to ``(kind, parameters)``; every shape cites where it comes from.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Final, Mapping

import onnx

from dml2comm.errors import ConfigError
from dml2comm.zoo._builder import DTYPES
from dml2comm.zoo.bert import build_bert
from dml2comm.zoo.decoders import build_gpt, build_llama, build_moe
from dml2comm.zoo.vision import RESNET_DEPTHS, build_mlp, build_resnet

__all__ = ["REQUIRED", "Param", "Kind", "KINDS", "PRESETS", "build", "build_preset"]


class _Required:
    """Sentinel type of :data:`REQUIRED`."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()
"""Default of a parameter that has none."""


@dataclass(frozen=True, slots=True)
class Param:
    """One builder parameter as a command-line option would present it.

    ``type`` is the element type (``int``, ``float``, ``bool``, ``str``); ``many`` marks a list
    of them (``hidden`` of the MLP; may be empty).  ``default`` is :data:`REQUIRED` when the
    parameter must be given; ``None`` defaults are explained in ``help``.
    """

    name: str
    type: type
    default: object
    help: str
    many: bool = False
    choices: tuple[object, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def flag(self) -> str:
        """Command-line spelling: ``--ffn-hidden``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Kind:
    """A model family the zoo builds."""

    name: str
    builder: Callable[..., onnx.ModelProto]
    help: str
    params: tuple[Param, ...]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


_DT = tuple(DTYPES)


_L = Param("layers", int, REQUIRED, "number of transformer blocks L")
_H = Param("hidden", int, REQUIRED, "hidden size h")
_A = Param("heads", int, REQUIRED, "attention heads a (must divide hidden)")
_KV = Param(
    "kv_heads", int, REQUIRED, "key/value heads for grouped-query attention (must divide heads)"
)
_V = Param("vocab", int, REQUIRED, "vocabulary size V")
_S = Param("seq_len", int, REQUIRED, "sequence length s (static second dim of input_ids)")
_F_REQ = Param("ffn_hidden", int, REQUIRED, "MLP (SwiGLU) width f")
_F_OPT = Param("ffn_hidden", int, None, "MLP width f (default 4 * hidden)")
_POS = Param("max_positions", int, None, "rows of the learned position table (default seq_len)")


def _dtype(choices: tuple[str, ...] = _DT) -> Param:
    return Param("dtype", str, "fp32", "element type of weights and activations", choices=choices)


def _name(default: str) -> Param:
    return Param("name", str, default, "graph name and stem of the (never written) weights file")


KINDS: Mapping[str, Kind] = MappingProxyType({
    "gpt": Kind("gpt", build_gpt, "GPT-2 / Megatron GPT decoder (Narayanan et al. eq. 2 and 3)", (
        _L, _H, _A, _V, _S, _F_OPT,
        Param("tied_embeddings", bool, True, "LM head reuses the token embedding (Transpose)"),
        Param("final_norm", bool, True, "final LayerNorm ln_f (adds 2h parameters to eq. 2)"),
        _POS,
        Param("dropout", float, 0.1, "training Dropout probability (0: no Dropout nodes)"),
        _dtype(), _name("gpt"),
    )),
    "llama": Kind("llama", build_llama, "Llama decoder: RMSNorm, RoPE, GQA, SwiGLU, no biases", (
        _L, _H, _A, _KV, _F_REQ, _V, _S,
        Param("rope_theta", float, 10000.0, "rotary embedding base (Llama 2: 1e4, Llama 3: 5e5)"),
        Param("tied_embeddings", bool, False, "LM head reuses the token embedding (Transpose)"),
        _dtype(), _name("llama"),
    )),
    "moe": Kind("moe", build_moe, "Mixtral-style sparse MoE decoder (routed tokens per expert)", (
        _L, _H, _A, _KV,
        Param("ffn_hidden", int, REQUIRED, "SwiGLU width f of each expert"),
        Param("experts", int, REQUIRED, "number of experts E"),
        Param("top_k", int, REQUIRED, "experts per token k (1 <= k <= E)"),
        _V, _S,
        Param("rope_theta", float, 1e6, "rotary embedding base (Mixtral: 1e6)"),
        _dtype(), _name("moe"),
    )),
    "bert": Kind("bert", build_bert, "BERT encoder with the tied masked-LM head", (
        _L, _H, _A, _V, _S, _F_OPT,
        Param("type_vocab", int, 2, "token type (segment) vocabulary"),
        _POS,
        Param("pooler", bool, False, "add the pooler and a pooler_output output"),
        _dtype(), _name("bert"),
    )),
    "resnet": Kind("resnet", build_resnet, "torchvision ResNet (BasicBlock / Bottleneck)", (
        Param("depth", int, 50, "ResNet depth", choices=tuple(RESNET_DEPTHS)),
        Param("num_classes", int, 1000, "classifier width"),
        Param("image_size", int, 224, "input height and width"),
        _dtype(("fp32", "fp16")), _name("resnet"),
    )),
    "mlp": Kind("mlp", build_mlp, "multi-layer perceptron (Gemm + Relu blocks)", (
        Param("in_features", int, REQUIRED, "input width"),
        Param("hidden", int, REQUIRED, "hidden layer widths (zero or more)", many=True),
        Param("out_features", int, REQUIRED, "output width"),
        _dtype(), _name("mlp"),
    )),
})
"""Every kind the zoo builds, with its parameters in builder-signature order."""


def _preset(kind: str, **params: object) -> tuple[str, Mapping[str, object]]:
    return (kind, MappingProxyType(params))


def _gpt(
    layers: int, hidden: int, heads: int, seq_len: int, vocab: int, name: str
) -> tuple[str, Mapping[str, object]]:
    return _preset(
        "gpt", layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len, name=name
    )


_LLAMA2_70B = _preset(
    "llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000,
    seq_len=4096, name="llama2-70b",
)


PRESETS: Mapping[str, tuple[str, Mapping[str, object]]] = MappingProxyType({
    # GPT-2: Radford et al. 2019, Table 2 (layers, d_model); HF gpt2* config.json: n_head,
    # n_positions 1024, vocab 50257.  gpt2-small with s=1024 has 124,439,808 parameters.
    "gpt2-small": _gpt(12, 768, 12, 1024, 50257, name="gpt2-small"),
    "gpt2-medium": _gpt(24, 1024, 16, 1024, 50257, name="gpt2-medium"),
    "gpt2-large": _gpt(36, 1280, 20, 1024, 50257, name="gpt2-large"),
    "gpt2-xl": _gpt(48, 1600, 25, 1024, 50257, name="gpt2-xl"),
    # GPT-3 175B: Brown et al. 2020 (arXiv:2005.14165) Table 2.1: 96 layers, d_model 12288,
    # 96 heads, context 2048; vocabulary 51200 (GPT-2 BPE padded) as in Narayanan et al. 2021.
    "gpt3-175b": _gpt(96, 12288, 96, 2048, 51200, name="gpt3-175b"),
    # Narayanan et al. SC'21 (arXiv:2104.04473) Table 1, the ten weak-scaling GPT models
    # (data/narayanan2021_table1.json): s = 2048, V = 51200, f = 4h.
    "megatron-1.7b": _gpt(24, 2304, 24, 2048, 51200, name="megatron-1.7b"),
    "megatron-3.6b": _gpt(30, 3072, 32, 2048, 51200, name="megatron-3.6b"),
    "megatron-7.5b": _gpt(36, 4096, 32, 2048, 51200, name="megatron-7.5b"),
    "megatron-18.4b": _gpt(40, 6144, 48, 2048, 51200, name="megatron-18.4b"),
    "megatron-39.1b": _gpt(48, 8192, 64, 2048, 51200, name="megatron-39.1b"),
    "megatron-76.1b": _gpt(60, 10240, 80, 2048, 51200, name="megatron-76.1b"),
    "megatron-145.6b": _gpt(80, 12288, 96, 2048, 51200, name="megatron-145.6b"),
    "megatron-310.1b": _gpt(96, 16384, 128, 2048, 51200, name="megatron-310.1b"),
    "megatron-529.6b": _gpt(105, 20480, 128, 2048, 51200, name="megatron-529.6b"),
    "megatron-1008b": _gpt(128, 25600, 160, 2048, 51200, name="megatron-1008b"),
    # Llama 2: Touvron et al. 2023 (arXiv:2307.09288) Table 1 (context 4096, GQA for 70B) and
    # HF meta-llama/Llama-2-*-hf config.json (hidden, heads, kv heads, intermediate, vocab 32000).
    "llama2-7b": _preset(
        "llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000,
        seq_len=4096, name="llama2-7b",
    ),
    "llama2-13b": _preset(
        "llama", layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=13824, vocab=32000,
        seq_len=4096, name="llama2-13b",
    ),
    "llama2-70b": _LLAMA2_70B,
    "llama-70b": _LLAMA2_70B,
    # Llama 3 8B: Dubey et al. 2024 (arXiv:2407.21783) Table 3 (32 layers, model dim 4096,
    # FFN 14336, 32 heads, 8 KV heads, RoPE base 500000, 128K vocabulary: 128000 tokens + 256
    # reserved special tokens = 128256 in the HF config); 8192 is its pre-training context.
    "llama3-8b": _preset(
        "llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
        seq_len=8192, rope_theta=500000.0, name="llama3-8b",
    ),
    # Mixtral 8x7B: Jiang et al. 2024 (arXiv:2401.04088) Table 1 (dim 4096, 32 layers, 32 heads,
    # 8 KV heads, hidden_dim 14336, vocab 32000, 8 experts, top-2); rope_theta 1e6 from the HF
    # mistralai/Mixtral-8x7B-v0.1 config.  The paper's context is 32768; the preset trains at
    # 4096 like Llama 2 (override seq_len).
    "mixtral-8x7b": _preset(
        "moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, experts=8,
        top_k=2, vocab=32000, seq_len=4096, rope_theta=1e6, name="mixtral-8x7b",
    ),
    # BERT: Devlin et al. 2019 (arXiv:1810.04805) Sec. 3 (base L12 H768 A12, large L24 H1024
    # A16, positions up to 512); HF bert-base-uncased config.json: vocab 30522, 2 token types.
    "bert-base": _preset(
        "bert", layers=12, hidden=768, heads=12, vocab=30522, seq_len=512, name="bert-base"
    ),
    "bert-large": _preset(
        "bert", layers=24, hidden=1024, heads=16, vocab=30522, seq_len=512, name="bert-large"
    ),
    # ResNets: He et al. 2016 (arXiv:1512.03385) Table 1; torchvision, ImageNet 224 x 224.
    "resnet18": _preset("resnet", depth=18, name="resnet18"),
    "resnet34": _preset("resnet", depth=34, name="resnet34"),
    "resnet50": _preset("resnet", depth=50, name="resnet50"),
    "resnet101": _preset("resnet", depth=101, name="resnet101"),
    "resnet152": _preset("resnet", depth=152, name="resnet152"),
})
"""Named shapes: ``name -> (kind, parameters)``; ``llama-70b`` is the ``llama2-70b`` entry."""


def build(kind: str, **kwargs: object) -> onnx.ModelProto:
    """Build a zoo model of ``kind`` (a key of :data:`KINDS`) from keyword parameters.

    Raises
    ------
    ConfigError
        Unknown kind, unknown or missing parameter, or a value the builder rejects.
    """
    spec = KINDS.get(kind)
    if spec is None:
        raise ConfigError(f"unknown zoo kind {kind!r}; choose one of {', '.join(KINDS)}")
    known = {p.name for p in spec.params}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(
            f"zoo kind {kind!r} has no parameter {unknown[0]!r}; its parameters are "
            f"{', '.join(p.name for p in spec.params)}"
        )
    missing = [p.name for p in spec.params if p.required and p.name not in kwargs]
    if missing:
        raise ConfigError(
            f"zoo kind {kind!r} needs {', '.join(missing)}; pass "
            f"{' '.join(KINDS[kind].param(m).flag + ' N' for m in missing)}"
        )
    for p in spec.params:
        if p.choices is not None and p.name in kwargs and kwargs[p.name] not in p.choices:
            raise ConfigError(
                f"{p.name}={kwargs[p.name]!r} is not supported by zoo kind {kind!r}; choose one "
                f"of {', '.join(map(str, p.choices))}"
            )
        if p.name in kwargs:
            _check_size(p, kwargs[p.name])
    return spec.builder(**kwargs)


#: The largest value of a zoo size (a width, vocabulary, sequence or image size: 4,194,304, 160
#: times today's widest layer and 16 times the largest vocabularies), and of the sizes that
#: multiply the graph's nodes: 10,000 blocks (the deepest models have about 200), 4,096 experts
#: (DeepSeek-V3 has 256).  Beyond them a build fills memory or runs for hours (a 10**12-layer GPT).
MAX_ZOO_SIZE = 2**22
MAX_ZOO_COUNTS = {"layers": 10_000, "experts": 4_096}


def _check_size(p: Param, value: object) -> None:
    """Refuse a size beyond :data:`MAX_ZOO_SIZE` (or :data:`MAX_ZOO_COUNTS`) and a float that is
    not finite (``--rope-theta nan``)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{p.flag} must be a finite number, got {v!r}")
        limit = MAX_ZOO_COUNTS.get(p.name, MAX_ZOO_SIZE)
        if isinstance(v, int) and not isinstance(v, bool) and v > limit:
            raise ConfigError(f"{p.flag} {v:,} is beyond the {limit:,} the zoo builds (far beyond any real model); "
                              f"use at most {limit:,}")


def build_preset(name: str, **overrides: object) -> onnx.ModelProto:
    """Build preset ``name`` (a key of :data:`PRESETS`) with some parameters overridden.

    Raises
    ------
    ConfigError
        Unknown preset, or an override the kind rejects.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown zoo preset {name!r}; choose one of {', '.join(PRESETS)}")
    kind, params = PRESETS[name]
    return build(kind, **{**params, **overrides})
