"""A convolutional export whose BatchNorm was folded into the convolutions is said, with the export
that keeps it; a network with its normalisation, or without convolutions, is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import folded_normalization_warning
from dml2comm.ir.onnx_import import ImportOptions, load_model, load_model_proto

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name", ["resnet18_dynamo", "resnet18_legacy", "cnn_classifier_dynamo"])
def test_folded_batchnorm_exports_are_warned(name):
    imported = load_model(str(FIXTURES / f"{name}.onnx"), ImportOptions(batch_size=2))
    text = folded_normalization_warning(imported.graph)
    assert text is not None and text.startswith("normalization:") and "TrainingMode.TRAINING" in text


def test_kept_batchnorm_and_transformers_are_not():
    resnet = load_model_proto(zoo.build_resnet(depth=18, image_size=64), ImportOptions(batch_size=2))
    assert any(op.op_type == "BatchNormalization" for op in resnet.graph.ops)
    assert folded_normalization_warning(resnet.graph) is None
    gpt = load_model(str(FIXTURES / "gpt2_legacy.onnx"), ImportOptions(batch_size=1, seq_len=16))
    assert folded_normalization_warning(gpt.graph) is None
