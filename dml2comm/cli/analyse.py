"""The main command: ``python main.py MODEL.onnx --d 2 --p 4 --t 2`` analyses one plan, writes
``--out`` (data.json, trace.json, the site) and prints the summary.

:func:`analyse_and_publish` is the command without its printing: ``sweep --build-top`` and
``compare --build-top`` run it with the command line they show (:mod:`dml2comm.cli.search`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from dml2comm.cli.commands import COMMANDS
from dml2comm.cli.args import (DTYPE_CHOICES, ZERO_STAGES, OneLineParser, add_hardware_arguments, add_stack_arguments, check_cp_scheme,
                               check_virtual_stages, finite_float, host_model_of, micro_batch_size, non_negative_int, positive_int, positive_int_up_to,
                               profiled_precision, resolve_gpus_per_node, sequence_length, stack_kwargs)
from dml2comm.export.files import check_output_folder, publish_files
from dml2comm.errors import ConfigError, Terminated
from dml2comm.parallel.config import CP_SCHEMES, MAX_SEQ_LEN, OPTIMIZERS, RECOMPUTE_MODES, SCHEDULES, Precision
from dml2comm.traces.predict import profile_from_args

__all__ = ["EXAMPLES", "SUBCOMMANDS", "analyse_and_publish", "analysis_parser", "run_analysis"]

EXAMPLES = """examples (each runs as written from the repository root; outputs go to out/):
  python main.py examples/gpt2-small.onnx --d 2 --p 4 --t 2
  python main.py examples/gpt2-small.onnx --d 8 --t 4 --p 4 --micro-batch-size 1 --global-batch-size 1536 --seq-len 1024 --gpu a100
  python main.py examples/gpt2-small.onnx --d 2 --t 4 --sequence-parallel --zero 1 --json --no-site
  python main.py examples/gpt2-small.onnx --dim batch=4 --cluster dgx-h100
  python main.py zoo gpt --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq-len 2048 -o out/gpt3.onnx
  python main.py collective --op all_reduce --cluster dgx-a100 --n 16 --size 256MiB --verbose
  python main.py sweep examples/gpt2-small.onnx --gpus 64 --global-batch-size 512 --t 1,2,4 --max-p 16 --workers 2
  python main.py compare examples/gpt2-small.onnx --global-batch-size 64 --configs "d=2,t=2,p=4" "d=4,t=2,p=2,b=2,zero=1"
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --processes 2
  python main.py validate --source vtrain --sample 100
  python main.py presets
