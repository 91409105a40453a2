"""From a sweep or compare row back to the single analysis: its command line, and its site.

A row of :mod:`dml2comm.search.sweep` holds ``config`` (:meth:`ParallelConfig.to_dict`); the
main command reading the flags :func:`analysis_argv` writes computes the same configuration on
the same cluster (the sweep builds clusters as the main command does, with no per-call host
overhead, which is also the main command's default), so its ``data.json`` iteration time equals
the row's (the fast path equals the analysis to rounding: ``tests/test_search.py``).

:func:`dml2comm.cli.search.build_sites` runs that command line through the main command's own
code path for the best few rows (of a scaling study: the best configuration of the first few GPU
counts, into ``top/COUNT-gpus``, :func:`scaling_folder`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dml2comm.cost.host import STACK_HOST_MODEL
from dml2comm.parallel.config import DEFAULT_ATTENTION, DEFAULT_PRECISION, Stack

__all__ = ["Hardware", "analysis_argv", "command_line", "config_slug", "listed_commands", "scaling_folder", "scaling_reproduce",
           "DEFAULT_BUILD_TOP"]

#: Analysis sites built by ``sweep`` and ``compare`` unless ``--build-top N`` says otherwise.
DEFAULT_BUILD_TOP = 3


@dataclass(frozen=True)
class Hardware:
    """The hardware and batch flags a sweep or compare was given, repeated on each command line."""

    gpu: str | None = None
    cluster: str | None = None
    gpus_per_node: int = 8
    seq_len: int | None = None
    host_model: str = "eager"
    nics_per_node: int | None = None
    profile: tuple[str, ...] = ()  # --profile traces


def config_slug(config: Mapping[str, Any]) -> str:
    """A folder name for a configuration: ``d2-t2-p4-b1-zero1-full-sp``."""
    parts = [f"d{config['d']}", f"t{config['t']}", f"p{config['p']}"]
    if (config.get("c") or 1) > 1:
        parts.append(f"c{config['c']}")
    if (config.get("e") or 1) > 1:
        parts.append(f"e{config['e']}")
    parts.append(f"b{config['micro_batch_size']}")
    if (config.get("virtual_stages") or 1) > 1:
        parts.append(f"v{config['virtual_stages']}")
    parts.append(f"zero{config['zero_stage']}")
    parts.append(str(config["recompute"]))
    if config.get("sequence_parallel"):
        parts.append("sp")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts))


def scaling_folder(num_gpus: int) -> str:
    """The folder under ``DIR/top`` of a scaling study's analysis site for ``num_gpus``: ``16-gpus``
    (a sweep's sites are ``DIR/top/RANK``)."""
    return f"{num_gpus}-gpus"


def analysis_argv(model: str, config: Mapping[str, Any], hardware: Hardware, out: str) -> list[str]:
    """The main command's arguments (after ``python main.py``) that analyse ``config``.

    Flags at their defaults are left out except the sizes and batches, which are always given."""
    argv = [str(model), "--d", str(config["d"]), "--t", str(config["t"]), "--p", str(config["p"])]
    if (config.get("c") or 1) > 1:
        argv += ["--cp", str(config["c"]), "--cp-scheme", str(config.get("cp_scheme") or "ulysses")]
    if (config.get("e") or 1) > 1:
        argv += ["--ep", str(config["e"])]
    argv += ["--micro-batch-size", str(config["micro_batch_size"]), "--global-batch-size", str(config["global_batch_size"])]
    if hardware.seq_len is not None:
        argv += ["--seq-len", str(hardware.seq_len)]
    if config.get("sequence_parallel"):
        argv.append("--sequence-parallel")
    if config.get("zero_stage"):
        argv += ["--zero", str(config["zero_stage"])]
    if config.get("recompute") and config["recompute"] != "none":
        argv += ["--recompute", str(config["recompute"])]
    if config.get("schedule") and config["schedule"] != "1f1b":
        argv += ["--schedule", str(config["schedule"])]
    if (config.get("virtual_stages") or 1) > 1:
        argv += ["--virtual-stages", str(config["virtual_stages"])]
    if config.get("dtype") and config["dtype"] != "bf16":
        argv += ["--dtype", str(config["dtype"])]
    if config.get("optimizer") and config["optimizer"] != "adam":
        argv += ["--optimizer", str(config["optimizer"])]
    if config.get("stack") and config["stack"] != "megatron":  # the stack, then what differs from its defaults
        argv += ["--stack", str(config["stack"])]
    stack = Stack(config.get("stack") or "megatron")
    if config.get("precision") and config["precision"] != DEFAULT_PRECISION[stack]:
        argv += ["--precision", str(config["precision"])]
    if config.get("attention") and config["attention"] != DEFAULT_ATTENTION[stack]:
        argv += ["--attention", str(config["attention"])]
    if hardware.cluster:
        argv += ["--cluster", hardware.cluster]
    if hardware.gpu:
        argv += ["--gpu", hardware.gpu]
    if hardware.gpus_per_node != 8:
        argv += ["--gpus-per-node", str(hardware.gpus_per_node)]
    if hardware.host_model != STACK_HOST_MODEL[stack]:
        argv += ["--host-model", hardware.host_model]
    if hardware.nics_per_node is not None:
        argv += ["--nics-per-node", str(hardware.nics_per_node)]
    for trace in hardware.profile:
        argv += ["--profile", trace]
    return argv + ["--out", out]


def command_line(argv: Sequence[str]) -> str:
    """``python main.py ...`` with shell quoting where a word needs it."""
    return "python main.py " + shlex.join(argv)


def scaling_reproduce(model: str, out: Path, points: Sequence[Mapping[str, Any]], hardware: Hardware,
                      build_top: int) -> tuple[dict[int, str], list[tuple[int, list[str]]], dict[int, str]]:
    """Command lines of each GPU count's best configuration, and the analysis sites to build: of
    the first ``build_top`` counts that have a fitting configuration (every such count when
    ``build_top`` is at least their number).  Returns ({GPU count: command line}, [(GPU count,
    argv)] of the sites to build, {GPU count: its folder under ``out/top``}).  A built count's
    ``--out`` is ``out/top/COUNT-gpus``; the others' ``out/configs/SLUG``."""
    commands: dict[int, str] = {}
    jobs: list[tuple[int, list[str]]] = []
    sites: dict[int, str] = {}
    for i, p in enumerate([p for p in points if p.get("best")]):
        n, config = p["gpus"], p["best"]["config"]
        build = i < build_top
        target = out / "top" / scaling_folder(n) if build else out / "configs" / config_slug(config)
        argv = analysis_argv(model, config, hardware, str(target))
        commands[n] = command_line(argv)
        if build:
            jobs.append((n, argv))
            sites[n] = scaling_folder(n)
    return commands, jobs, sites


def listed_commands(model: str, out: Path, ranked: Sequence[Mapping[str, Any]], listed: Sequence[Mapping[str, Any]],
               hardware: Hardware, build_top: int, number: Callable[[Mapping[str, Any], int], int] = lambda row, rank: rank,
               ) -> tuple[dict[int, str], list[tuple[int, list[str]]], dict[int, int]]:
    """Command lines of the ``listed`` rows and of the ``build_top`` fastest fitting ones
    (``ranked``): ({row index: command line}, [(number, argv)] of the sites to build, {row index:
    number of its site}).  A built row's ``--out`` is ``out/top/NUMBER``; the others'
    ``out/configs/SLUG``.  ``number(row, rank)`` is the "#" the terminal and the page show for the
    row: its rank (the sweep, whose tables list the fastest first) or, for ``compare``, whose
    table keeps the order of ``--configs``, its position there -- one number per configuration."""
    ranks = {r["index"]: number(r, i) for i, r in enumerate(ranked[:build_top], 1)}
    commands: dict[int, str] = {}
    jobs: list[tuple[int, list[str]]] = []
    for r in [*ranked[:build_top], *listed]:
        if r["index"] in commands or r.get("error"):
            continue
        rank = ranks.get(r["index"])
        target = out / "top" / str(rank) if rank else out / "configs" / config_slug(r["config"])
        argv = analysis_argv(model, r["config"], hardware, str(target))
        commands[r["index"]] = command_line(argv)
        if rank:
            jobs.append((rank, argv))
    return commands, sorted(jobs), ranks
