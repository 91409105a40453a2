"""The measured one-GPU steps of ``benchmarks/data/gpu_steps/`` (H100 and H200, 16 shapes each;
PROVENANCE.md there) against the tool: each step predicted as a user runs it; each step
predicted from the bundled trace of its model on the same GPU (``--profile``: other micro-batch
sizes and sequence lengths from one trace); and each step with the cluster ``calibrate`` fits
on the GPU's two bundled traces (other models and precisions than the traces ran).

    PYTHONPATH=. python benchmarks/bench_gpu_steps.py                 # both tables
    PYTHONPATH=. python benchmarks/bench_gpu_steps.py --kernel-us 30,34,38,40,42,44,46
        # the pytorch host model's kernel_s swept over the steps, with leave-one-machine-out fits
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import dml2comm.cost.host as host
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig, Precision, Stack
from dml2comm.traces.predict import measured_and_modelled, profile_scale
from dml2comm.validate import gpu_steps

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "gpu_steps"
#: The exports and preset clusters of the ``gpu-steps`` validation source (one table).
MODELS = {name: f"dml2comm/validate/data/models/{file}" for name, file in gpu_steps.MODELS.items()}
IMAGES = gpu_steps.IMAGES
#: The measuring runs (two processes per machine): set 3 (``a``, ``b``: the four language models at
#: 16 shapes, on an H100 and an H200 machine), set 4 (``c``, ``d``: other architectures and AMP,
#: a third machine), set 5 (``e``, ``f``: host-bound steps of each architecture, a fourth
#: machine).  The pytorch host model is fitted on all of them.
FIT_RUNS = ("a", "b", "c", "d", "e", "f")
CLUSTERS = gpu_steps.CLUSTERS
#: The bundled trace of each model per GPU (its profiled shape).
TRACES = {"gpt2-small": ("gpt2-small_bf16_b8_s1024", 8, 1024), "llama-1b": ("llama-1b_bf16_b4_s2048", 4, 2048)}


def steps(with_validation: bool = True, runs: tuple[str, ...] = FIT_RUNS) -> list[tuple[str, str, str, int, int, float]]:
    """(gpu, model, mode, b, s, measured step s), the mean over every measurement of the step: the
    files of the measuring ``runs`` (two processes per GPU) and, ``with_validation``, the
    ``h100-steps`` validation source's earlier measurements of two of its H100 steps
    (2026-11-27, another machine)."""
    groups: dict[tuple, list[float]] = {}
    for gpu in CLUSTERS:
        for f in sorted(p for run in runs for p in DATA.glob(f"{gpu}_{run}.json")):
            for r in json.loads(f.read_text())["runs"]:
                groups.setdefault((gpu, r["name"], r["mode"], r["micro_batch"], r["seq"]), []).append(r["step_s_median"])
    if with_validation:
        for r in json.loads((ROOT / "dml2comm/validate/data/h100_steps.json").read_text())["runs"]:
            if "host_issue_s_median" not in r:  # not one of the repeats the files above already hold
                groups[("h100", r["name"], r["mode"], r["micro_batch"], r["seq"])].append(r["step_s_median"])
    return [(*k, statistics.mean(v)) for k, v in groups.items() if k[1] in MODELS]


def config(b: int, s: int | None, mode: str) -> ParallelConfig:
    seq = {} if s is None else {"seq_len": s}
    return ParallelConfig(micro_batch_size=b, global_batch_size=b, dtype="bf16", optimizer="adamw", stack=Stack.PYTORCH,
                          precision=Precision(mode), inputs_on_gpu=True, **seq)  # the measuring script makes them there


_imported: dict = {}


def predict(gpu: str, name: str, mode: str, b: int, s: int, scale=None) -> float:
    """The step time the tool predicts (the pytorch stack's host model, or the trace's with ``scale``)."""
    return predict_summary(gpu, name, mode, b, s, scale)["iteration_time_s"]


def predict_summary(gpu: str, name: str, mode: str, b: int, s: int, scale=None):
    """The analysis's summary of :func:`predict`'s step (its time and its expected error)."""
    if (name, b, s) not in _imported:
        options = ImportOptions(batch_size=b) if name in IMAGES else ImportOptions(batch_size=b, seq_len=s)
        _imported[(name, b, s)] = load_model(str(ROOT / MODELS[name]), options)
    cluster = dataclasses.replace(get_cluster(CLUSTERS[gpu], 1), collective_overhead_s=0.0, host_model="pytorch", profile_scale=scale)
    return analyze_graph(_imported[(name, b, s)], config(b, None if name in IMAGES else s, mode), cluster, advise=False,
                         timeline=False).summary


def with_kernel_s(kernel_s: float) -> None:
    """Swap the pytorch preset's ``kernel_s`` (this process only)."""
    model = dataclasses.replace(host.PYTORCH, kernel_s=kernel_s)
    host.HOST_MODELS = {**host.HOST_MODELS, "pytorch": model}