"""

SUBCOMMANDS = tuple(COMMANDS)

#: ``--dim`` values, bounded as ``--seq-len`` is (:data:`~dml2comm.parallel.config.MAX_SEQ_LEN`,
#: above :data:`~dml2comm.parallel.config.MAX_MICRO_BATCH`) before the model is bound to them.
_DIM_VALUE = positive_int_up_to(MAX_SEQ_LEN, "2**22: no batch, sequence or image side of a real run is longer")
#: The largest ``--capacity-factor``: an expert buffer of c x its even share holds every routed
#: token at c = E / k, and E is at most 4,096 (the zoo's bound on experts), so a larger c only pads.
MAX_CAPACITY_FACTOR = 4096.0


def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, _DIM_VALUE(value)


def analysis_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python main.py",
        description="Plan, cost and draw the distributed training of an ONNX model.",
        epilog=EXAMPLES + "\nsubcommands: " + ", ".join(SUBCOMMANDS) + " (python main.py SUBCOMMAND --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="the ONNX model (.onnx); weights may be absent external data")
    g = p.add_argument_group("parallelism")
    g.add_argument("--d", type=positive_int, default=1, help="data-parallel size (default 1)")
    g.add_argument("--t", type=positive_int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--p", type=positive_int, default=1, help="pipeline-parallel size (default 1)")
    g.add_argument("--cp", type=positive_int, default=1, help="context-parallel size c: the sequence split c-way (default 1)")
    g.add_argument("--cp-scheme", default=None, choices=CP_SCHEMES,
                   help="context parallelism: ulysses (AllToAll of Q/K/V/output; default) or ring (K/V Send/Recv ring attention); "
                        "needs --cp 2 or more")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel size e for MoE models: experts placed e-way, carved out of d x c (default 1)")
    g.add_argument("--capacity-factor", type=finite_float(maximum=MAX_CAPACITY_FACTOR, why="E / k at the zoo's 4,096 experts"),
                   default=None, help="MoE expert capacity factor: padded expert buffers and AllToAlls (default 1.0, DeepSpeed MoE); "
                                      "refused on a model without experts")
    g.add_argument("--gpus", type=positive_int, help="total GPUs, cross-checked against d*t*p*c")
    g.add_argument("--schedule", default="1f1b", choices=SCHEDULES)
    g.add_argument("--virtual-stages", type=positive_int, default=1, help="model chunks per GPU (interleaved)")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --t)")
    g.add_argument("--zero", type=non_negative_int, default=0, choices=ZERO_STAGES, help="ZeRO stage (default 0)")
    g.add_argument("--recompute", default="none", choices=RECOMPUTE_MODES)
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="overlap the sequence-parallel all-gather/reduce-scatter with their GEMMs (Megatron --tp-comm-overlap)")
    g.add_argument("--no-async-tp-allreduce", action="store_true",
                   help="wait for the backward tensor-parallel all-reduce instead of overlapping it with the weight-gradient "
                        "GEMM (Megatron --no-async-tensor-model-parallel-allreduce; Megatron-LM of 2021)")
    g.add_argument("--no-gradient-accumulation-fusion", action="store_true",
                   help="add every gradient to its accumulation buffer in a separate pass per micro-batch instead of in the "
                        "weight-gradient GEMM (Megatron --no-gradient-accumulation-fusion; the Megatron-LM of 2021)")
    g.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="reduce gradients after the backward pass instead of overlapping it (Megatron-LM before 2023)")
    g.add_argument("--grad-reduce-dtype", choices=DTYPE_CHOICES,
                   help="dtype of the gradient all-reduce (default: the training dtype; fp32 = Megatron --accumulate-allreduce-grads-in-fp32)")
    g.add_argument("--dropout", type=finite_float(), default=None,
                   help="training dropout to assume for exports without Dropout nodes (memory of its masks; default 0); "
                        "refused on an export with Dropout nodes, whose masks are counted already")
    g.add_argument("--rank-order", default="tdp", help="rank order, fastest first (default tdp: Megatron)")
    b = p.add_argument_group("batch and precision")
    b.add_argument("--micro-batch-size", "--batch-size", dest="micro_batch_size", type=micro_batch_size,
                   help="micro-batch size b; binds the model's symbolic batch axis (default: the model's own batch, else 1)")
    b.add_argument("--global-batch-size", type=positive_int, help="global batch B (default: b x d x p, enough micro-batches to fill the pipeline)")
    b.add_argument("--seq-len", type=sequence_length,
                   help="sequence length; binds the symbolic sequence axis (refused on a fixed-length export unless equal, "
                        "and above the model's position table)")
    b.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbolic input dim by name (--dim seq=512), or a dim without a name by input and axis "
                        "(--dim image:2=32); a name the model lacks is refused with the list of its dims")
    b.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES, help="training dtype (default bf16)")
    add_stack_arguments(b)
    add_hardware_arguments(p, main=True)
    o = p.add_argument_group("output")
    o.add_argument("--out", default="out", help="output folder (default: out/; the other commands write to out/sweep, "
                   "out/compare, out/trace, out/validate, so none replaces another's files)")
    o.add_argument("--no-site", action="store_true", help="stop after data.json")
    o.add_argument("--serve", action="store_true", help="after building, serve the site on 127.0.0.1 (a free port) until Ctrl-C")
    o.add_argument("--json", action="store_true", help="also print the summary as JSON on stdout")
    o.add_argument("--no-advice", action="store_true",
                   help="skip the re-analysed speed recommendations and memory suggestions (faster)")
    o.add_argument("--tie-embeddings", action="store_true",
                   help="count a legacy export's transposed copy of the embedding (tied LM head, e.g. GPT-2) once; refused on "
                        "an export that stores no such copy")
    o.add_argument("--lenient", action="store_true", help="cost ops that have no cost rule as memory-bound, with a warning (If/Loop/Scan need no flag)")
    o.add_argument("--config", help="YAML file of options (keys as the long flags, e.g. micro_batch_size: 4); flags win")
    return p


def _load_config_defaults(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    if "--config" not in argv and not any(a.startswith("--config=") for a in argv):
        return
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    path = Path(known.config)
    if not path.is_file():
        raise ConfigError(f"--config file not found: {str(path)!r}")
    import yaml

    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_decimal_loader()) or {}
    except _NotDecimal as exc:
        raise ConfigError(f"--config {path.name!r} line {exc.line}: {exc.text} is a YAML 1.1 number in another base or with "
                          f"separators (read as {exc.value!r}); write it in plain decimal digits") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path.name!r} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path.name!r} is not a text file (YAML in UTF-8): give a configuration file, "
                          "e.g. one line 'd: 2'") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path.name!r} must hold a mapping of option names to values")
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    defaults = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_").lstrip("_")
        if dest not in actions:
            raise ConfigError(f"--config {path.name!r}: unknown option {key!r}; use the long flag names without dashes, e.g. d: 2")
        if value is None:
            continue  # "d:" with no value (YAML null): the option's default, as if the key were left out
        defaults[dest] = _config_value(actions[dest], key, value, path.name)
    parser.set_defaults(**defaults)


class _NotDecimal(Exception):
    """A ``--config`` number written other than in plain decimal: ``text`` at ``line``, which YAML
    1.1 reads as ``value``."""

    def __init__(self, text: str, value: Any, line: int) -> None:
        super().__init__(text)
        self.text, self.value, self.line = text, value, line


def _decimal_loader() -> Any:
    """``yaml.SafeLoader`` refusing (:class:`_NotDecimal`) the numbers YAML 1.1 reads in other bases
    or with separators: ``0x10`` (16), ``010`` (8), ``0b10``, ``1_000``, ``1:30`` (90 seconds),
    ``1_000.5``.  Read silently they set ``d: 0x10`` to 16, which the flag ``--d 0x10`` refuses."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def number(loader: yaml.SafeLoader, node: Any) -> Any:
        is_int = node.tag.endswith(":int")
        value = loader.construct_yaml_int(node) if is_int else loader.construct_yaml_float(node)
        plain = re.fullmatch(r"[-+]?(0|[1-9][0-9]*)", node.value) if is_int else not re.search(r"[_:]", node.value)
        if not plain:
            raise _NotDecimal(node.value, value, node.start_mark.line + 1)
        return value

    Loader.add_constructor("tag:yaml.org,2002:int", number)
    Loader.add_constructor("tag:yaml.org,2002:float", number)
    return Loader


