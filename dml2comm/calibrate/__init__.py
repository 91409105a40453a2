"""Calibrate the cost models to the user's own cluster from profiled runs (issue 20).

``samples`` (Kineto trace -> GEMM, memory-bound and collective samples), ``fit`` (the fits, their
residuals and held-out errors), ``command`` (``python main.py calibrate``, which writes a cluster
file read back by :mod:`dml2comm.hardware.cluster_file` for ``--cluster FILE.yaml``).
"""
