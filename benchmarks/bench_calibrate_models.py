"""Per-kernel-class calibration across models: ``calibrate`` on the bundled H100 traces of GPT-2
small and Llama-1B (one training step each, PyTorch 2.11, bf16, SDPA flash attention, fused
AdamW), then each model's step predicted with the calibrated cluster, against its measured step
and against the uncalibrated prediction.

Three calibrations: on GPT-2's trace only, on Llama-1B's only, on both.  A model predicted from
the *other* model's trace (leave-one-trace-out) is the honest figure: its own trace has already
seen its kernels.  Each calibration runs twice: with the command's default held-out verdict
(``--holdout 0.3``: a class's value is used only when it beats the base on held-out shapes and
the step guard keeps it: :mod:`dml2comm.calibrate.classes`) and with ``--holdout 0`` (every
fitted value used, no check).  Nothing is tuned to these steps: the values are what ``calibrate``
fits on the traces' kernels.

    PYTHONPATH=. python benchmarks/bench_calibrate_models.py
"""

from __future__ import annotations

import dataclasses

from dml2comm.analysis import analyze_graph
from dml2comm.calibrate.calibration import calibrate
from dml2comm.cli.calibrate import guard_line
from dml2comm.hardware.cluster import Cluster, get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model

from h100_steps import RUNS, config, measured_steps  # noqa: E402 (benchmarks/, the script's folder)


def step_s(imported, name: str, cluster: Cluster) -> float:
    _, _, b, s = RUNS[name]
    one = dataclasses.replace(cluster, num_gpus=1, host_model="pytorch")
    return analyze_graph(imported, config(b, s), one, advise=False, timeline=False).summary["iteration_time_s"]


def main() -> None:
    measured = measured_steps()
    imported = {n: load_model(m, ImportOptions(batch_size=b, seq_len=s)) for n, (m, _, b, s) in RUNS.items()}
    base = get_cluster("dgx-h100", 1)
    plain = {n: step_s(imported[n], n, base) for n in RUNS}
    print("uncalibrated (dgx-h100): " + "; ".join(f"{n} {plain[n] * 1e3:.2f} ms ({plain[n] / measured[n] - 1:+.1%} against "
                                                 f"{measured[n] * 1e3:.2f} ms measured)" for n in RUNS))
    other_errors: dict[float, list[float]] = {0.3: [], 0.0: []}
    for holdout in (0.3, 0.0):
        print(f"\n--holdout {holdout:g}" + (" (the default: a class is used only when it beats the base on held-out shapes)"
                                            if holdout else " (every fitted value used)"))
        for fitted_on in (["gpt2-small"], ["llama-1b"], ["gpt2-small", "llama-1b"]):
            cal = calibrate([RUNS[n][1] for n in fitted_on], "dgx-h100", holdout)
            used = ", ".join(f"{k} {v:.4g}" for k, v in sorted(cal.cluster.gpu.calibrated_classes.items())) or "none (the base stays)"
            print(f"  calibrated on {' + '.join(fitted_on)}: classes used: {used}")
            if cal.guard is not None:
                print(f"    {guard_line(cal.guard)}")
            for n in RUNS:
                t = step_s(imported[n], n, cal.cluster)
                err, err0 = t / measured[n] - 1, plain[n] / measured[n] - 1
                tag = "own trace" if n in fitted_on else "other model (held out)"
                if n not in fitted_on:
                    other_errors[holdout].append(abs(err))
                worse = " WORSE than uncalibrated" if abs(err) > abs(err0) + 1e-9 else ""
                print(f"    {n:11s} {t * 1e3:7.2f} ms  {err:+6.1%} against measured  (uncalibrated {err0:+6.1%}; {tag}){worse}")
    for holdout, errs in other_errors.items():
        print(f"\nleave-one-trace-out, --holdout {holdout:g}: mean |error| {sum(errs) / len(errs):.1%} over {len(errs)} predictions "
              f"(uncalibrated: {sum(abs(plain[n] / measured[n] - 1) for n in RUNS) / len(RUNS):.1%})")


if __name__ == "__main__":
    main()
