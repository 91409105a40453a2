"""Measured-over-modelled ratios from a profiled step (``--profile TRACE``), as one value the cost
model reads.

A profiled training step of the model, joined to its layers
(:func:`dml2comm.traces.join.join_trace`), gives per layer kind and pass the measured kernel time;
the tool gives its own kernel time for the same layers at the profiled shape and GPU
(:func:`dml2comm.traces.predict.profile_scale`).  Their ratio, per kind and pass, multiplies the
modelled kernel times of any plan of the same model: the cost model then supplies only the change
from the profiled shape to the plan's (micro-batch, sequence, t, recomputation, GPU).  It is
applied in one place per term, before the host model (:mod:`dml2comm.cost.host`), which stays on
top:

- op times, per op by its layer's kind (:func:`dml2comm.cost.ops.shard_op_costs`), which the
  analysis's op nodes and the layer tables (:mod:`dml2comm.cost.layers`) both read;
- the training loss the graph leaves out (``loss``: :func:`dml2comm.cost.loss.cross_entropy_s`);
- the optimizer step (``optimizer``: :mod:`dml2comm.cost.stages`);
- the input's read over PCIe (``input``: :mod:`dml2comm.cost.stages`; none where the profiled
  step copied no batch to the GPU).

It also carries the host model measured from the same traces (``host``:
:func:`dml2comm.traces.host.fitted_host_model`: the CPU's issue time and the GPU's idle time per
kernel), which replaces the stack's preset host model wherever the cluster's is resolved
(:func:`dml2comm.cost.host.host_model`'s ``fitted``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from dml2comm.cost.host import HostModel

__all__ = ["KINDS", "ProfileScale", "scaled_share", "scaled_share_of"]

#: Layer kinds a profile gives a ratio for (blocks: one ratio, the mean over the blocks), and the
#: input's read over PCIe (``input``: the step's host-to-device copies in its forward over the
#: model's read; 0 where the step copied none).
KINDS = ("embedding", "block", "head", "loss", "optimizer", "input")


@dataclass(frozen=True, slots=True)
class ProfileScale:
    """Per layer kind, (forward, backward) ratios measured / modelled kernel time.

    Parameters
    ----------
    ratios
        ``(kind, forward ratio, backward ratio)`` per kind of :data:`KINDS` the profile measured
        (a kind without a row keeps its modelled time: factor 1).  The optimizer's ratio is its
        forward one (the step has one pass).
    files
        ``(file name, sha256)`` of the traces it came from (data.json ``profile``).
    host
        The host model fitted on the traces (None: the cluster's named one stays); in equality
        and hash, so the cost caches keep plans with and without it apart.
    detail
        What the ratios were computed from, for data.json: per kind, measured and modelled
        seconds, the profiled shape and GPU (left out of equality and hash: the cache keys hold the
        ratios).
    """

    ratios: tuple[tuple[str, float, float], ...]
    files: tuple[tuple[str, str], ...] = ()
    host: HostModel | None = None
    detail: tuple[tuple[str, Any], ...] = field(default=(), compare=False, hash=False)

    def factor(self, kind: str) -> tuple[float, float]:
        """(forward, backward) factor of layers of ``kind`` (1, 1 for a kind it has no row for)."""
        for k, f, b in self.ratios:
            if k == kind:
                return f, b
        return 1.0, 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"files": [{"file": f, "sha256": h} for f, h in self.files],
                "ratios": {k: {"forward": f, "backward": b} for k, f, b in self.ratios},
                **{k: v for k, v in self.detail}}


def scaled_share(scale: ProfileScale, layers: Sequence[Any], stages: Sequence[Any], micro_batches: int) -> float:
    """Share of a plan's predicted compute (per-layer forward and backward over the
    ``micro_batches``, the loss, the optimizer step; every stage summed) whose time a measured
    ratio of ``scale`` scaled.  ``layers``: the analysis's layer rows (``kind``, ``time_fwd_s``,
    ``time_bwd_s``); ``stages``: its stage rows (``compute_fwd_s``, ``compute_bwd_s``,
    ``loss_fwd_s``, ``loss_bwd_s``, ``optimizer_time_s``): :func:`scaled_share_of` of their columns."""
    return scaled_share_of(scale, [x.kind for x in layers], [x.time_fwd_s for x in layers], [x.time_bwd_s for x in layers],
                           [st.compute_fwd_s for st in stages], [st.compute_bwd_s for st in stages],
                           [st.loss_fwd_s for st in stages], [st.loss_bwd_s for st in stages],
                           [st.optimizer_time_s for st in stages], micro_batches)


def scaled_share_of(scale: ProfileScale, kinds: Sequence[str], fwd: Sequence[float], bwd: Sequence[float],
                    compute_f: Sequence[float], compute_b: Sequence[float], loss_f: Sequence[float], loss_b: Sequence[float],
                    optimizer: Sequence[float], micro_batches: int) -> float:
    """:func:`scaled_share` from columns: per full layer its kind and forward and backward
    seconds per micro-batch (a layer table's ``fwd``, ``bwd``); per stage its compute per
    micro-batch (a stage plan's ``compute_f``, ``compute_b``), the loss's part of it (a stage
    table's ``loss_f``, ``loss_b``) and its optimizer step (``optimizer``)."""
    have = {k for k, _, _ in scale.ratios}
    m = micro_batches
    scaled = sum((f + b) * m for kind, f, b in zip(kinds, fwd, bwd) if kind in have)
    total = 0.0
    for cf, cb, lf, lb, opt in zip(compute_f, compute_b, loss_f, loss_b, optimizer):
        total += (cf + cb) * m + opt
        if "loss" in have:
            scaled += (lf + lb) * m
        if "optimizer" in have:
            scaled += opt
    return scaled / total if total > 0 else 0.0
