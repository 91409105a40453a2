"""Shared argparse pieces of the commands (:mod:`dml2comm.cli`): the parser, the value types and
the argument groups more than one command takes, each written once.

Every bad argument becomes one :class:`~dml2comm.errors.ConfigError` line, which the caller
turns into ``error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import math
from typing import Any

from dml2comm.errors import ConfigError
from dml2comm.fmt import decimal_int

__all__ = ["OneLineParser", "add_hardware_arguments", "add_profile_argument", "add_stack_arguments", "check_cp_scheme", "check_gpus_per_node",
           "check_virtual_stages", "finite_float", "host_model_of", "micro_batch_size", "non_negative_int", "positive_int",
           "positive_int_up_to", "profiled_precision", "resolve_gpus_per_node", "sequence_length", "stack_kwargs", "suggest_options", "DEFAULT_GPUS_PER_NODE", "DTYPE_CHOICES", "ZERO_STAGES"]

#: ``--dtype`` (and ``--grad-reduce-dtype``) choices: the training dtypes of
#: :data:`dml2comm.parallel.config.DTYPES`, in its order (bf16, fp16, fp32).
DTYPE_CHOICES = ("bf16", "fp16", "fp32")
#: ``--zero`` choices: ZeRO stages 0 (off) to 3 (Rajbhandari et al. 2020, "ZeRO: Memory
#: Optimizations Toward Training Trillion Parameter Models", Sec. 5: P_os, P_os+g, P_os+g+p).
ZERO_STAGES = (0, 1, 2, 3)


def suggest_options(parser: argparse.ArgumentParser, message: str) -> str:
    """``unrecognized arguments: --pp 2`` -> `` (did you mean --p?)`` for each unknown flag that is
    close to one of ``parser``'s option strings (:func:`difflib.get_close_matches`); else ``""``."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    hints = []
    for token in message.split(":", 1)[1].split():
        flag = token.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    return f" ({'; '.join(hints)})" if hints else ""


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so every error is one line; an unknown
    flag close to a known one gets a suggestion (``--pp 2`` -> did you mean --p?).  With
    ``command`` (``collective``, ``validate``) the line names the command and its ``--help``."""

    def __init__(self, *args, command: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.command = command

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.command:
            raise ConfigError(f"{self.command}: {message}{suggest_options(self, message)} (see python main.py {self.command} --help)")
        raise ConfigError(f"{message}{suggest_options(self, message)} (see --help)")


#: The largest value a size flag takes (2**53: every integer up to it is exact in a float and
#: in data.json; ONNX dims are int64).  The plannable sizes are smaller still
#: (:data:`dml2comm.parallel.config.MAX_GPUS`, ``MAX_SCHEDULE_STEPS``).
MAX_SIZE = 2**53


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    try:
        value = decimal_int(text)  # plain digits: int() would also read '１６' and '1_6'
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=`` for sizes: a positive integer up to :data:`MAX_SIZE`."""
    value = _int_at_least(text, 1, "a positive integer")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2**53 = {MAX_SIZE:,}, got {text}")
    return value


def positive_int_up_to(limit: int, why: str):
    """argparse ``type=`` for a size with a bound of its own: a positive integer up to ``limit``
    (``why``: the bound's reason, said in the refusal)."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"expected a positive integer up to {limit:,} ({why}), got {text}")
        return value
    parse.__name__ = "positive integer"
    return parse


def micro_batch_size(text: str) -> int:
    """argparse ``type=`` for ``--micro-batch-size``: a positive integer up to
    :data:`~dml2comm.parallel.config.MAX_MICRO_BATCH`, refused by the flag's name before the model is read."""
    from dml2comm.parallel.config import MAX_MICRO_BATCH

    return positive_int_up_to(MAX_MICRO_BATCH, "2**20, far beyond any real micro-batch")(text)


def sequence_length(text: str) -> int:
    """argparse ``type=`` for ``--seq-len``: a positive integer up to
    :data:`~dml2comm.parallel.config.MAX_SEQ_LEN`, refused before the model is bound to it (an
    import bound to 10**9 tokens exhausted the memory)."""
    from dml2comm.parallel.config import MAX_SEQ_LEN

    return positive_int_up_to(MAX_SEQ_LEN, "2**22 tokens, far beyond any trained context")(text)


