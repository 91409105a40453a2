"""Words computed from sweep rows: the iteration-time breakdown and why the best configuration wins.

Pure functions over the row dicts of :class:`~dml2comm.search.sweep.SweepResult` (and of
``compare``): no I/O, no analysis.  A row's iteration time splits into the four parts the
analysis reports (``compute_time_s``, ``bubble_time_s``, ``exposed_comm_time_s``,
``optimizer_time_s``; they add up to ``iteration_time_s``, up to rounding).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["BREAKDOWN", "breakdown", "config_text", "config_diff", "why_best"]

#: (row key, label): the parts of one iteration, in the order they are stacked.
BREAKDOWN: tuple[tuple[str, str], ...] = (
    ("compute_time_s", "compute"),
    ("bubble_time_s", "pipeline bubble"),
    ("exposed_comm_time_s", "exposed communication"),
    ("optimizer_time_s", "optimizer step"),
)

#: Configuration keys in the order they are written, with their short names.
_KEYS = (("d", "d"), ("t", "t"), ("p", "p"), ("micro_batch_size", "b"), ("virtual_stages", "v"), ("zero_stage", "zero"),
         ("recompute", "recompute"), ("sequence_parallel", "sp"))


def breakdown(row: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per part of :data:`BREAKDOWN` (missing parts: 0), plus ``other`` (what is left
    of the iteration time, normally ~0)."""
    parts = {key: float(row.get(key) or 0.0) for key, _ in BREAKDOWN}
    total = float(row.get("iteration_time_s") or 0.0)
    parts["other"] = max(total - sum(parts.values()), 0.0)
    return parts


def _value(config: Mapping[str, Any], key: str) -> str:
    v = config.get(key)
    if key == "sequence_parallel":
        return "1" if v else "0"
    return str(v)


def config_text(config: Mapping[str, Any]) -> str:
    """``d=2,t=2,p=4,b=1,zero=1,recompute=none`` (v and sp only when used): a ``--configs`` spec."""
    parts = []
    for key, short in _KEYS:
        if key == "virtual_stages" and (config.get(key) or 1) <= 1:
            continue
        if key == "sequence_parallel" and not config.get(key):
            continue
        parts.append(f"{short}={_value(config, key)}")
    return ",".join(parts)


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """How configuration ``a`` differs from ``b``: ``["t=2 (not 4)", ...]``."""
    out = []
    for key, short in _KEYS:
        if _value(a, key) != _value(b, key):
            out.append(f"{short}={_value(a, key)} (not {_value(b, key)})")
    return out


def _label(key: str) -> str:
    return dict(BREAKDOWN).get(key, key)


def _versus(best: Mapping[str, Any], other: Mapping[str, Any], name: str) -> str:
    """One sentence: how much faster ``best`` is than ``other`` and where the time goes."""
    tb, to = best["iteration_time_s"], other["iteration_time_s"]
    pb, po = breakdown(best), breakdown(other)
    diffs = {k: po[k] - pb[k] for k, _ in BREAKDOWN}
    saved = to - tb
    changed = config_diff(best["config"], other["config"])
    what = f" ({', '.join(changed)})" if changed else ""
    if saved <= 0:
        return f"It ties with {name} {config_text(other['config'])} at {fmt_s(tb)}{what}."
    key = max(diffs, key=lambda k: diffs[k])
    lead = (f"{fmt_s(diffs[key])} less {_label(key)}" if diffs[key] > 0 else "no part alone")
    others = sorted(((k, v) for k, v in diffs.items() if k != key and abs(v) >= 0.05 * saved), key=lambda kv: -abs(kv[1]))
    rest = "".join(f", {fmt_s(abs(v))} {'less' if v > 0 else 'more'} {_label(k)}" for k, v in others)
    return (f"Against {name} {config_text(other['config'])}{what} it is {fmt_s(saved)} faster ({saved / to:.0%} of "
            f"{fmt_s(to)}): {lead}{rest}.{_overlap(best, other)}")


def _overlap(best: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """A clause when the two times' expected-error bands overlap (``expected_error``: each row's
    :func:`dml2comm.cost.bands.summary_band`): the validated runs bound each time's error, so a
    difference inside both bands is not established by them."""
    eb, eo = best.get("expected_error"), other.get("expected_error")
    if eb is None or eo is None or best["iteration_time_s"] * (1 + eb) < other["iteration_time_s"] * (1 - eo):
        return ""
    return f" The difference is inside their expected errors (±{eb:.1%}, ±{eo:.1%}): measure both to tell them apart."


def why_best(rows: Sequence[Mapping[str, Any]], capacity_bytes: float | None = None) -> list[str]:
    """Sentences saying why the fastest fitting row wins, computed from the rows.

    - what its iteration is made of (the largest part and its share);
    - against the runner-up and the median fitting configuration: the time saved and the
      breakdown part that differs most, with the configuration keys that differ;
    - its memory headroom against ``capacity_bytes``, and any faster configuration that does
      not fit (what memory costs).
    Empty when no row fits."""
    evaluated = [r for r in rows if r.get("error") is None and r.get("iteration_time_s")]
    ranked = sorted((r for r in evaluated if r.get("fits")), key=lambda r: (r["iteration_time_s"], r.get("index", 0)))
    if not ranked:
        return []
    best = ranked[0]
    t = best["iteration_time_s"]
    parts = breakdown(best)
    main = max((k for k, _ in BREAKDOWN), key=lambda k: parts[k])
    shares = ", ".join(f"{_label(k)} {parts[k] / t:.0%}" for k, _ in BREAKDOWN if parts[k] / t >= 0.005)
    m = best["config"].get("num_micro_batches")
    out = [f"The best configuration, {config_text(best['config'])} ({m} micro-batch{'' if m == 1 else 'es'}, "
           f"{best['config'].get('schedule')} schedule), takes {fmt_s(t)} per iteration; {_label(main)} is its largest part "
           f"({shares})."]
    if len(ranked) > 1:
        out.append(_versus(best, ranked[1], "the runner-up"))
    if len(ranked) > 2:
        median = ranked[(len(ranked) - 1) // 2]
        if median is not ranked[1]:
            out.append(_versus(best, median, f"the median of the {len(ranked)} fitting configurations,"))
    peak = best.get("peak_memory_bytes")
    if capacity_bytes and peak is not None:
        out.append(f"It needs {fmt_bytes(peak)} per GPU of {fmt_bytes(capacity_bytes)}: {fmt_bytes(capacity_bytes - peak)} "
                   f"({(capacity_bytes - peak) / capacity_bytes:.0%}) headroom.")
    faster = [r for r in evaluated if not r.get("fits") and r["iteration_time_s"] < t]
    if faster:
        f = min(faster, key=lambda r: r["iteration_time_s"])
        out.append(f"{len(faster)} faster configuration{'s do' if len(faster) > 1 else ' does'} not fit in memory; the fastest, "
                   f"{config_text(f['config'])}, would take {fmt_s(f['iteration_time_s'])} but needs {fmt_bytes(f['peak_memory_bytes'])}"
                   f" per GPU.")
    return out

