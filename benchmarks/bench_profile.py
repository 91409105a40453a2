"""--profile figures: each bundled H100 step predicted from its own trace, GPT-2's ratios applied
at other micro-batches, and GPT-2 predicted from the Llama-1B trace's ratios (the command line
refuses a trace of another model, so this calls the functions directly).

    PYTHONPATH=. python benchmarks/bench_profile.py
"""

from __future__ import annotations

import dataclasses

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.traces.predict import attributed_share, expected_error_of, measured_and_modelled, profile_scale

from h100_steps import RUNS, config, measured_steps  # noqa: E402 (benchmarks/, the script's folder)


def predict(model: str, b: int, s: int, scale) -> tuple[float, float, float, dict]:
    """(with the ratios, without, attributed share, the trace-derived band) on one H100 with the
    pytorch host model."""
    imported = load_model(model, ImportOptions(batch_size=b, seq_len=s))
    cluster = dataclasses.replace(get_cluster("dgx-h100", 1), host_model="pytorch")
    plain = analyze_graph(imported, config(b, s), cluster, advise=False, timeline=False)
    scaled = analyze_graph(imported, config(b, s), dataclasses.replace(cluster, profile_scale=scale), advise=False, timeline=False)
    return scaled.summary["iteration_time_s"], plain.summary["iteration_time_s"], attributed_share(scaled), expected_error_of(scaled)


def band_text(band: dict) -> str:
    parts = ", ".join(f"{k} {v:.1%}" for k, v in band["components"].items() if v >= 5e-4)
    return f"band ±{band['total']:.1%} ({parts}; {band['doublings']:.2f} doublings)"


def main() -> None:
    measured = measured_steps()
    scales, parts_of = {}, {}
    for name, (model, trace, b, s) in RUNS.items():
        parts = measured_and_modelled(trace, model, config(b, s))
        scales[name] = profile_scale([parts])
        parts_of[name] = parts
        print(f"{name} b={b} s={s}: ratios measured / modelled (forward, backward):")
        for kind, f, bw in scales[name].ratios:
            print(f"  {kind:10s} {f:6.3f} {bw:6.3f}   measured {parts['measured'][kind][0] * 1e3:8.3f} {parts['measured'][kind][1] * 1e3:8.3f} ms"
                  f"   modelled {parts['modelled'][kind][0] * 1e3:8.3f} {parts['modelled'][kind][1] * 1e3:8.3f} ms")
    print("\n(a) each step from its own trace (measured step: h100_steps.json, mean of the runs' medians)")
    for name, (model, _, b, s) in RUNS.items():
        with_, without, share, band = predict(model, b, s, scales[name])
        m = measured[name]
        print(f"  {name} b={b}: predicted {with_ * 1e3:.2f} ms ({with_ / m - 1:+.1%}; {band_text(band)}), without the profile {without * 1e3:.2f} ms "
              f"({without / m - 1:+.1%}), measured {m * 1e3:.2f} ms; {share:.1%} of the compute from measured ratios")
        for label, step in (("the trace's host model", None), ("it and --step-time", m)):
            fitted = profile_scale([parts_of[name]], "pytorch", step)
            t, _, _, band = predict(model, b, s, fitted)
            print(f"    with {label}: {t * 1e3:.2f} ms ({t / m - 1:+.1%}; {band_text(band)}; {fitted.host.kernel_s * 1e6:.1f} us issue, "
                  f"{fitted.host.gap_s * 1e6:.2f} us idle per kernel)")
    print("\n(b) GPT-2 small's ratios at other micro-batches (no measurement)")
    model, _, _, s = RUNS["gpt2-small"]
    fitted = profile_scale([parts_of["gpt2-small"]], "pytorch")
    for b in (4, 16):
        with_, without, share, band = predict(model, b, s, scales["gpt2-small"])
        print(f"  b={b}: {with_ * 1e3:.2f} ms with the ratios ({band_text(band)}), {without * 1e3:.2f} ms without ({with_ / without - 1:+.1%})")
        t, _, _, band = predict(model, b, s, fitted)
        print(f"    with the trace's host model: {t * 1e3:.2f} ms ({band_text(band)}; the plan's own host wait)")
    with_, without, _, band = predict(model, 8, s, scales["llama-1b"])
    m = measured["gpt2-small"]
    print(f"\n(b) GPT-2 small b=8 from Llama-1B's ratios: {with_ * 1e3:.2f} ms ({with_ / m - 1:+.1%} against {m * 1e3:.2f} ms measured; "
          f"{band_text(band)}; its own ratios: see (a))")


if __name__ == "__main__":
    main()
