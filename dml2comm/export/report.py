"""``Analysis`` -> ``data.json`` (schema_version 1, SI units; DESIGN.md section 6).

Same inputs give byte-identical output: keys sorted, no timestamps, floats as Python repr.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from dml2comm.analysis import Analysis, comm_by_dim

__all__ = ["SCHEMA_VERSION", "report_dict", "report_json"]

SCHEMA_VERSION = 1


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def collectives_table(analysis: Analysis) -> list[dict[str, Any]]:
    """One entry per distinct collective (kind, dim, phase, group size, size, algorithm, stage)."""
    groups: dict[tuple, dict[str, Any]] = {}
    for c in analysis.comms:
        key = (c.kind.value, c.dim.value, c.phase.value, c.group_size, c.message_bytes, c.algorithm, c.stage, c.link)
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = {
                "kind": c.kind.value,
                "dim": c.dim.value,
                "phase": c.phase.value,
                "stage": c.stage,
                "group_size": c.group_size,
                "message_bytes": c.message_bytes,
                "bytes_sent_per_gpu": c.bytes_sent_per_gpu,
                "algorithm": c.algorithm,
                "link": c.link,
                "time_s": c.time_s,
                "limiting_link": c.limiting_link,
                "protocol": c.protocol,
                "steps": c.steps,
                "formula": c.formula,
                "count_per_iteration": 0,
                "reasons": [],
            }
        entry["count_per_iteration"] += c.count_per_iteration
        if c.reason not in entry["reasons"]:
            entry["reasons"].append(c.reason)
    return sorted(groups.values(), key=lambda e: (e["stage"], e["dim"], e["phase"], e["kind"], -e["message_bytes"]))


def report_dict(analysis: Analysis) -> dict[str, Any]:
    cfg = analysis.config
    stages = []
    for st in analysis.stages:
        stages.append(
            {
                "index": st.index,
                "layers": list(st.layers),
                "params": st.params,
                "params_per_gpu": st.params_per_gpu,
                "flops_fwd": st.flops_fwd,
                "time_fwd_s": st.time_fwd_s,
                "time_bwd_s": st.time_bwd_s,
                "compute_fwd_s": st.compute_fwd_s,
                "compute_bwd_s": st.compute_bwd_s,
                "dp_time_s": st.dp_time_s,
                "optimizer_time_s": st.optimizer_time_s,
                "grad_accumulation_s": st.grad_accumulation_s,
                "loss_fwd_s": st.loss_fwd_s,
                "loss_bwd_s": st.loss_bwd_s,
                "ranks": list(st.ranks),
                "memory": dict(st.memory),
            }
        )
    tp_per_layer: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in analysis.comms:
        if c.layer is not None:
            tp_per_layer[c.layer][f"{c.kind.value}:{c.phase.value}"] += 1
    layers = [
        {
            "index": l.index,
            "name": l.name,
            "kind": l.kind,
            "stage": l.stage,
            "num_ops": l.num_ops,
            "params": l.params,
            "flops_fwd": l.flops_fwd,
            "time_fwd_s": l.time_fwd_s,
            "time_bwd_s": l.time_bwd_s,
            "tp_collectives_per_micro_batch": dict(sorted(tp_per_layer.get(l.index, {}).items())),
        }
        for l in analysis.layers
    ]
    data = {
        "schema_version": SCHEMA_VERSION,
        "model": dict(analysis.model_info),
        "config": cfg.to_dict(),
        "cluster": analysis.cluster.to_dict(),
        "summary": dict(analysis.summary),
        "comm_by_dim": comm_by_dim(analysis),
        "collectives": collectives_table(analysis),
        "stages": stages,
        "layers": layers,
        "memory": dict(analysis.memory),
        "recommendations": [dict(r) for r in analysis.recommendations],
        "warnings": list(analysis.warnings),
        "assumptions": list(analysis.assumptions),
    }
    if analysis.cluster.profile_scale is not None:  # --profile: the measured ratios the times were scaled by
        from dml2comm.traces.predict import attributed_share, expected_error_of

        data["profile"] = {**analysis.cluster.profile_scale.to_dict(), "attributed_share": attributed_share(analysis),
                           "expected_error": expected_error_of(analysis)}
    return _clean(data)


def report_json(analysis: Analysis) -> str:
    return json.dumps(report_dict(analysis), sort_keys=True, indent=1, ensure_ascii=False) + "\n"
