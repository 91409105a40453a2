"""PyTorch-profiler (Kineto) trace ingestion: what really happened in a distributed run.

``load`` (one file -> numpy columns), ``classify`` (phase and parallel dimension of every
kernel, micro-batch segments), ``metrics`` (per step and micro-batch), ``overlap`` (interval
arithmetic and the HolisticTraceAnalysis-compatible figures), ``layout`` (rank coordinates and
model replicas), ``compare`` (predicted vs measured), ``analyze`` (a rank set in worker
processes), ``charts``/``site`` (drawings and pages), ``command`` (the ``trace`` subcommand).
Name patterns live in ``patterns``.
"""