def _config_value(action: argparse.Action, key: Any, value: Any, file_name: str) -> Any:
    """Check one ``--config`` value as the command line would (type and choices): argparse
    converts only string defaults, so a YAML ``d: 0`` or ``t: 1.5`` would otherwise reach the
    configuration unchecked and be reported by its internal field name (``dp_size``)."""
    flag = next((o for o in action.option_strings if o.startswith("--")), str(key))
    where = f"--config {file_name!r}: {key}"
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false (the flag {flag}), got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):  # --dim: a list of NAME=VALUE or a mapping
        items = [f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else value if isinstance(value, list) else [value]
        return [_config_item(action, flag, where, item) for item in items]
    if value is None:
        return None
    return _config_item(action, flag, where, value)


def _config_item(action: argparse.Action, flag: str, where: str, value: Any) -> Any:
    if isinstance(value, (list, dict)):
        raise ConfigError(f"{where} must be a single value, as in {flag} VALUE; got {value!r}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    converted: Any = text
    if action.type is not None:
        try:
            converted = action.type(text)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc} (as {flag} on the command line)") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{where}: {value!r} is not one of {choices} (as {flag} on the command line)")
    return converted


def run_analysis(argv: Sequence[str]) -> int:
    start = time.perf_counter()
    args, analysis, site = analyse_and_publish(argv)
    elapsed = time.perf_counter() - start
    if args.json:
        from dml2comm.export.report import report_dict

        print(json.dumps(report_dict(analysis)["summary"], sort_keys=True))
    else:
        _print_summary(analysis, Path(args.out), elapsed, site=site)
    if args.serve:
        return _serve(Path(args.out) / "site")
    return 0


