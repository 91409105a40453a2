"""Torchvision ResNets and a plain multi-layer perceptron.

ResNet follows ``torchvision.models.resnet`` exactly (ResNet v1.5: the stride of a Bottleneck
sits on its 3x3 convolution), with torchvision's module and parameter names, so the trainable
parameter counts equal torchvision's (ResNet-18: 11,689,512; ResNet-50: 25,557,032).
BatchNormalization is in inference form (scale, bias, mean, var inputs) and its statistics are
initializers named ``*.running_mean`` / ``*.running_var``: buffers, not parameters.
``num_batches_tracked`` is not emitted (no exported graph uses it).

Input ``pixel_values`` ``[batch, 3, image_size, image_size]``; output ``logits``
``[batch, num_classes]``; ``fc`` is a Gemm with torch's ``[out, in]`` weight and ``transB=1``.

References
----------
He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, arXiv:1512.03385,
Table 1 (stage depths) ; torchvision ``models/resnet.py`` (names, v1.5 stride placement) and its
model documentation (parameter counts).
"""

from __future__ import annotations

from typing import Sequence

import onnx

from dml2comm.errors import ConfigError
from dml2comm.zoo._builder import (
    GraphBuilder,
    check_name,
    check_positive,
    model_metadata,
    resolve_dtype,
)

__all__ = ["RESNET_DEPTHS", "build_resnet", "build_mlp"]

_TV = "torchvision.models.resnet"
_CONV = "torch.nn.modules.conv.Conv2d"
_BN = "torch.nn.modules.batchnorm.BatchNorm2d"
_RELU = "torch.nn.modules.activation.ReLU"
_SEQ = "torch.nn.modules.container.Sequential"
_LINEAR = "torch.nn.modules.linear.Linear"

RESNET_DEPTHS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("BasicBlock", (2, 2, 2, 2)),
    34: ("BasicBlock", (3, 4, 6, 3)),
    50: ("Bottleneck", (3, 4, 6, 3)),
    101: ("Bottleneck", (3, 4, 23, 3)),
    152: ("Bottleneck", (3, 8, 36, 3)),
}
"""Block type and blocks per stage (He et al. 2016, Table 1)."""

BN_EPS = 1e-5
"""``nn.BatchNorm2d`` default epsilon."""

_DTYPES_CNN = ("fp32", "fp16")
"""Conv (opset 11) and MaxPool (opset 12) have no bfloat16 kernels in opset 18."""


def _conv(
    b: GraphBuilder, x: str, c_in: int, c_out: int, k: int, stride: int, pad: int
) -> str:
    w = b.weight("weight", (c_out, c_in, k, k))
    return b.op(
        "Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
        dilations=[1, 1], group=1,
    )


def _bn(b: GraphBuilder, x: str, c: int) -> str:
    """Inference-form BatchNormalization: trainable weight/bias, buffers running_mean/var."""
    args = [b.weight(n, (c,)) for n in ("weight", "bias", "running_mean", "running_var")]
    return b.op("BatchNormalization", x, *args, epsilon=BN_EPS, momentum=0.9)


