"""Validation against bundled public measurements: ``python main.py validate``.

Every source is a published measurement bundled in ``data/`` (provenance in
``data/PROVENANCE.md``), read with :mod:`importlib.resources`, and a module that runs the tool on
each of its cases exactly as a user would:

- :mod:`~dml2comm.validate.narayanan`: Narayanan et al. 2021 Table 1 (TFLOP/s per GPU, 32-3,072 A100s);
- :mod:`~dml2comm.validate.vtrain`: vTrain's 1,440 single-node Megatron-DeepSpeed runs (iteration
  time), through the sweep's fast evaluator;
- :mod:`~dml2comm.validate.korthikanti`: Korthikanti et al. 2022 Table 4 (one 22B layer's forward
  and backward time);
- :mod:`~dml2comm.validate.collectives`: measured NCCL all-reduces (A100, V100) and OpenXLA's
  measured H100 collectives, costed as ``collective --cluster`` costs them;
- :mod:`~dml2comm.validate.gemm`: OpenXLA's measured H100 bf16 matmuls, against the shared
  analytical GEMM law fitted without them (held out);
- :mod:`~dml2comm.validate.h100_gemm`: this project's measured H100 GEMMs under PyTorch/cuBLAS
  (the three layouts of 140 ``nn.Linear`` shapes), costed as the analysis costs a MatMul.
- :mod:`~dml2comm.validate.steps`: Hugging Face training steps measured on one H100 (step time
  and peak memory), analysed from the real exports of the measured models (``data/models/``).

:mod:`~dml2comm.validate.fit` refits the tool's fitted compute constant leave-one-source-out;
:mod:`~dml2comm.validate.targets` checks each source's accuracy target on its cases;
:mod:`~dml2comm.site.validate` builds the Validation page (``DIR/site``);
:mod:`~dml2comm.validate.run` runs them; :mod:`~dml2comm.cli.validate` is the command front end.
"""

from dml2comm.validate.cases import SOURCES, Case, Source, scaled_cluster, summarize

__all__ = ["SOURCES", "Case", "Source", "scaled_cluster", "summarize"]
