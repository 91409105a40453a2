"""Op cost rules.  Importing this package registers every family module with the registry.

Families (one module each, every formula documented and sourced in its module docstring):

- :mod:`~dml2comm.ops.linalg`: MatMul, Gemm, Einsum, Attention, ORT attention kernels
- :mod:`~dml2comm.ops.conv`: Conv, ConvTranspose, pooling
- :mod:`~dml2comm.ops.elementwise`: arithmetic, comparisons, logic, activations, Cast, Dropout,
  Where, Clip, RotaryEmbedding
- :mod:`~dml2comm.ops.norm`: LayerNorm, RMSNorm, BatchNorm, InstanceNorm, GroupNorm, Softmax
- :mod:`~dml2comm.ops.reduce`: Reduce*, ArgMax/ArgMin, CumSum, TopK
- :mod:`~dml2comm.ops.movement`: views, copies, gathers, scatters, Resize, generators
- :mod:`~dml2comm.ops.loss`: SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss
- :mod:`~dml2comm.ops.recurrent`: LSTM, GRU, RNN
"""

from dml2comm.ops import conv, elementwise, linalg, loss, movement, norm, recurrent, reduce

__all__ = ["conv", "elementwise", "linalg", "loss", "movement", "norm", "recurrent", "reduce"]