def table() -> None:
    for title, rows in (("Each step as a user runs it (--stack pytorch --precision MODE --optimizer adamw, d=t=p=1); "
                         "set 3, four language models on an H100 and an H200 machine:", steps(True, ("a", "b"))),
                        ("\nSet 4, other architectures and AMP (a third H100 machine):", steps(False, ("c", "d"))),
                        ("\nSet 5, host-bound steps of each architecture (a fourth H100 machine):", steps(False, ("e", "f")))):
        print(title)
        errors = []
        for gpu, name, mode, b, s, measured in rows:
            t = predict(gpu, name, mode, b, s)
            errors.append(abs(t / measured - 1))
            print(f"  {gpu} {name:11s} {mode:4s} b={b:3d} s={s:4d}  measured {measured * 1e3:7.2f} ms  predicted {t * 1e3:7.2f} ms  "
                  f"{t / measured - 1:+6.1%}")
        print(f"  mean |error| {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(errors)} steps")


def profiled() -> None:
    print("\nFrom the bundled trace of the model on the same GPU (--profile TRACE), other shapes:")
    errors, inside = [], 0
    for gpu in CLUSTERS:
        for name, (stem, tb, ts) in TRACES.items():
            parts = measured_and_modelled(str(DATA / f"{gpu}_trace_{stem}.json.gz"), str(ROOT / MODELS[name]), config(tb, ts, "bf16"))
            scale = profile_scale([parts], "pytorch")
            for g, n, mode, b, s, measured in steps(False, ("a", "b")):  # the machines the traces were taken on
                if (g, n, mode) != (gpu, name, "bf16"):
                    continue
                summary = predict_summary(gpu, name, mode, b, s, scale)
                t, band = summary["iteration_time_s"], summary["expected_error"]
                errors.append(abs(t / measured - 1))
                inside += errors[-1] <= band
                own = " (the profiled shape)" if (b, s) == (tb, ts) else ""
                print(f"  {gpu} {name:11s} b={b:2d} s={s:4d} from b={tb} s={ts}: measured {measured * 1e3:7.2f} ms  predicted {t * 1e3:7.2f} ms  "
                      f"{t / measured - 1:+6.1%} (band ±{band:.1%}){own}")
    print(f"  mean |error| {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(errors)} steps; {inside} inside their band")


#: The bundled traces of set 4's other architectures (an H100; machine ``c``), two shapes each.
OTHER_TRACES = {"resnet18": ("resnet18_bf16_b{b}_s224", (128, 256), 224), "bert-6l-512": ("bert-6l-512_bf16_b{b}_s128", (64, 128), 128)}


def other_architecture_rows() -> list[tuple[str, int, int, float, float, float]]:
    """Each bundled set-4 trace of an image model and an encoder (``OTHER_TRACES``) predicting
    both of its model's shapes (--profile, the trace's host model), against the mean of set 4's
    two measuring processes: (model, b, profiled b, measured s, predicted s, band) per pair."""
    rows = []
    measured = {(n, b): m for g, n, mode, b, s, m in steps(False, ("c", "d")) if g == "h100" and mode == "bf16"}
    for name, (stem, shapes, s) in OTHER_TRACES.items():
        for tb in shapes:
            parts = measured_and_modelled(str(DATA / f"h100_trace_{stem.format(b=tb)}.json.gz"), str(ROOT / MODELS[name]),
                                          config(tb, None if name in IMAGES else s, "bf16"))
            scale = profile_scale([parts], "pytorch")
            for b in shapes:
                summary = predict_summary("h100", name, "bf16", b, s, scale)
                rows.append((name, b, tb, measured[(name, b)], summary["iteration_time_s"], summary["expected_error"]))
    return rows


