"""A calibration record (the cluster file's ``calibration``, :mod:`dml2comm.calibrate.calibration`)
as table rows and sentences: what the calibration page (:mod:`dml2comm.site.calibrate`) and an
analysis site's References page (:mod:`dml2comm.site.references`) show of it."""

from __future__ import annotations

from typing import Any, Mapping

from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["class_rows", "fitted_rows", "guard_text"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _res(term: Mapping[str, Any]) -> dict[str, str]:
    r, h = term.get("residual") or {}, term.get("holdout") or {}
    return {"samples": str(r.get("samples", "")), "shapes": str(r.get("shapes", "")), "median": _pct(r.get("median_rel_error")),
            "worst": _pct(r.get("worst_rel_error")),
            "held": f"{h['shapes']} shapes: {_pct(h['median_rel_error'])} / {_pct(h['worst_rel_error'])}" if h else "not held out"}


def class_rows(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per kernel class of a calibration record (``classes``,
    :class:`dml2comm.calibrate.classes.ClassFit`): ``constant``, ``value``, ``base``, ``samples``,
    ``shapes``, ``median``, ``worst``, ``held`` (held-out median, and the base's on the same
    shapes), ``used`` (yes/no) and ``why``."""
    rows = []
    for c in record.get("classes") or []:
        h, b = c.get("holdout"), c.get("base_holdout")
        shapes = "" if not h else f"{h['shapes']} shape{'' if h['shapes'] == 1 else 's'}"
        held = "not held out" if not h else (f"{shapes}: {_pct(h['median_rel_error'])} (base {_pct(b['median_rel_error'])})"
                                              if b else f"{shapes}: {_pct(h['median_rel_error'])}")
        res = _res(c)
        rows.append({"constant": f"gpu.calibrated_classes.{c['class']}", "key": str(c["class"]), "label": str(c.get("label", "")),
                     "quantity": str(c.get("quantity", "")), "value": "not fitted" if c.get("value") is None else f"{c['value']:.4g}",
                     "base": f"{c['base_value']:.4g}", "samples": str(c.get("samples", 0)), "shapes": str(c.get("shapes", 0)),
                     "median": res["median"] if c.get("residual") else "n/a", "worst": res["worst"] if c.get("residual") else "n/a",
                     "held": held, "used": "used" if c.get("used") else "base kept", "why": str(c.get("why", ""))})
    return rows


def guard_text(guard: Mapping[str, Any] | None) -> str:
    """The step guard of a calibration record (:class:`dml2comm.calibrate.classes.StepGuard`) in
    one sentence, or "" (none: ``--holdout 0``, or a record written before the guard)."""
    if not guard:
        return ""
    m = guard["measured_s"]
    text = (f"Summed kernel time of every class: measured {m * 1e3:.2f} ms, the base {guard['base_s'] / m - 1:+.1%}, "
            f"with the values used {guard['used_s'] / m - 1:+.1%}.")
    if guard.get("dropped"):
        text += (" Left at the base although better on their own held-out shapes (each moves the sum away from the "
                 "measured one): " + ", ".join(f"{k} ({guard['effects_s'][k] * 1e3:+.2f} ms)" for k in guard["dropped"]) + ".")
    return text


def fitted_rows(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per fitted value of a calibration record: ``constant``, ``value``, ``base``,
    ``samples``, ``shapes``, ``median``, ``worst`` (relative errors on the fitted samples) and
    ``held`` (held-out shapes: median / worst).  Kernel classes (:func:`class_rows`) give their
    value, or the base's with the reason where the base was kept; the single GPU values of files
    written before the classes give theirs.  Collectives give their latency and bus bandwidth,
    and their time at the reference sizes against the base's
    (:data:`dml2comm.calibrate.base.REFERENCE_SIZES`)."""
    fitted = record.get("fitted") or {}
    rows = [{k: r[k] for k in ("constant", "value", "base", "samples", "shapes", "median", "worst")}
            | {"held": f"{r['held']}; {r['used']}: {r['why']}"} for r in class_rows(record)]
    g = fitted.get("gemm_sustained_factor")
    if g:
        rows.append({"constant": "gpu.gemm_sustained_factor", "value": f"{g['gemm_sustained_factor']:.4g}",
                     "base": f"{g['base_value']:.4g}" if g.get("base_value") is not None else "n/a", **_res(g)})
    h = fitted.get("hbm_efficiency")
    if h:
        rows.append({"constant": "gpu.hbm_efficiency", "value": f"{h['hbm_efficiency']:.4g}",
                     "base": f"{h['base_value']:.4g}" if h.get("base_value") is not None else "n/a", **_res(h)})
    for c in fitted.get("collectives") or []:
        label = f"{c['kind']} n={c['group_size']} {str(c['level']).replace('_', '-')}"
        ref = c.get("reference_times_s") or []
        value = f"alpha {fmt_s(c['alpha_s'])}, busbw {c['busbw_bytes_per_s'] / 1e9:.3g} GB/s"
        at = "; ".join(f"{fmt_bytes(r['size_bytes'], 3)}: {fmt_s(r['fitted_s'])}" for r in ref)
        base = "; ".join(f"{fmt_bytes(r['size_bytes'], 3)}: {fmt_s(r['base_s'])}" for r in ref) or "link model"
        rows.append({"constant": f"collective {label}", "value": value + (f" ({at})" if at else ""), "base": base, **_res(c)})
    return rows
