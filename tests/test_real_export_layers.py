"""Layer counts of every real-export fixture match the module structure torch has
(issue 16: "layer counts match the module structure").

The structures, from ``tests/fixtures/export_models.py``:
- transformers' GPT-2/BERT/MiniLM/Llama/Mixtral: ``embedding``, one block per decoder/encoder
  layer, and a ``head`` where the model has ops after the last block;
- ResNet-18: 8 residual blocks between the stem and the classifier, from both exporters and
  from the legacy export with model-local functions;
- a small ResNet whose stem is one ``nn.Sequential`` (``stem.0`` conv, ``stem.1`` BatchNorm,
  ``stem.2`` ReLU): its 4 residual blocks ``layer1.0`` .. ``layer2.1``, not the stem's numbered
  layers, from the legacy export with model-local functions and from dynamo;
- the plain CNN: ``features.0..3`` blocks and the ``head`` (both exporters name them alike:
  the legacy exporter's ``/features/features.0/Conv`` is the module ``features.0``);
- the voice-activity model (``TinyVAD``): two branch modules ``b16k``/``b8k`` (Conv1d +
  LSTM) inside an ``If`` and the ``head`` Linear: one block per branch (the ``If``'s condition
  and input view, which hold no weight, join the first) and the head; the LSTM gates' weight
  re-ordering (``Slice``/``Concat``
  of the weight constants) joins its LSTM's block instead of making layers of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# file -> (layers, blocks, block names or None)
EXPECTED = {
    "gpt2_fixed_legacy.onnx": (6, 4, [f"transformer.h.{i}" for i in range(4)]),
    "bert_shared_legacy.onnx": (5, 4, [f"encoder.layer.{i}" for i in range(4)]),
    "minilm_legacy.onnx": (5, 4, [f"encoder.layer.{i}" for i in range(4)]),
    "minilm_dynamo.onnx": (5, 4, [f"encoder.layer.{i}" for i in range(4)]),
    "minilm_dynamo_b2.onnx": (5, 4, [f"encoder.layer.{i}" for i in range(4)]),
    "resnet18_functions_legacy.onnx": (10, 8, [f"layer{s}.{j}" for s in range(1, 5) for j in (0, 1)]),
    "resnet_seq_stem_functions_legacy.onnx": (6, 4, [f"layer{s}.{j}" for s in (1, 2) for j in (0, 1)]),
    "resnet_seq_stem_dynamo.onnx": (6, 4, [f"layer{s}.{j}" for s in (1, 2) for j in (0, 1)]),
    "cnn_classifier_legacy.onnx": (5, 4, [f"features.{i}" for i in range(4)]),
    "cnn_classifier_dynamo.onnx": (5, 4, [f"features.{i}" for i in range(4)]),
    "vad_lstm_if.onnx": (3, 2, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_layers_follow_the_module_structure(name):
    r = load_model(FIXTURES / name, ImportOptions(seq_len=512 if "vad" in name else 16))
    layered = group_layers(r.graph)
    layers, blocks, names = EXPECTED[name]
    assert (len(layered.layers), layered.num_blocks) == (layers, blocks), [l.name for l in layered.layers]
    if names is not None:
        assert [l.name for l in layered.layers if l.kind == "block"] == names


def test_vad_branches_are_one_block_each_with_their_lstm_weights():
    r = load_model(FIXTURES / "vad_lstm_if.onnx", ImportOptions(seq_len=512))
    g = r.graph
    layered = group_layers(g)
    for layer in layered.layers:
        if layer.kind != "block":
            continue
        kinds = [g.ops[i].op_type for i in layer.op_indices]
        # each branch: its Conv1d and its LSTM, whose weight re-ordering ops sit with it
        assert kinds.count("Conv") == 1 and kinds.count("LSTM") == 1, kinds
        # one branch runs (the heavier one), the other is kept for its parameters only
        assert len({g.ops[i].repeat for i in layer.op_indices if g.ops[i].op_type == "LSTM"}) == 1
    lstm_repeats = sorted(g.ops[i].repeat for i in range(len(g.ops)) if g.ops[i].op_type == "LSTM")
    assert lstm_repeats == [0, 1]
