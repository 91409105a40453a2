"""Number formatting and the colour scales shared by the drawings and the site's legends.

Pure functions, no I/O.  Quantities arrive in SI units (seconds, bytes, FLOPs) and are shown
with binary prefixes for bytes (KiB, MiB, GiB, as nccl-tests prints message sizes) and decimal
prefixes for FLOPs and time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "fmt_s",
    "fmt_bytes",
    "fmt_flops",
    "fmt_rate",
    "fmt_count",
    "fmt_share",
    "fmt_shape",
    "fmt_num",
    "rank_ranges",
    "HeatBin",
    "HEAT_BINS",
    "COMM_BINS",
    "heat_bin",
    "LINK_COLOURS",
    "link_colour",
    "link_short",
]


def fmt_s(x: float | None) -> str:
    """Seconds with a readable unit: ``1.234 s``, ``12.35 ms``, ``13.6 µs``, ``850 ns``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0 s"
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    if x >= 1e-6:
        return f"{x * 1e6:.1f} µs"
    return f"{x * 1e9:.0f} ns"


def fmt_bytes(x: float | None) -> str:
    """Bytes with binary prefixes: ``1.50 MiB``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def fmt_rate(x: float | None) -> str:
    """Bandwidth in decimal units, as datasheets print it: ``2.04 TB/s``, ``25 GB/s``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B/s"


def fmt_flops(x: float | None) -> str:
    """FLOPs with decimal prefixes: ``17.9 GFLOP``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} FLOP"


def fmt_count(x: float | None) -> str:
    """Parameter counts: ``124.4 M``, ``7.09 M``, ``1,536``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.2f} B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x:,.0f}"


def fmt_share(x: float | None) -> str:
    """A fraction as a percentage: ``43.2%``, ``0.12%``, ``<0.01%``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0%"
    if x < 1e-4:
        return "<0.01%"
    if x < 0.01:
        return f"{x:.2%}"
    return f"{x:.1%}"


def fmt_num(x: float | None) -> str:
    """A small count that may be fractional (micro-batches in flight under interleaving):
    ``4``, ``16.47``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.2f}".rstrip("0").rstrip(".")


def fmt_shape(shape: Sequence[int]) -> str:
    """``(1, 1024, 768)`` -> ``1×1024×768``; a scalar is ``scalar``."""
    return "×".join(str(int(d)) for d in shape) if shape else "scalar"


def rank_ranges(ranks: Iterable[int]) -> str:
    """Compress GPU ranks: ``[0, 1, 2, 3, 8, 10]`` -> ``0–3, 8, 10``."""
    values = sorted(set(int(r) for r in ranks))
    if not values:
        return "none"
    parts: list[str] = []
    start = prev = values[0]
    for r in values[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        if prev == start:
            parts.append(str(start))
        elif prev == start + 1:
            parts.append(f"{start}, {prev}")
        else:
            parts.append(f"{start}–{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Colour scales: heat by share of the iteration time.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeatBin:
    """Shares in ``[low, high)`` are filled with ``fill`` and written in ``font``."""

    low: float
    high: float
    fill: str
    font: str

    @property
    def label(self) -> str:
        if self.high == math.inf:
            return f"≥ {fmt_share(self.low)}"
        if self.low == 0:
            return f"< {fmt_share(self.high)}"
        return f"{fmt_share(self.low)} – {fmt_share(self.high)}"


# Shares of the iteration are logarithmic in practice (one op of 439 is ~0.1%, a stage ~50%),
# so the bins are too.  Compute: ColorBrewer YlOrRd; communication: ColorBrewer Blues.
_EDGES = (0.0, 0.001, 0.005, 0.02, 0.05, 0.15, 0.40, math.inf)
_HEAT = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#f03b20", "#bd0026")
_COMM = ("#eff3ff", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c")
_DARK = 5  # bins from here on are dark: white text

HEAT_BINS: tuple[HeatBin, ...] = tuple(
    HeatBin(_EDGES[i], _EDGES[i + 1], _HEAT[i], "#ffffff" if i >= _DARK else "#1a1a1a") for i in range(len(_HEAT))
)
COMM_BINS: tuple[HeatBin, ...] = tuple(
    HeatBin(_EDGES[i], _EDGES[i + 1], _COMM[i], "#ffffff" if i >= _DARK else "#1a1a1a") for i in range(len(_COMM))
)


def heat_bin(share: float | None, comm: bool = False) -> HeatBin:
    """The bin of ``share`` (a fraction of the iteration time) on the compute or comm scale."""
    bins = COMM_BINS if comm else HEAT_BINS
    if share is None or not math.isfinite(share) or share < 0:
        return bins[0]
    for b in bins:
        if b.low <= share < b.high:
            return b
    return bins[-1]


#: Edge colours by link class (what a GPU-to-GPU edge travels over).
LINK_COLOURS = {"nvlink": "#2e7d32", "pcie": "#6a1b9a", "network": "#e65100", "local": "#757575"}


def link_kind(link_name: str) -> str:
    name = link_name.lower()
    if "nvlink" in name:
        return "nvlink"
    if "pcie" in name:
        return "pcie"
    if not name:
        return "local"
    return "network"


def link_colour(link_name: str) -> str:
    return LINK_COLOURS[link_kind(link_name)]


def link_short(link_name: str) -> str:
    """``"InfiniBand HDR 200 Gb/s (8 per node, 8 GPUs)"`` -> ``"InfiniBand HDR 200 Gb/s"``."""
    return link_name.split(" (")[0].split(" + ")[0] if link_name else "same GPU"