def other_architectures() -> None:
    print("\nOther architectures from their bundled H100 traces (set 4, measured: the mean of its two processes):")
    errors = []
    for name, b, tb, m, t, band in other_architecture_rows():
        errors.append(abs(t / m - 1))
        own = " (the profiled shape)" if b == tb else ""
        print(f"  h100 {name:11s} b={b:3d} from b={tb:3d}: measured {m * 1e3:7.2f} ms  predicted {t * 1e3:7.2f} ms  {t / m - 1:+6.1%} "
              f"(band ±{band:.1%}){own}")
    print(f"  mean |error| {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(errors)} steps")


def unseen_model_rows() -> list[tuple[str, str, float, float, float]]:
    """GPT-2 medium, a model none of the tool's constants was fitted on before its steps joined
    the bundled ones (two of 49): each GPU's bundled trace (set 3's first process, b = 8,
    s = 1,024) predicting the step on its own GPU and on the other, against the mean of the two
    processes: (trace's GPU, predicted GPU, measured s, predicted s, band) per pair."""
    measured = {g: m for g, n, mode, b, s, m in steps(False, ("a", "b")) if n == "gpt2-medium"}
    rows = []
    for src in CLUSTERS:
        parts = measured_and_modelled(str(DATA / f"{src}_trace_gpt2-medium_bf16_b8_s1024.json.gz"), str(ROOT / MODELS["gpt2-medium"]),
                                      config(8, 1024, "bf16"))
        scale = profile_scale([parts], "pytorch")
        for dst in CLUSTERS:
            summary = predict_summary(dst, "gpt2-medium", "bf16", 8, 1024, scale)
            rows.append((src, dst, measured[dst], summary["iteration_time_s"], summary["expected_error"]))
    return rows


def unseen_model() -> None:
    print("\nGPT-2 medium (24 layers, h 1024) from its bundled trace on each GPU, b = 8 s = 1024 "
          "(measured: the mean of set 3's two processes):")
    for src, dst, m, t, band in unseen_model_rows():
        where = "its own step" if src == dst else "the other GPU"
        print(f"  {src} trace -> {dst}: measured {m * 1e3:7.2f} ms  predicted {t * 1e3:7.2f} ms  {t / m - 1:+6.1%} "
              f"(band ±{band:.1%}; {where})")


def gpu_side_rows() -> list[tuple[str, int, int, float, float]]:
    """The GPU side of the shape transfer alone: each bundled GPT-2 small trace (b = 2 and b = 8,
    s = 1,024, on each GPU) scales the kernel times of the other's shape, with no host model,
    against the other trace's own GPU time (its kernels, memsets and copies, from the join):
    what the ratios carry, without the CPU speed of the timed process.  (gpu, to b, from b,
    traced s, predicted s) per pair."""
    rows = []
    for gpu in CLUSTERS:
        shapes = {b: measured_and_modelled(str(DATA / f"{gpu}_trace_gpt2-small_bf16_b{b}_s1024.json.gz"),
                                           str(ROOT / MODELS["gpt2-small"]), config(b, 1024, "bf16")) for b in (2, 8)}
        for src, dst in ((2, 8), (8, 2)):
            scale = dataclasses.replace(profile_scale([shapes[src]], "pytorch"), host=host.NONE)
            rows.append((gpu, dst, src, shapes[dst]["gpu_s"], predict(gpu, "gpt2-small", "bf16", dst, 1024, scale)))
    return rows


def gpu_side() -> None:
    print("\nGPU time only (no host model), each bundled GPT-2 small trace's ratios at the other bundled shape:")
    errors = []
    for gpu, dst, src, traced, t in gpu_side_rows():
        errors.append(abs(t / traced - 1))
        print(f"  {gpu} gpt2-small b={dst} from b={src}: traced GPU time {traced * 1e3:7.2f} ms  predicted {t * 1e3:7.2f} ms  {t / traced - 1:+6.1%}")
    print(f"  mean |error| {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(errors)} pairs")


