"""Sizes, rates and latencies with units, as typed on the command line, and their display.

- Sizes: ``4096``, ``1e9``, ``64MB`` (10^6), ``64MiB`` (2^20), ``1GiB``, ``512K`` / ``128M`` /
  ``1G`` (binary, as nccl-tests' ``-b``/``-e`` read them), ``8B``.
- Rates: ``100GB/s`` (bytes), ``200Gb/s`` / ``400Gbps`` (bits: lower-case ``b``), ``25GiB/s``,
  ``1e11`` (bytes per second).
- Latencies: ``5us``, ``5µs``, ``1.5ms``, ``500ns``, ``2e-6`` / ``2e-6s`` (seconds).

Every parser raises :class:`~dml2comm.errors.ConfigError` with a one-line message naming what
was expected.
"""

from __future__ import annotations

import math
import re

from dml2comm.errors import ConfigError
from dml2comm.fmt import fmt_bytes, fmt_gbps, fmt_s

__all__ = ["format_bytes", "format_rate", "format_seconds", "parse_latency", "parse_rate", "parse_size"]

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DECIMAL = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    raw = str(text).strip()
    m = re.fullmatch(_NUMBER + r"\s*(.*)", raw)
    if m is None:
        raise ConfigError(f"cannot read {what} {text!r}; write it like {example}")
    return float(m.group(1)), m.group(2).strip()


def _unit_scale(unit: str, what: str, text: str, example: str, *, bare_binary: bool) -> tuple[float, bool]:
    """(scale, in_bits) of a size unit such as ``GiB``, ``MB``, ``Gb``, ``G``, ``B``."""
    if unit == "":
        return 1.0, False
    m = re.fullmatch(r"([kKmMgGtTpP]?)(i?)([bB]?)", unit)
    if m is None or (m.group(2) and not m.group(1)):
        raise ConfigError(f"cannot read {what} {text!r}: unknown unit {unit!r}; write it like {example}")
    prefix, binary, byte = m.group(1).lower(), bool(m.group(2)), m.group(3)
    bits = byte == "b"
    if binary:
        scale = _BINARY[prefix]
    elif byte == "" and prefix:
        scale = _BINARY[prefix] if bare_binary else _DECIMAL[prefix]
    else:
        scale = _DECIMAL[prefix]
    return float(scale), bits


def parse_size(text: str | float | int) -> float:
    """Bytes from ``text`` (module docstring); must be finite and > 0.

    Raises
    ------
    ConfigError
        Unreadable, zero, negative or not finite.
    """
    example = "1GiB, 64MB, 4096 or 1e9"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        if str(text).strip().startswith("-"):
            raise ConfigError(f"size must be positive, got {text!r}")
        number, unit = _split(str(text), "size", example)
        scale, bits = _unit_scale(unit, "size", str(text), example, bare_binary=True)
        if bits and unit.lower() != "b":
            raise ConfigError(f"size {text!r} is in bits; give bytes (B), e.g. {example}")
        value = number * scale
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"size must be a positive number of bytes, got {text!r}; write it like {example}")
    return value


def parse_rate(text: str | float | int) -> float:
    """Bytes per second from ``text`` (``100GB/s``, ``200Gb/s``, ``400Gbps``, ``1e11``); > 0.

    Raises
    ------
    ConfigError
        Unreadable, zero, negative or not finite.
    """
    example = "100GB/s, 200Gb/s or 25e9"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        if raw.startswith("-"):
            raise ConfigError(f"bandwidth must be positive, got {text!r}")
        number, unit = _split(raw, "bandwidth", example)
        unit = unit.replace(" ", "")
        if unit:
            m = re.fullmatch(r"(.*?)(?:/s|/sec|ps)", unit, flags=re.IGNORECASE)
            if m is None:
                raise ConfigError(f"cannot read bandwidth {text!r}: a rate needs /s (or ps); write it like {example}")
            unit = m.group(1)
            if unit == "":
                raise ConfigError(f"cannot read bandwidth {text!r}: say B/s (bytes) or b/s (bits); write it like {example}")
        scale, bits = _unit_scale(unit, "bandwidth", raw, example, bare_binary=False)
        value = number * scale / (8.0 if bits else 1.0)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"bandwidth must be a positive rate, got {text!r}; write it like {example}")
    return value


_PER_SECOND = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9}


def parse_latency(text: str | float | int) -> float:
    """Seconds from ``text`` (``5us``, ``1.5ms``, ``500ns``, ``2e-6``); finite and >= 0.

    Raises
    ------
    ConfigError
        Unreadable, negative or not finite.
    """
    example = "5us, 1.5ms, 500ns or 2e-6"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        if raw.startswith("-"):
            raise ConfigError(f"latency must be >= 0, got {text!r}")
        number, unit = _split(raw, "latency", example)
        divisor = _PER_SECOND.get(unit.lower() if unit not in ("µs", "μs") else unit)
        if divisor is None:
            raise ConfigError(f"cannot read latency {text!r}: unknown unit {unit!r}; write it like {example}")
        value = number / divisor
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"latency must be a finite number of seconds >= 0, got {text!r}")
    return value


def format_bytes(x: float) -> str:
    """``1 GiB``, ``64 MiB``, ``512 B`` (three significant digits; :func:`dml2comm.fmt.fmt_bytes`)."""
    return fmt_bytes(x, sig=3)


def format_rate(x: float) -> str:
    """``230.0 GB/s`` (decimal, as nccl-tests prints; :func:`dml2comm.fmt.fmt_gbps`)."""
    return fmt_gbps(x)


def format_seconds(x: float) -> str:
    """``8.28 ms``, ``92.8 µs``, ``1.23 s`` (three significant digits; :func:`dml2comm.fmt.fmt_s`)."""
    return fmt_s(x, sig=3)
