"""Shape-only ONNX model zoo: transformer and CNN graphs of any size, built in well under a second.

The models look like PyTorch exports (legacy exporter's scoped node names, dynamo exporter's
``pkg.torch.onnx.name_scopes`` / ``class_hierarchy`` node metadata, Linear layers as MatMul with
an ``[in, out]`` weight + Add, LayerNormalization, primitive GELU/RMSNorm/RoPE decompositions)
and pass ``onnx.checker.check_model`` with ``full_check``.  Weights are initializers whose data is
an external-data reference to ``<name>.weights.bin``, a file that is never written: dims and
``data_type`` are exact, nothing reads values.

Conventions the analysis relies on
----------------------------------
* Opset 18 (default domain), IR version 10.
* Inputs carry ``dim_param "batch"`` in dim 0; every other dim is static.  Bind ``batch`` (set
  ``dim_value``) and ``onnx.shape_inference.infer_shapes`` gives every value a static shape; it
  also infers everything with ``batch`` left symbolic.  Transformers: ``input_ids`` int64
  ``[batch, seq_len]`` (BERT also ``attention_mask`` and ``token_type_ids``); ResNet:
  ``pixel_values`` ``[batch, 3, H, W]``; MLP: ``features`` ``[batch, in_features]``.  The output
  is ``logits`` (BERT with ``pooler=True`` adds ``pooler_output``).
* Trainable parameters are all initializers except names ending in ``running_mean``,
  ``running_var`` or ``num_batches_tracked`` (:data:`NON_TRAINABLE_SUFFIXES`; the zoo emits the
  first two, for BatchNormalization).  Rotary tables and attention masks are computed in-graph
  from small ``Constant`` nodes, never stored as initializers.
* Tied embeddings are one initializer read by ``Gather`` and by a ``Transpose`` feeding the head.
* Load saved models with ``onnx.load(path, load_external_data=False)``.

Public API
----------
``build(kind, **params)``, ``build_preset(name, **overrides)``, :data:`KINDS`, :data:`PRESETS`,
the builders (``build_gpt``, ``build_llama``, ``build_moe``, ``build_bert``, ``build_resnet``,
``build_mlp``), ``save(model, path)`` and ``check(model)``.
"""

from __future__ import annotations

from dml2comm.zoo.bert import build_bert
from dml2comm.zoo.catalog import KINDS, PRESETS, REQUIRED, Kind, Param, build, build_preset
from dml2comm.zoo.decoders import build_gpt, build_llama, build_moe, moe_capacity
from dml2comm.zoo.files import check, save, weights_location
from dml2comm.zoo.vision import RESNET_DEPTHS, build_mlp, build_resnet

__all__ = [
    "KINDS",
    "PRESETS",
    "REQUIRED",
    "NON_TRAINABLE_SUFFIXES",
    "RESNET_DEPTHS",
    "Kind",
    "Param",
    "build",
    "build_preset",
    "build_gpt",
    "build_llama",
    "build_moe",
    "build_bert",
    "build_resnet",
    "build_mlp",
    "moe_capacity",
    "save",
    "check",
    "weights_location",
]

NON_TRAINABLE_SUFFIXES: tuple[str, ...] = ("running_mean", "running_var", "num_batches_tracked")
"""Initializer-name endings of buffers (BatchNorm statistics), which are not parameters."""