def calibrated() -> None:
    """``calibrate`` on each GPU's two bundled traces (GPT-2 small b=8, Llama-1B b=4), then every
    measured step on that GPU with the calibrated cluster against the plain preset."""
    from dml2comm.calibrate.calibration import calibrate

    print("\nFrom calibrate on the GPU's two bundled traces (default held-out check, --holdout 0.3):")
    for gpu in CLUSTERS:
        traces = [str(DATA / f"{gpu}_trace_{stem}.json.gz") for stem, _, _ in TRACES.values()]
        cal = calibrate(traces, CLUSTERS[gpu], 0.3).cluster
        plain, fitted = [], []
        for g, name, mode, b, s, measured in steps(False, ("a", "b", "c", "d")):
            if g != gpu:
                continue
            t0 = predict(gpu, name, mode, b, s)
            cluster = dataclasses.replace(cal, num_gpus=1, collective_overhead_s=0.0, host_model="pytorch")
            t1 = analyze_graph(_imported[(name, b, s)], config(b, None if name in IMAGES else s, mode), cluster, advise=False,
                               timeline=False).summary["iteration_time_s"]
            plain.append(abs(t0 / measured - 1))
            fitted.append(abs(t1 / measured - 1))
            other = "" if name in TRACES and mode == "bf16" else "  (a model or precision no trace ran)"
            print(f"  {gpu} {name:11s} {mode:4s} b={b:3d} s={s:4d}: calibrated {t1 / measured - 1:+6.1%}, preset {t0 / measured - 1:+6.1%}{other}")
        classes = dict(cal.gpu.calibrated_classes)
        print(f"  {gpu}: mean |error| calibrated {statistics.mean(fitted):.1%}, preset {statistics.mean(plain):.1%}; "
              f"classes kept: {', '.join(f'{k} {v:.3f}' for k, v in classes.items()) or 'none'}")


#: The machines of the measuring runs (GPU, runs): each lent machine had its own CPU speed.
MACHINES = {"set 3, H100": ("h100", ("a", "b")), "set 3, H200": ("h200", ("a", "b")), "set 4": ("h100", ("c", "d")),
            "set 5": ("h100", ("e", "f"))}


def sweep(values_us: list[float]) -> None:
    """The pytorch host model's ``kernel_s`` over every measured step, and left out one machine at
    a time (the others' optimum on the left-out machine's steps)."""
    rows = steps()
    per_machine = {m: [r for r in steps(False, runs) if r[0] == gpu] for m, (gpu, runs) in MACHINES.items()}
    err = {}
    for v in values_us:
        with_kernel_s(v * 1e-6)
        for r in rows + [r for rs in per_machine.values() for r in rs]:
            err[(r, v)] = abs(predict(*r[:5]) / r[5] - 1)
        e = [err[(r, v)] for r in rows]
        by = ", ".join(f"{m} {statistics.mean(err[(r, v)] for r in rs):.1%}" for m, rs in per_machine.items())
        print(f"kernel_s {v:5.1f} us: mean |error| {statistics.mean(e):.2%}, worst {max(e):.2%} over {len(rows)} steps ({by})")
    for held, rs in per_machine.items():
        rest = [r for m, other in per_machine.items() if m != held for r in other]
        best = min(values_us, key=lambda v: statistics.mean(err[(r, v)] for r in rest))
        own = min(values_us, key=lambda v: statistics.mean(err[(r, v)] for r in rs))
        print(f"  {held} left out: the others' best {best:.1f} us predicts its {len(rs)} steps at "
              f"{statistics.mean(err[(r, best)] for r in rs):.1%} mean (its own best, {own:.1f} us: "
              f"{statistics.mean(err[(r, own)] for r in rs):.1%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel-us", help="comma-separated kernel_s values (us) to sweep instead of the tables")
    args = ap.parse_args()
    if args.kernel_us:
        sweep([float(v) for v in args.kernel_us.split(",")])
    else:
        table()
        profiled()
        other_architectures()
        unseen_model()
        gpu_side()
        calibrated()


if __name__ == "__main__":
    main()
