"""The ONNX ops that are point-wise (one output element from the same element of each input).

The memory model fuses runs of them and the flash-attention matcher follows them between the two
GEMMs of an attention core; both import the set from here, so that :mod:`dml2comm.cost.memory`
and :mod:`dml2comm.cost.attention` need not import each other (tests/test_import_layers.py).
"""

from __future__ import annotations

__all__ = ["POINTWISE_OPS"]

POINTWISE_OPS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Abs", "Tanh",
        "Sigmoid", "Relu", "LeakyRelu", "Gelu", "Erf", "Sin", "Cos", "Max", "Min", "Clip", "Where",
        "Cast", "CastLike", "Dropout", "Elu", "Selu", "Celu", "Softplus", "Softsign", "HardSigmoid",
        "HardSwish", "Mish", "Sign", "Floor", "Ceil", "Round", "Equal", "Less", "Greater",
        "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "Mod", "PRelu",
        "ThresholdedRelu", "BitShift",
    }
)
