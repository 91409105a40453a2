"""The space of parallel configurations for a GPU count, and the constraints that narrow it.

:func:`enumerate_configs` yields every valid :class:`~dml2comm.parallel.config.ParallelConfig`
for ``num_gpus`` GPUs, in a fixed order (d, t, p ascending, then micro-batch, virtual stages,
ZeRO stage, recomputation, sequence parallelism).  A configuration is valid when

- d * t * p = num_gpus;
- t divides the attention heads (when the model has any) and t <= GPUs per node (tensor
  groups stay on NVLink) unless ``allow_cross_node_tp``;
- p <= the analysis's layer count (transformer blocks + embedding + head; Narayanan et al.
  2021 put at least one layer on each stage);
- the micro-batch size b comes from ``micro_batch_sizes`` and b * d divides the global batch
  (m = B / (b d) micro-batches, Narayanan et al. 2021, Sec. 2.2);
- virtual stages v = 1 (1F1B), or v in ``virtual_stages`` > 1 with the interleaved schedule
  when p > 1, m is a multiple of p (Megatron-LM's requirement) and p * v <= layers (every
  model chunk holds a layer);
- ZeRO stage from ``zero_stages`` (0 and 1 by default), recomputation from ``recompute``,
  sequence parallelism on and off only when t > 1.

Constraints (:class:`Constraints`) narrow each choice; invalid values raise
:class:`~dml2comm.errors.ConfigError` with one line naming the problem and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from dml2comm.errors import ConfigError
from dml2comm.fmt import decimal_int
from dml2comm.parallel.config import (CP_SCHEMES, MAX_MICRO_BATCH, RECOMPUTE_MODES, CpScheme, ParallelConfig, check_choice,
                                      check_zero_stage)

__all__ = ["Constraints", "divisors", "enumerate_configs", "parse_int_list", "parse_name_list"]

DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL_STAGES = (1, 2, 4)
DEFAULT_ZERO_STAGES = (0, 1)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [k for k in range(1, n + 1) if n % k == 0]


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; anything else raises a one-line :class:`ConfigError`."""
    parts = [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        values = tuple(decimal_int(x) for x in parts)  # plain digits: int() would also read '１６' and '1_6'
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated positive integers, got {text!r}; e.g. {flag} 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{flag} expects comma-separated positive integers, got {text!r}; e.g. {flag} 1,2,4")
    return tuple(sorted(set(values)))


def parse_name_list(text: str, flag: str, choices: Sequence[str]) -> tuple[str, ...]:
    """``"none,full"`` -> ``("none", "full")`` checked against ``choices`` (kept in their order)."""
    names = {x.strip().lower() for x in str(text).split(",") if x.strip()}
    bad = sorted(names - set(choices))
    if not names or bad:
        raise ConfigError(f"{flag} got {text!r}; choose a comma-separated subset of {','.join(choices)}")
    return tuple(c for c in choices if c in names)


@dataclass(frozen=True)
class Constraints:
    """What the sweep may choose.  ``None`` for d/t/p means "every divisor"."""

    d: tuple[int, ...] | None = None
    t: tuple[int, ...] | None = None
    p: tuple[int, ...] | None = None
    max_d: int | None = None
    max_t: int | None = None
    max_p: int | None = None
    micro_batch_sizes: tuple[int, ...] = DEFAULT_MICRO_BATCH_SIZES
    virtual_stages: tuple[int, ...] = DEFAULT_VIRTUAL_STAGES
    zero_stages: tuple[int, ...] = DEFAULT_ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    sequence_parallel: tuple[bool, ...] = (False, True)
    allow_cross_node_tp: bool = False
    gpus_per_node: int = 8
    dtype: str = "bf16"
    optimizer: str = "adam"
    #: context-parallel sizes (``--cp``) and expert-parallel sizes (``--ep``) to try; 1 by default
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    cp_scheme: str = "ulysses"
    #: the training stack, precision mode and attention kernel of every configuration
    #: (``--stack/--precision/--attention``; None: the config's default, which follows the stack)
    stack: str | None = None
    precision: str | None = None
    attention: str | None = None
    #: ``--inputs-on-gpu`` (None: the config's default, inputs copied over PCIe)
    inputs_on_gpu: bool | None = None

    def stack_kwargs(self) -> dict[str, Any]:
        """The :class:`ParallelConfig` keywords of the stack choices that were given."""
        return {k: v for k, v in (("stack", self.stack), ("precision", self.precision), ("attention", self.attention),
                                  ("inputs_on_gpu", self.inputs_on_gpu)) if v is not None}

    def check(self, num_gpus: int) -> None:
        """Raise :class:`ConfigError` for values no configuration of ``num_gpus`` GPUs can take."""
        if not isinstance(num_gpus, int) or num_gpus < 1:
            raise ConfigError(f"--gpus must be a positive integer, got {num_gpus!r}")
        for flag, values in (("--d", self.d), ("--t", self.t), ("--p", self.p)):
            if values is None:
                continue
            if not values:
                raise ConfigError(f"{flag} is empty; give at least one size, e.g. {flag} 1,2")
            bad = [v for v in values if not isinstance(v, int) or v < 1 or num_gpus % v]
            if bad:
                raise ConfigError(f"{flag} {bad[0]!r} does not divide --gpus {num_gpus}; choose from {divisors(num_gpus)}")
        for flag, value in (("--max-d", self.max_d), ("--max-t", self.max_t), ("--max-p", self.max_p)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
        for flag, values in (("--micro-batch-sizes", self.micro_batch_sizes), ("--virtual-stages", self.virtual_stages)):
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ConfigError(f"{flag} expects positive integers, got {values!r}; e.g. {flag} 1,2,4")
        if max(self.micro_batch_sizes) > MAX_MICRO_BATCH:
            raise ConfigError(f"--micro-batch-sizes {max(self.micro_batch_sizes):,} is beyond the {MAX_MICRO_BATCH:,} samples dml2comm "
                              "plans (far beyond any real run's); use smaller sizes")
        if not self.zero_stages:
            raise ConfigError("--zero is empty; give at least one stage, e.g. --zero 0,1")
        for z in self.zero_stages:  # the configuration's own checks and words (parallel.config)
            check_zero_stage(z)
        if not self.recompute:
            raise ConfigError(f"--recompute is empty; give a subset of {','.join(RECOMPUTE_MODES)}")
        for r in self.recompute:
            check_choice("--recompute", r, RECOMPUTE_MODES)
        if not self.sequence_parallel:
            raise ConfigError("sequence parallelism must allow on, off or both")
        for flag, values in (("--cp", self.cp), ("--ep", self.ep)):
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ConfigError(f"{flag} expects positive integers, got {values!r}; e.g. {flag} 1,2")
            bad = [v for v in values if num_gpus % v]
            if bad:
                raise ConfigError(f"{flag} {bad[0]} does not divide --gpus {num_gpus}; choose from {divisors(num_gpus)}")
        check_choice("--cp-scheme", self.cp_scheme, CP_SCHEMES)
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node must be a positive integer, got {self.gpus_per_node!r}")


def _sizes(num_gpus: int, chosen: tuple[int, ...] | None, cap: int | None) -> list[int]:
    values = divisors(num_gpus) if chosen is None else sorted(set(chosen))
    return [v for v in values if num_gpus % v == 0 and (cap is None or v <= cap)]


def enumerate_configs(
    num_gpus: int,
    global_batch: int,
    layers: int,
    heads: int | None,
    kv_heads: int | None,
    seq_len: int | None,
    constraints: Constraints = Constraints(),
    experts: int | None = None,
) -> Iterator[ParallelConfig]:
    """Yield every valid configuration (see the module docstring for the rules), in a fixed order.

    Parameters
    ----------
    num_gpus
        d * t * p.
    global_batch
        Samples per iteration (B).
    layers
        The analysis's layer count (blocks + embedding + head): the most pipeline stages.
    heads, kv_heads
        Query and KV attention heads (``None``: the model has no attention; t is then only
        limited by the GPU count).  KV heads that t does not divide are replicated by the
        tensor-parallel pass (grouped-query attention), so they do not restrict t.
    seq_len
        Recorded on each configuration; context parallelism c must divide it.
    experts
        Experts per MoE layer (``None``: no experts, so only e = 1); e must divide them and d * c.

    Raises
    ------
    ConfigError
        A constraint no configuration can meet, or nothing valid is left (raised when the
        iterator is exhausted without yielding).
    """
    constraints.check(num_gpus)
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"--global-batch-size must be a positive integer, got {global_batch!r}")
    if layers < 1:
        raise ConfigError(f"the model has {layers} layers; nothing to place on a pipeline")
    c = constraints
    ulysses = CpScheme(c.cp_scheme) is CpScheme.ULYSSES
    if experts is None and any(e > 1 for e in c.ep):
        raise ConfigError(f"--ep {max(c.ep)}: the model has no experts (no mixture-of-experts layers); drop --ep")
    count = 0
    for d in _sizes(num_gpus, c.d, c.max_d):
        for t in _sizes(num_gpus // d, c.t, c.max_t):
            if heads is not None and heads % t:
                continue
            if t > c.gpus_per_node and not c.allow_cross_node_tp:
                continue
            for cp in sorted(set(c.cp)):
                if (num_gpus // (d * t)) % cp:
                    continue
                if cp > 1 and ((seq_len is not None and seq_len % cp)
                               or (ulysses and heads is not None and heads % (t * cp))):
                    continue
                p = num_gpus // (d * t * cp)
                if c.p is not None and p not in c.p:
                    continue
                if (c.max_p is not None and p > c.max_p) or p > layers:
                    continue
                for ep in sorted(set(c.ep)):
                    if (d * cp) % ep or (ep > 1 and experts is not None and experts % ep):
                        continue
                    for config in _inner(c, num_gpus, global_batch, layers, seq_len, d, t, p, cp, ep):
                        count += 1
                        yield config
    if count == 0:
        raise ConfigError(
            f"no valid configuration of {num_gpus} GPUs for global batch {global_batch}, {layers} layers and "
            f"{heads if heads is not None else 'no'} attention heads under these constraints; loosen --d/--t/--p, "
            "--max-*, --micro-batch-sizes or change --global-batch-size"
        )


def _inner(c: Constraints, num_gpus: int, global_batch: int, layers: int, seq_len: int | None, d: int, t: int, p: int,
           cp: int, ep: int) -> Iterator[ParallelConfig]:
    """Micro-batch, virtual stages, ZeRO, recomputation and SP for one (d, t, p, c, e)."""
    stack = c.stack_kwargs()
    for b in sorted(set(c.micro_batch_sizes)):
        if global_batch % (b * d):
            continue
        m = global_batch // (b * d)
        for v in sorted(set(c.virtual_stages)):
            if v > 1 and (p == 1 or m % p or p * v > layers):
                continue
            schedule = "interleaved" if v > 1 else "1f1b"
            for zero in sorted(set(c.zero_stages)):
                for rec in [r for r in RECOMPUTE_MODES if r in c.recompute]:
                    for sp in [s for s in (False, True) if s in c.sequence_parallel]:
                        if sp and t == 1:
                            continue
                        yield ParallelConfig(
                            dp_size=d, tp_size=t, pp_size=p, micro_batch_size=b, global_batch_size=global_batch,
                            seq_len=seq_len, dtype=c.dtype, schedule=schedule, virtual_stages=v,
                            zero_stage=zero, sequence_parallel=sp, recompute=rec, optimizer=c.optimizer,
                            cp_size=cp, cp_scheme=c.cp_scheme, ep_size=ep, **stack,
                        )