def non_negative_int(text: str) -> int:
    """argparse ``type=`` for a count that may be zero (``--build-top 0``)."""
    return _int_at_least(text, 0, "a whole number >= 0")


def finite_float(minimum: float = 0.0, maximum: float = math.inf, why: str = ""):
    """argparse ``type=`` for a quantity: a finite number of at least ``minimum`` and at most
    ``maximum`` (``why``: the upper bound's reason, said in the refusal); ``nan`` and ``inf`` are
    refused by the flag's name, not by an internal field's.  ASCII only, without underscores:
    ``float()`` also reads '１.５' and '1_0' (= 10)."""
    def parse(text: str) -> float:
        try:
            if not text.isascii() or "_" in text:
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"expected a finite number >= {minimum:g}, got {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a number up to {maximum:g} ({why}), got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


def add_stack_arguments(group) -> None:
    """``--stack``, ``--precision``, ``--attention`` and ``--inputs-on-gpu``: the training stack that
    runs the model (:class:`dml2comm.parallel.config.Stack`), its precision mode, its attention
    kernel and where its inputs come from.  One definition for the analysis, ``sweep`` and
    ``compare``."""
    from dml2comm.parallel.config import ATTENTION_KERNELS, PRECISIONS, STACKS

    group.add_argument("--stack", choices=STACKS, default=None,
                       help="what runs the model: megatron (Megatron-LM: fused point-wise kernels, fp32 master weights, "
                            "vocabulary-parallel fp32 loss; default) or pytorch (eager PyTorch / Hugging Face: one kernel "
                            "per op, SDPA flash attention, the loss as written)")
    group.add_argument("--precision", choices=PRECISIONS, default=None,
                       help="mixed (16-bit passes, fp32 master weights and Adam states: Megatron), amp (torch.autocast: "
                            "fp32 parameters, 16-bit GEMMs) or bf16 (everything bf16: model.to(torch.bfloat16)); "
                            "default: mixed with --stack megatron, amp with --stack pytorch (with --profile: what the "
                            "trace ran, read off its fused AdamW)")
    group.add_argument("--attention", choices=ATTENTION_KERNELS, default=None,
                       help="attention kernel: flash (one fused kernel, no score matrix in memory) or unfused (batched "
                            "GEMMs and softmax through memory); default: flash with --stack pytorch, unfused with "
                            "--stack megatron (its 2020-2022 runs; Megatron-Core with --use-flash-attn: flash)")
    group.add_argument("--inputs-on-gpu", action="store_true", default=None,
                       help="each micro-batch's inputs are on the GPU before its forward (made there, or copied ahead on "
                            "another stream): no host-to-device copy of them on the step's path (default: copied over "
                            "PCIe, as a data loader's .to(device) does)")