def _refuse_contradictions(args: argparse.Namespace, num_gpus: int) -> None:
    """Flags that contradict each other or would change nothing, refused before the model is read
    (an unset ``--gpus-per-node`` takes its default here: :func:`~dml2comm.cli.args.resolve_gpus_per_node`)."""
    if args.gpus is not None and args.gpus != num_gpus:
        if args.cp == 1:
            raise ConfigError(f"--gpus {args.gpus} does not equal d*t*p = {args.d}*{args.t}*{args.p} = {num_gpus}; change --d/--t/--p or --gpus")
        raise ConfigError(f"--gpus {args.gpus} does not equal d*t*p*c = {args.d}*{args.t}*{args.p}*{args.cp} = {num_gpus}; "
                          "change --d/--t/--p/--cp or --gpus")
    if args.serve and args.no_site:
        raise ConfigError("--serve needs the site; drop --no-site")
    if args.sequence_parallel and args.t == 1:
        raise ConfigError("--sequence-parallel needs tensor parallelism; add --t 2 or more")
    if args.no_async_tp_allreduce and args.t == 1:
        raise ConfigError("--no-async-tp-allreduce changes tensor parallelism's backward all-reduce, which t = 1 has none of; "
                          "add --t 2 or more, or drop it")
    check_virtual_stages(args.virtual_stages, args.schedule, args.p)
    check_cp_scheme(args.cp_scheme, args.cp, "--cp 1 does not run", "add --cp 2 or more, or drop --cp-scheme")
    resolve_gpus_per_node(args)
    if args.step_time is not None and not args.profile:
        raise ConfigError("--step-time scales a profiled step's host figures; add --profile TRACE of that step")
    if args.step_time is not None and args.host_model is not None:
        raise ConfigError(f"--step-time scales the host figures of the --profile trace, which --host-model {args.host_model} replaces; drop one")


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The :class:`~dml2comm.parallel.config.ParallelConfig` keywords of the flags ``names`` that
    were given (None: left out, so the configuration's default holds)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _load_checked(args: argparse.Namespace, options: Any) -> Any:
    """The model imported with ``options``, refused where ``--dim`` and ``--micro-batch-size`` bind
    its batch apart, or ``--seq-len`` does not fit it."""
    from dml2comm.ir.onnx_import import check_seq_len
    from dml2comm.load import load_model

    imported = load_model(args.model, options)
    if args.dim and args.micro_batch_size is not None and imported.model_batch not in (None, args.micro_batch_size):
        raise ConfigError(f"--dim binds the batch axis to {imported.model_batch}, --micro-batch-size to {args.micro_batch_size}; "
                          "give the micro-batch once (--micro-batch-size)")
    check_seq_len(imported, args.seq_len)
    _refuse_idle_model_flags(args, imported)
    return imported


def _refuse_idle_model_flags(args: argparse.Namespace, imported: Any) -> None:
    """Flags the imported model gives nothing to act on, refused rather than ignored:
    ``--capacity-factor`` without experts, ``--dropout`` beside the export's own Dropout nodes (the
    memory model then counts those: :class:`dml2comm.cost.memory.ActivationModel`) and
    ``--tie-embeddings`` where the export stores no copy of an embedding table."""
    from dml2comm.ir.onnx_import import tied_copies
    from dml2comm.parallel.expert import is_expert_scope

    graph = imported.graph
    if args.capacity_factor is not None and not any(is_expert_scope(op.scope) for op in graph.ops):
        raise ConfigError(f"--capacity-factor {args.capacity_factor:g} pads the expert buffers of a mixture-of-experts model; this "
                          "model has no experts (no ops under an 'experts' scope): drop --capacity-factor")
    dropouts = sum(op.op_type == "Dropout" for op in graph.ops)
    if args.dropout is not None and dropouts:
        raise ConfigError(f"--dropout {args.dropout:g} assumes the masks of an export without Dropout nodes; this export has "
                          f"{dropouts} Dropout node(s) of its own, whose masks are counted: drop --dropout")
    if args.tie_embeddings and not tied_copies(graph):
        raise ConfigError("--tie-embeddings counts a legacy export's stored copy of a tied embedding once, but this export stores no "
                          "such copy (a dynamo export keeps a tied head as the embedding itself, an untied head stays a parameter): "
                          "drop --tie-embeddings")


def analyse_and_publish(argv: Sequence[str]) -> tuple[argparse.Namespace, Any, Any]:
    """The main command without its printing: parse ``argv`` as ``python main.py`` does, analyse,
    and write ``--out`` (data.json, trace.json and, unless ``--no-site``, svg_file/ and site/).
    Returns (arguments, Analysis, site build statistics or None).  ``sweep --build-top`` and
    ``compare --build-top`` call it with the command line they show, so a linked site is exactly
    what that command writes."""
    parser = analysis_parser()
    _load_config_defaults(parser, argv)
    args = parser.parse_args(argv)
    check_output_folder(args.out)  # before any work: an --out that is a file, or cannot be written
    from dml2comm.advice import config_warnings
    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import plan_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model
    from dml2comm.parallel.config import ParallelConfig

    num_gpus = args.d * args.t * args.p * args.cp
    _refuse_contradictions(args, num_gpus)
    options = ImportOptions(batch_size=args.micro_batch_size, seq_len=args.seq_len, dims=dict(args.dim), lenient=args.lenient,
                            tie_embeddings=args.tie_embeddings)
    imported = _load_checked(args, options)
    micro = args.micro_batch_size or imported.model_batch or 1
    seq = args.seq_len
    if seq is None:
        for name in imported.graph.inputs:
            t = imported.graph.tensors[name]
            if not t.dtype.is_float and t.rank == 2:
                seq = t.shape[1]
                break
    global_batch = args.global_batch_size or micro * args.d * args.p
    config = ParallelConfig(
        dp_size=args.d, tp_size=args.t, pp_size=args.p, micro_batch_size=micro, global_batch_size=global_batch,
        seq_len=seq, dtype=args.dtype, schedule=args.schedule, virtual_stages=args.virtual_stages,
        zero_stage=args.zero, sequence_parallel=args.sequence_parallel, recompute=args.recompute,
        optimizer=args.optimizer, rank_order=args.rank_order,
        overlap_grad_reduce=not args.no_overlap_grad_reduce, grad_reduce_dtype=args.grad_reduce_dtype,
        tp_comm_overlap=args.tp_comm_overlap, async_tp_allreduce=not args.no_async_tp_allreduce,
        grad_accumulation_fusion=not args.no_gradient_accumulation_fusion, cp_size=args.cp, ep_size=args.ep,
        **_given(args, "cp_scheme", "capacity_factor", "dropout"), **stack_kwargs(args),
    )
    cluster = plan_cluster(args.gpu, args.cluster, num_gpus, args.gpus_per_node, nics_per_node=args.nics_per_node,
                           topology=args.topology)
    def reimport(batch: int):  # the same model bound to another micro-batch size (recommendations)
        return load_model(args.model, replace(options, batch_size=batch))

    # The presets' fitted per-call overhead is host time of a standalone, timed call; training
    # launches collectives asynchronously, so the analysis uses kernel time unless told otherwise.
    cluster = replace(cluster, collective_overhead_s=args.collective_overhead_us * 1e-6,
                      host_model=host_model_of(args),
                      profile_scale=profile_from_args(args.profile, args.model, config, options, args.lenient, args.step_time,
                                                      fit_host=args.host_model is None, gpu=cluster.gpu.name))
    analysis = analyze_graph(imported, config, cluster, args.model, lenient=args.lenient, advise=not args.no_advice,
                             reimport=reimport if imported.model_batch is None else None)
    slips = config_warnings(config, cluster)
    if slips:  # before data.json, the site and the summary are written from it
        analysis = replace(analysis, warnings=tuple(dict.fromkeys(analysis.warnings + slips)))
    if profiled_precision(args) is not None:  # the precision the profiled step ran, not the stack's default
        analysis = replace(analysis, assumptions=analysis.assumptions + (
            f"precision: {config.precision}, what the --profile trace ran (its fused AdamW updated "
            f"{'fp32' if config.precision == Precision.AMP else '16-bit'} parameters); --precision overrides",))
    if args.stack is None:  # say the default and the other choice (what runs the model decides the kernels)
        analysis = replace(analysis, assumptions=analysis.assumptions + (
            f"stack: megatron by default (Megatron-LM's fused kernels, {config.precision} precision, {config.attention} "
            "attention); for a model trained in eager PyTorch / Hugging Face pass --stack pytorch (with --precision amp or bf16)",))
    from dml2comm.export.chrome_trace import trace_json
    from dml2comm.export.report import report_json

    files = {"data.json": report_json(analysis), "trace.json": trace_json(analysis, analysis.timeline)}
    site = None
    if args.no_site:
        publish_files(Path(args.out), files)
    else:  # SVGs and site are built beside --out and published together with data.json
        from dml2comm.cli.progress import site_progress
        from dml2comm.site.build import build_and_publish

        site = build_and_publish(analysis, Path(args.out), files, progress=site_progress())
    return args, analysis, site


def _serve(site_dir: Path) -> int:
    from dml2comm.site.serve import make_server

    server, url = make_server(site_dir)
    try:  # the line inside: a signal right after it is the server's to catch
        print(f"serving {site_dir} at {url} (Ctrl-C stops)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    except Terminated:  # the outputs were written before serving began: they stay
        print(f"stopped (SIGTERM); the outputs in {site_dir.parent} stay", flush=True)
    finally:
        server.server_close()
    return 0


def _profile_rows(analysis: Any) -> list[tuple[str, str]]:
    """The summary's ``--profile`` row: the share of the compute the measured ratios scaled, and the ratios."""
    scale = analysis.cluster.profile_scale
    if scale is None:
        return []
    from dml2comm.traces.predict import attributed_share

    label = {"input": "input copy"}  # the PCIe read of the inputs: x0 where the step made none
    ratios = ", ".join(f"{label.get(k, k)} x{f:.2f}" + (f"/x{b:.2f}" if k not in ("optimizer", "input") else "")
                       for k, f, b in scale.ratios)
    files = ", ".join(f for f, _ in scale.files)
    rows = [("measured ratios (--profile)", f"{attributed_share(analysis):.0%} of the compute scaled by {files} "
                                            f"(measured / modelled, forward/backward: {ratios})")]
    host = dict(scale.detail).get("host")
    if scale.host is not None and host is not None:
        bound = ", ".join(f"{t['file']} {'host' if t['host_bound'] else 'GPU'}-bound"
                          + (f", {t['full_queue_launches']:,} launches into a full queue left out" if t.get("full_queue_launches") else "")
                          for t in host["traces"])
        slow = (f"; CPU side x{host['cpu_slowdown_factor']:.3f} for --step-time {host['step_time_s'] * 1e3:.2f} ms"
                if host["step_time_s"] is not None
                else f"; CPU side x{host['cpu_slowdown_factor']:.3f}, the profiler's measured median slowdown (--step-time measures a host-bound step's)")
        cpu = (f"{scale.host.kernel_s * 1e6:.1f} us CPU time" if scale.host.backward_kernel_s is None else
               f"{scale.host.kernel_s * 1e6:.1f} us (forward) and {scale.host.backward_kernel_s * 1e6:.1f} us (backward) CPU time")
        rows.append(("host model (--profile)", f"{cpu} and {scale.host.gap_s * 1e6:.2f} us GPU idle per kernel, from the trace ({bound}){slow}"))
    return rows


def _stage_table(analysis: Any, width: int) -> Any:
    """The summary's per-stage table: layers, parameters, times and memory of one GPU (a memory
    above the GPU's in red)."""
    from rich.text import Text

    from dml2comm.fmt import fmt_bytes, fmt_s
    from dml2comm.render.terminal import fit_table

    capacity = analysis.cluster.gpu.hbm_bytes
    stage_rows = []
    for stage in analysis.stages:
        layers = stage.layers
        mem = stage.memory
        total = fmt_bytes(mem["total_bytes"])
        stage_rows.append([
            str(stage.index), f"{layers[0]}-{layers[-1]}", f"{stage.params_per_gpu / 1e6:.1f}\u00a0M", fmt_s(stage.time_fwd_s),
            fmt_s(stage.time_bwd_s), fmt_s(stage.dp_time_s),
            fmt_bytes(mem["weights_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]), fmt_bytes(mem["activations_bytes"]),
            Text(total, style="red") if mem["total_bytes"] > capacity else total,
        ])
    return fit_table("stages (per micro-batch, one GPU)", ("stage", "layers", "params/GPU", "fwd", "bwd", "DP/iter",
                                                           "model states", "activations", "memory"), stage_rows, width)


def _print_summary(analysis: Any, out: Path, elapsed: float, site: Any) -> None:
    """The summary on stdout, laid out for the console's width (:mod:`dml2comm.render.terminal`:
    at 80 columns tables split or stack, every value whole)."""
    from rich.console import Console
    from rich.text import Text

    from dml2comm.analysis import comm_by_dim
    from dml2comm.fmt import fmt_bytes, fmt_s, fmt_share
    from dml2comm.render.terminal import console_width, fit_table, kv_table, line

    width = console_width()
    console = Console(highlight=False, width=width, soft_wrap=True)  # lines are wrapped by render.terminal.line: a long path stays whole
    cfg = analysis.config
    s = analysis.summary
    mi = analysis.model_info
    head = line(
        f"{mi['name']}: {mi['num_ops']} ops, {mi['num_layers']} layers ({mi['num_blocks']} blocks), "
        f"{mi['params'] / 1e6:.1f} M params | d={cfg.dp_size} t={cfg.tp_size} p={cfg.pp_size}"
        + (f" c={cfg.cp_size} ({cfg.cp_scheme})" if cfg.cp_size > 1 else "") + (f" e={cfg.ep_size}" if cfg.ep_size > 1 else "") + " on "
        f"{analysis.config.num_gpus} x {analysis.cluster.gpu.name} | b={cfg.micro_batch_size} B={cfg.global_batch_size} "
        f"m={cfg.num_micro_batches}" + (f" s={cfg.seq_len}" if cfg.seq_len else "") + f" {cfg.dtype} | {cfg.stack_text(mi.get('attention_cores', 1) > 0)}", width)
    head.stylize("bold", 0, len(mi["name"]))
    console.print(head)
    console.print(kv_table(f"iteration (simulated, {cfg.schedule} schedule)", [
        ("iteration time", fmt_s(s["iteration_time_s"])),
        ("expected error", f"±{s['expected_error']:.1%} ({s['expected_error_source']})"),
        ("compute (busiest stage)", fmt_s(s["compute_time_s"])),
        *_profile_rows(analysis),
        ("pipeline bubble", f"{fmt_s(s['bubble_time_s'])} ({s['bubble_fraction']:.1%} of the iteration; "
                            f"{s['bubble_ratio']:.3f} of the busiest stage's compute)"),
        ("communication (all stages)", f"{fmt_s(s['comm_time_s'])}, exposed {fmt_s(s['exposed_comm_time_s'])} "
                                       f"(busiest stage {fmt_s(s['comm_time_busiest_stage_s'])})"),
        ("optimizer step", fmt_s(s["optimizer_time_s"])),
        ("MFU", fmt_share(s["mfu"])),
        ("peak memory per GPU", fmt_bytes(s["peak_memory_bytes"])),
        ("tokens/s", f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "n/a"),
        ("bottleneck", s["bottleneck"] or "n/a"),
    ], width))
    console.print(_stage_table(analysis, width))
    memory = analysis.memory
    fits = "fits" if memory["fits"] else "does not fit"
    msg = line(f"peak {fmt_bytes(memory['peak_bytes'])} on stage {memory['peak_stage']} of {fmt_bytes(memory['capacity_bytes'])} "
               f"per GPU: {fits} (largest part: {memory['largest_contributor']})", width, prefix="memory:")
    if not memory["fits"]:
        start = msg.plain.find("does not fit")
        msg.stylize("red", start, start + len("does not fit"))
    console.print(msg)
    for sug in memory.get("suggestions", []):
        if sug["peak_bytes"] is not None:
            console.print(line(f"  {sug['change']}: peak {fmt_bytes(sug['peak_bytes'])}, {'fits' if sug['fits'] else 'still too large'}",
                               width, indent=4))
    comm_rows = [[dim, str(e["count"]), fmt_bytes(e["message_bytes"]), fmt_bytes(e["bytes_sent_per_gpu"]), fmt_s(e["time_s"])]
                 for dim, e in comm_by_dim(analysis).items() if e["count"]]
    if comm_rows:
        console.print(fit_table("communication per iteration (busiest GPU per dimension)",
                                ("dim", "count", "message bytes", "sent per GPU", "time"), comm_rows, width))
    for rec in analysis.recommendations[:3]:
        msg = line(f"{rec['change']}: {fmt_s(rec['iteration_time_s'])} ({rec['speedup']:.2f}x)"
                   + (f" ({rec['note'].split(';')[0]})" if rec.get("note") else "")
                   + ("" if rec["fits_in_memory"] else " but does not fit"), width, prefix="faster:")
        if not rec["fits_in_memory"]:
            msg.stylize("red", len(msg.plain) - len("but does not fit"))
        console.print(msg)
    if analysis.assumptions:  # the modelling choices, once, apart from what the user should act on
        console.print(Text("assumptions", style="bold"))
        for a in analysis.assumptions:
            console.print(line(a, width, prefix=" ", indent=4))
    for w in analysis.warnings:
        console.print(line(w, width, prefix="warning:", style="yellow"))
    console.print(line(f"wrote {out / 'data.json'} in {elapsed:.2f} s", width))
    if site is not None:
        console.print(line(
            f"site: open {(out / 'site' / 'index.html').resolve()} ({site.pages} pages; {site.drawings} drawings "
            f"in {out / 'svg_file'} from {site.layouts_run} Graphviz layouts)", width))
