"""Calibrate the cost models to the user's own cluster from profiled runs (issue 20).

``samples`` (Kineto trace -> GEMM, memory-bound, flash-attention, convolution, optimizer and
collective samples), ``classes`` (one fit per kernel class with its held-out verdict), ``fit``
(the shared fitting helpers and the collectives' fits), ``calibration`` (the steps: traces in,
calibrated cluster and record out, nothing printed), ``command`` (``python main.py calibrate``:
arguments, report, page and the cluster file read back by :mod:`dml2comm.hardware.cluster_file`
for ``--cluster FILE.yaml``).
"""
