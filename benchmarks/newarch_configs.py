"""Tiny configs of decoder-only causal LMs that have no ONNX fixture (``tests/fixtures``): the
architectures ``benchmarks/newarch_export.py`` exports (dynamo, to a scratch folder outside the
repo) and ``benchmarks/fake_newarch.py`` counts with FakeTensor.  One table, read by both, so the
exported model and the counted one share a config.  No torch here (transformers only, lazily).

Each config: 2 layers, hidden 64 or 128, vocab 1000, ``max_position_embeddings`` 512 (the step's
sequence), ``use_cache=False``; attention is left to transformers' default (SDPA where supported).
Results and diagnosis: ``benchmarks/newarch_findings.md``.
"""

from __future__ import annotations

COMMON = dict(num_hidden_layers=2, vocab_size=1000, max_position_embeddings=512, use_cache=False)

#: key -> (config class in transformers, its keyword arguments beside COMMON)
CONFIGS = {
    "phi3": ("Phi3Config", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                num_key_value_heads=2, pad_token_id=0)),
    "phi": ("PhiConfig", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                              partial_rotary_factor=0.5)),
    "stablelm": ("StableLmConfig", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=2, partial_rotary_factor=0.25)),
    "starcoder2": ("Starcoder2Config", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                            num_key_value_heads=2, sliding_window=None)),
    "olmo2": ("Olmo2Config", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, pad_token_id=0)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=64, num_attention_heads=4,
                                         num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                         decoder_sparse_step=1, experts_implementation="batched_mm")),
    "opt": ("OPTConfig", dict(hidden_size=64, ffn_dim=128, num_attention_heads=4, word_embed_proj_dim=64)),
    "granite": ("GraniteConfig", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, embedding_multiplier=12.0, residual_multiplier=0.22,
                                      attention_multiplier=0.0625, logits_scaling=8.0)),
}


def make_config(key: str):
    """The transformers config of ``key`` (COMMON plus its own arguments)."""
    import transformers

    cls, kw = CONFIGS[key]
    return getattr(transformers, cls)(**{**COMMON, **kw})
