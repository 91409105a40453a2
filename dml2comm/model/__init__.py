"""The model of an iteration: priced plans run once, for every caller.

Between the simulation (:mod:`dml2comm.sim`) and its callers: :func:`run` simulates
:class:`~dml2comm.cost.stages.StagePlan`\\ s (the analysis's one, with the timeline's events; a
sweep's thousands) and :class:`FastEvaluator` turns a sweep's configurations into summaries with
it (:mod:`dml2comm.model.run`, :mod:`dml2comm.model.evaluator`).
"""

from dml2comm.model.evaluator import FastEvaluator, NotRepeating, supports
from dml2comm.model.run import Batch, FreeRun, PlanRun, run, run_batches

__all__ = ["Batch", "FastEvaluator", "FreeRun", "NotRepeating", "PlanRun", "run", "run_batches", "supports"]