def _conv_bn(
    b: GraphBuilder, x: str, conv: str, bn: str, c_in: int, c_out: int, k: int, stride: int,
    seg_prefix: str | None = None,
) -> str:
    """``conv`` then ``bn`` submodules (``seg_prefix``: legacy segment of Sequential children)."""
    seg = (lambda n: None) if seg_prefix is None else (lambda n: f"{seg_prefix}.{n}")
    with b.scope(conv, _CONV, seg(conv)):
        x = _conv(b, x, c_in, c_out, k, stride, k // 2)
    with b.scope(bn, _BN, seg(bn)):
        return _bn(b, x, c_out)


def _relu(b: GraphBuilder, x: str, call: int) -> str:
    """The block's one ``relu`` module; its n-th call is named ``relu_n`` by the exporter."""
    with b.scope("relu", _RELU, "relu" if call == 0 else f"relu_{call}"):
        return b.op("Relu", x)


def _block(
    b: GraphBuilder, x: str, kind: str, c_in: int, planes: int, stride: int
) -> tuple[str, int]:
    """One BasicBlock or Bottleneck in the current scope; returns output and its channels."""
    expansion = 1 if kind == "BasicBlock" else 4
    c_out = planes * expansion
    if kind == "BasicBlock":
        y = _conv_bn(b, x, "conv1", "bn1", c_in, planes, 3, stride)
        y = _relu(b, y, 0)
        y = _conv_bn(b, y, "conv2", "bn2", planes, planes, 3, 1)
        calls = 1
    else:
        y = _conv_bn(b, x, "conv1", "bn1", c_in, planes, 1, 1)
        y = _relu(b, y, 0)
        y = _conv_bn(b, y, "conv2", "bn2", planes, planes, 3, stride)
        y = _relu(b, y, 1)
        y = _conv_bn(b, y, "conv3", "bn3", planes, c_out, 1, 1)
        calls = 2
    identity = x
    if stride != 1 or c_in != c_out:
        with b.scope("downsample", _SEQ):
            identity = _conv_bn(b, x, "0", "1", c_in, c_out, 1, stride, "downsample")
    y = b.op("Add", y, identity)
    return _relu(b, y, calls), c_out


def build_resnet(
    depth: int = 50,
    num_classes: int = 1000,
    image_size: int = 224,
    dtype: str = "fp32",
    name: str = "resnet",
) -> onnx.ModelProto:
    """Torchvision ResNet-18/34/50/101/152.

    Parameters
    ----------
    depth:
        18, 34 (BasicBlock) or 50, 101, 152 (Bottleneck).
    num_classes:
        Width of ``fc``.
    image_size:
        Height and width of the square input.
    dtype:
        ``fp32`` or ``fp16`` (opset 18 has no bfloat16 Conv).
    name:
        Graph name and weights-file stem.

    Returns
    -------
    onnx.ModelProto
        Trainable parameters (excluding ``running_mean``/``running_var``) equal torchvision's.

    Raises
    ------
    ConfigError
        Unknown depth or dtype, non-positive sizes.

    References
    ----------
    He et al., arXiv:1512.03385, Table 1; torchvision ``resnet.py``.
    """
    if depth not in RESNET_DEPTHS:
        raise ConfigError(
            f"depth={depth!r} is not a torchvision ResNet; choose one of "
            f"{', '.join(map(str, RESNET_DEPTHS))}"
        )
    check_positive(num_classes=num_classes, image_size=image_size)
    check_name(name)
    dt = resolve_dtype(dtype, _DTYPES_CNN)
    config = dict(depth=depth, num_classes=num_classes, image_size=image_size, dtype=dtype)
    kind, blocks = RESNET_DEPTHS[depth]
    b = GraphBuilder(name, f"{_TV}.ResNet", dt)
    x = b.add_input("pixel_values", dt, ["batch", 3, image_size, image_size])
    b.add_output("logits", dt, ["batch", num_classes])

    x = _stem(b, x)
    channels = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
        with b.scope(f"layer{stage}", _SEQ):
            for j in range(count):
                stride = 2 if stage > 1 and j == 0 else 1
                with b.scope(str(j), f"{_TV}.{kind}", f"layer{stage}.{j}"):
                    x, channels = _block(b, x, kind, channels, planes, stride)
    with b.scope("avgpool", "torch.nn.modules.pooling.AdaptiveAvgPool2d"):
        x = b.op("GlobalAveragePool", x)
    x = b.op("Flatten", x, axis=1)
    with b.scope("fc", _LINEAR):
        w = b.weight("weight", (num_classes, channels))
        bias = b.weight("bias", (num_classes,))
        b.node("Gemm", [x, w, bias], outputs=["logits"], alpha=1.0, beta=1.0, transB=1)

    doc = (
        f"torchvision ResNet-{depth} ({num_classes} classes, {image_size}px); shape-only zoo "
        "model, weights are external data that is never written."
    )
    return b.model(doc, model_metadata("resnet", config))


def _stem(b: GraphBuilder, x: str) -> str:
    """The stem: 7x7 stride-2 ``conv1`` to 64 channels, ``bn1``, ReLU, 3x3 stride-2 max pool."""
    with b.scope("conv1", _CONV):
        x = _conv(b, x, 3, 64, 7, 2, 3)
    with b.scope("bn1", _BN):
        x = _bn(b, x, 64)
    with b.scope("relu", _RELU):
        x = b.op("Relu", x)
    with b.scope("maxpool", "torch.nn.modules.pooling.MaxPool2d"):
        return b.op(
            "MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
            dilations=[1, 1], ceil_mode=0,
        )


def build_mlp(
    in_features: int,
    hidden: Sequence[int],
    out_features: int,
    dtype: str = "fp32",
    name: str = "mlp",
) -> onnx.ModelProto:
    """Multi-layer perceptron: ``len(hidden) + 1`` Linear layers, ReLU between them.

    Module ``layers.{i}`` (``MLPBlock``) holds ``linear`` (Gemm, weight ``[out, in]``,
    ``transB=1``, with bias) and, except in the last block, ``act`` (Relu): nodes
    ``/layers.{i}/linear/Gemm`` and ``/layers.{i}/act/Relu``.

    Parameters
    ----------
    in_features, out_features:
        Widths of input ``features`` ``[batch, in_features]`` and output ``logits``.
    hidden:
        Widths of the hidden layers (may be empty: one Linear).
    dtype, name:
        ``fp32``/``fp16``/``bf16``; graph name and weights-file stem.

    Returns
    -------
    onnx.ModelProto
        Parameters ``sum(n_in * n_out + n_out)`` over the layers.

    Raises
    ------
    ConfigError
        Non-positive widths.
    """
    widths = list(hidden)
    check_positive(in_features=in_features, out_features=out_features)
    check_positive(**{f"hidden[{i}]": w for i, w in enumerate(widths)})
    check_name(name)
    dt = resolve_dtype(dtype)
    config = dict(in_features=in_features, hidden=widths, out_features=out_features, dtype=dtype)
    b = GraphBuilder(name, "__main__.MLP", dt)
    x = b.add_input("features", dt, ["batch", in_features])
    b.add_output("logits", dt, ["batch", out_features])
    dims = [in_features, *widths, out_features]
    last = len(dims) - 2
    for i in range(last + 1):
        with b.scope(f"layers.{i}", "__main__.MLPBlock"):
            with b.scope("linear", _LINEAR):
                w = b.weight("weight", (dims[i + 1], dims[i]))
                bias = b.weight("bias", (dims[i + 1],))
                out = ["logits"] if i == last else None
                x = b.node("Gemm", [x, w, bias], outputs=out, alpha=1.0, beta=1.0, transB=1)[0]
            if i < last:
                with b.scope("act", _RELU):
                    x = b.op("Relu", x)
    doc = f"MLP {' -> '.join(map(str, dims))}; shape-only zoo model, external weights."
    return b.model(doc, model_metadata("mlp", config))