def stack_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~dml2comm.parallel.config.ParallelConfig` keywords of :func:`add_stack_arguments`'s
    flags that were given (the others keep the config's defaults, which follow the stack); under
    ``--stack pytorch`` with ``--profile`` and no ``--precision``, the precision the traces ran
    (:func:`profiled_precision`)."""
    kwargs = {name: getattr(args, name) for name in ("stack", "precision", "attention", "inputs_on_gpu")
              if getattr(args, name, None) is not None}
    traced = profiled_precision(args)
    if traced is not None:
        kwargs["precision"] = traced
    return kwargs


def profiled_precision(args: argparse.Namespace) -> str | None:
    """The eager-PyTorch precision the ``--profile`` traces ran (their fused AdamW's parameters:
    :func:`dml2comm.traces.predict.traced_precision`) where it decides the plan's: ``--stack
    pytorch``, no ``--precision``; else None.  Read once per command."""
    from dml2comm.parallel.config import Stack

    stack = getattr(args, "stack", None)
    if getattr(args, "precision", None) is not None or stack is None or Stack.of(stack) is not Stack.PYTORCH \
            or not getattr(args, "profile", None):
        return None
    if not hasattr(args, "_traced_precision"):
        from dml2comm.traces.predict import traced_precision

        args._traced_precision = traced_precision(args.profile)
    return args._traced_precision


def add_profile_argument(group: argparse._ActionsContainer) -> None:
    """``--profile TRACE`` (repeatable): a profiled step of the model whose measured / modelled
    kernel-time ratios scale the cost model (:mod:`dml2comm.traces.predict`)."""
    group.add_argument("--profile", action="append", default=[], metavar="TRACE",
                       help="a profiled training step of this model (a PyTorch-profiler trace with record_shapes=True, "
                            "d=t=p=1): per layer kind and pass, its measured kernel time over the tool's at the trace's "
                            "micro-batch, sequence and GPU scales the modelled times of the plan (repeatable: the ratios "
                            "of the summed times); a trace of another model is refused")


#: The hardware flags' help: (the main command's, sweep's and compare's) where they differ.
_HARDWARE_HELP = {
    "--gpu": ("GPU preset (default a100; see: python main.py presets); refused with a --cluster of another GPU",
              "GPU preset (default a100; refused with a --cluster of another GPU)"),
    "--cluster": ("cluster preset (dgx-a100, dgx-h100, ...) or cluster file (FILE.yaml from python main.py calibrate): its own GPU, "
                  "nodes and network",
                  "cluster preset (dgx-a100, dgx-h100, ...) or cluster file (FILE.yaml); overrides --gpu"),
    "--nics-per-node": ("NICs per node (default: the preset's, one per GPU on the DGX presets): each GPU's inter-node share is "
                        "the node's NICs over its GPUs",
                        "NICs per node (default: the preset's); each GPU's inter-node share is the node's NICs over its GPUs"),
    "--host-model": ("host-side (CPU) time per kernel: eager (Megatron-DeepSpeed's dispatch and launch, fitted on vTrain's A100 "
                     "runs; the default with --stack megatron), pytorch (eager PyTorch 2.x, fitted on steps measured on an H100 and an H200: the CPU runs "
                     "ahead, each kernel leaves the GPU a short gap; the default with --stack pytorch) or none (kernel time "
                     "only: CUDA-graph captured steps)",
                     "host-side (CPU) time: eager (Megatron-DeepSpeed's per-kernel dispatch; default with --stack megatron), "
                     "pytorch (eager PyTorch 2.x; default with --stack pytorch) or none (CUDA graphs)"),
}


#: The largest ``--collective-overhead-us``: one second per call, four orders of magnitude above the
#: measured host overheads (the presets' fitted 51.5 µs; nccl-tests' small-message times are 5-100 µs);
#: 10**15 µs planned a step of 10**9 s.
MAX_COLLECTIVE_OVERHEAD_US = 1e6


def add_hardware_arguments(parser: argparse.ArgumentParser, *, main: bool) -> argparse._ArgumentGroup:
    """The ``hardware`` group: ``--gpu``, ``--cluster``, ``--gpus-per-node``, ``--nics-per-node``,
    ``--host-model`` and ``--profile``, one definition for the main command (``main``: its longer
    help, and its own ``--collective-overhead-us``, ``--topology`` and ``--step-time`` in their
    places) and for ``sweep`` and ``compare``.  Returns the group."""
    from dml2comm.cost.host import HOST_MODELS

    which = 0 if main else 1
    h = parser.add_argument_group("hardware")
    h.add_argument("--gpu", help=_HARDWARE_HELP["--gpu"][which])
    h.add_argument("--cluster", help=_HARDWARE_HELP["--cluster"][which])
    h.add_argument("--gpus-per-node", type=positive_int, default=None,
                   help=f"GPUs per node of --gpu (default {DEFAULT_GPUS_PER_NODE}); a --cluster has its own, another value is refused")
    h.add_argument("--nics-per-node", type=positive_int, help=_HARDWARE_HELP["--nics-per-node"][which])
    if main:
        h.add_argument("--collective-overhead-us", type=finite_float(maximum=MAX_COLLECTIVE_OVERHEAD_US, why="1 s per call"), default=0.0,
                       help="host-side overhead per collective call in microseconds (default 0: launches are asynchronous; "
                            "the presets' fitted value for standalone calls is 51.5)")
    h.add_argument("--host-model", default=None, choices=list(HOST_MODELS), help=_HARDWARE_HELP["--host-model"][which])
    if main:
        h.add_argument("--topology", help="name recorded for the inter-node network (the full topology library comes later)")
    add_profile_argument(h)
    if main:
        h.add_argument("--step-time", type=finite_float(), default=None, metavar="SECONDS",
                       help="with --profile: the profiled step's time measured without the profiler; the trace's CPU time "
                            "per kernel is scaled by the factor that best explains it (where the CPU sets the step's pace "
                            "the step is reproduced; a GPU-bound step keeps the median); without it, by the profiler's "
                            "slowdown measured on bundled steps (1.219)")
    return h


def host_model_of(args: argparse.Namespace) -> str:
    """``--host-model``, else the one the ``--stack`` runs (:data:`dml2comm.cost.host.STACK_HOST_MODEL`)."""
    from dml2comm.cost.host import STACK_HOST_MODEL

    return args.host_model or STACK_HOST_MODEL[args.stack or "megatron"]


#: GPUs per node where ``--gpu`` builds the cluster and ``--gpus-per-node`` is not given: a DGX or
#: HGX node's eight.
DEFAULT_GPUS_PER_NODE = 8


def check_gpus_per_node(gpus_per_node: int | None, cluster: str | None) -> None:
    """``--gpus-per-node`` sizes the nodes ``--gpu`` builds; a ``--cluster`` preset or file brings
    its own nodes, whose size is used: a different value would be ignored, so it is refused (an
    equal one is accepted)."""
    if gpus_per_node is None or not cluster or not cluster.strip():
        return
    from dml2comm.hardware.cluster import get_cluster

    node = get_cluster(cluster).gpus_per_node
    if gpus_per_node != node:
        raise ConfigError(f"--gpus-per-node {gpus_per_node} contradicts --cluster {cluster}, whose nodes hold {node} GPUs (its own "
                          f"node size is used); drop --gpus-per-node, or build nodes of {gpus_per_node} GPUs with --gpu NAME "
                          f"--gpus-per-node {gpus_per_node} instead of --cluster")


def resolve_gpus_per_node(args: argparse.Namespace) -> None:
    """:func:`check_gpus_per_node` of the hardware flags, then an unset ``--gpus-per-node`` set to
    :data:`DEFAULT_GPUS_PER_NODE` (the analysis, ``sweep`` and ``compare``; left None, the flag
    stays told apart from its default)."""
    check_gpus_per_node(args.gpus_per_node, args.cluster)
    if args.gpus_per_node is None:
        args.gpus_per_node = DEFAULT_GPUS_PER_NODE


def check_cp_scheme(scheme: str | None, largest_cp: int, which: str, fix: str) -> None:
    """``--cp-scheme`` chooses how context parallelism splits attention: refused where the largest
    context-parallel size the command plans (``largest_cp``) is 1.  ``which``: what plans no
    context parallelism, in the command's words (``--cp 1 does not run``); ``fix``: the remedy.
    One check for the analysis, ``sweep`` and ``trace``'s prediction."""
    if scheme is not None and largest_cp == 1:
        raise ConfigError(f"--cp-scheme {scheme} chooses how context parallelism splits attention, which {which}; {fix}")


def check_virtual_stages(virtual_stages: int, schedule: str, p: int) -> None:
    """``--virtual-stages v`` > 1 splits each pipeline stage into v chunks, which only the
    interleaved schedule over p >= 2 stages runs (the others ignore v, as Megatron-LM does):
    refused otherwise.  One check for the analysis and ``trace``'s prediction."""
    from dml2comm.parallel.config import Schedule

    if virtual_stages > 1 and (Schedule.of(schedule) is not Schedule.INTERLEAVED or p == 1):
        raise ConfigError(f"--virtual-stages {virtual_stages} splits each pipeline stage into chunks, which only "
                          "--schedule interleaved with --p 2 or more runs; add them, or drop --virtual-stages")
