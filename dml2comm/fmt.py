"""Number formatting and the colour scales shared by the drawings and the site's legends.

Pure functions, no I/O.  Quantities arrive in SI units (seconds, bytes, FLOPs) and are shown
with binary prefixes for bytes (KiB, MiB, GiB, as nccl-tests prints message sizes) and decimal
prefixes for FLOPs and time.  :func:`decimal_int` is the one reading of a whole number that the
flags, their comma-separated lists and ``--config`` files share.

A number and its unit are joined by :data:`UNIT_SPACE`, a no-break space (U+00A0): browsers
never wrap a table cell between them (HTML Living Standard, "white-space" processing breaks
only at ordinary spaces; CSS Text 3 §5.1 treats U+00A0 as a non-breaking glue character), so
a narrow column shows ``620.0 µs`` on one line, never ``620.0`` / ``µs``.  Graphviz and SVG
text do not wrap at all.  The terminal (rich) breaks at any whitespace, U+00A0 included
(``rich/_wrap.py``: ``\\s*\\S+\\s*``), so the terminal tables give every column at least the
width of its widest value instead (:mod:`dml2comm.render.terminal`).  One unit style
everywhere: ``µs``, never ``us``.

It lives at the bottom of the package (it imports nothing from dml2comm) so that the cost models
(:mod:`dml2comm.network`), the analysis and the commands format numbers the same way as the
drawings without importing :mod:`dml2comm.render` (tests/test_import_layers.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "UNIT_SPACE",
    "decimal_int",
    "plain",
    "printable",
    "fmt_s",
    "fmt_s_band",
    "fmt_bytes",
    "fmt_flops",
    "fmt_rate",
    "fmt_gbps",
    "fmt_capacity",
    "fmt_count",
    "fmt_share",
    "fmt_shape",
    "fmt_plural",
    "fmt_num",
    "rank_ranges",
    "rank_set",
    "HeatBin",
    "HEAT_BINS",
    "COMM_BINS",
    "heat_bin",
    "HOTTEST_TIE",
    "HOTTEST_OUTLINE",
    "LINK_COLOURS",
    "link_colour",
    "link_short",
]


#: Between a number and its unit: a no-break space (U+00A0), see the module docstring.
UNIT_SPACE = "\u00a0"
_U = UNIT_SPACE


#: Control characters: C0 but tab, newline and carriage return; DEL; C1 (``\x9b`` is a CSI to
#: some terminals); and the non-characters U+FFFE/U+FFFF.  XML 1.0 (Sec. 2.2, ``Char``) forbids
#: the C0 ones even as character references, and a terminal acts on ESC and BEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]")


#: A whole number as a flag, a list of sizes or a configuration file writes it: ASCII digits, an
#: optional minus (so that ``-1`` is refused by its range, in the flag's words).
_DECIMAL = re.compile(r"-?[0-9]+")


def decimal_int(text: str) -> int:
    """``"16"`` -> 16; anything but plain ASCII digits raises :class:`ValueError`, as ``int()``
    does on a word.  ``int()`` itself also reads full-width and other Unicode digits (``"１６"``),
    underscores (``"1_6"`` = 16) and surrounding spaces, which a size flag must not take for a
    number the user did not type."""
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal integer: {text!r}")
    return int(text)


def printable(text: object) -> str:
    """``text`` with every control character replaced by U+FFFD (the replacement character).

    The one cleaner for strings that come from a model or a trace (names, dims, op types,
    kernel names) wherever they are shown: the terminal (:mod:`dml2comm.render.terminal`, the
    ``error:`` line), DOT labels and SVG text (:func:`dml2comm.render.dot.html_text`,
    :func:`dml2comm.render.charts.xml_text`, :mod:`dml2comm.render.svg`).  An ESC or BEL in a dim
    name would otherwise drive the terminal, and make an SVG that is not well-formed XML."""
    return _CONTROL.sub("\ufffd", str(text))


def plain(text: str) -> str:
    """``text`` with every :data:`UNIT_SPACE` turned into an ordinary space (for CSV cells,
    command lines and comparisons in tests)."""
    return text.replace(UNIT_SPACE, " ")


def fmt_s(x: float | None, sig: int | None = None) -> str:
    """Seconds with a readable unit: ``1.234 s``, ``12.35 ms``, ``13.6 µs``, ``850 ns``; with
    ``sig``, that many significant digits (``92.8 µs`` for ``sig=3``, as the collective command
    prints nccl-tests-like times)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return f"0{_U}s"
    for unit, scale, decimals in (("s", 1.0, 3), ("ms", 1e-3, 2), ("µs", 1e-6, 1), ("ns", 1e-9, 0)):
        if abs(x) >= scale or unit == "ns":
            value = x / scale
            return f"{value:.{sig}g}{_U}{unit}" if sig else f"{value:.{decimals}f}{_U}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover - "ns" always matches


def fmt_bytes(x: float | None, sig: int | None = None) -> str:
    """Bytes with binary prefixes: ``1.50 MiB``; with ``sig``, that many significant digits
    (``64 MiB``, ``1 GiB`` for ``sig=3``)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.{sig}g}{_U}{unit}" if sig else f"{x / scale:.2f}{_U}{unit}"
    return f"{x:.0f}{_U}B"


def fmt_rate(x: float | None) -> str:
    """Bandwidth in decimal units, as datasheets print it: ``2.04 TB/s``, ``25 GB/s``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{_U}{unit}"
    return f"{x:.0f}{_U}B/s"


def fmt_gbps(x: float | None) -> str:
    """Bandwidth always in GB/s with one decimal, as nccl-tests prints algbw/busbw: ``230.0 GB/s``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x / 1e9:.1f}{_U}GB/s"


def fmt_flops(x: float | None) -> str:
    """FLOPs with decimal prefixes: ``17.9 GFLOP``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{_U}{unit}"
    return f"{x:.0f}{_U}FLOP"


def fmt_count(x: float | None) -> str:
    """Parameter counts: ``124.4 M``, ``7.09 M``, ``1,536``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.2f}{_U}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}{_U}M"
    return f"{x:,.0f}"


def fmt_capacity(hbm_bytes: float) -> str:
    """A GPU's memory as its datasheet writes it, decimal: ``80 GB``."""
    return f"{hbm_bytes / 1e9:g}{_U}GB"


def fmt_s_band(x: float | None, error: float | None) -> str:
    """Seconds and their expected relative error: ``382.51 ms ± 8.3%`` (:func:`fmt_s` alone
    without an error: a row of an older data.json)."""
    if error is None or x is None or not math.isfinite(error):
        return fmt_s(x)
    return f"{fmt_s(x)} ± {error:.1%}"


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


def fmt_plural(n: object, singular: str, plural: str | None = None) -> str:
    """``1 micro-batch``, ``4 micro-batches`` (``plural`` defaults to ``singular + "s"``)."""
    return f"{n} {singular}" if n == 1 else f"{n} {plural or singular + 's'}"


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


def _runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    values = sorted(set(int(r) for r in ranks))
    runs: list[tuple[int, int]] = []
    for r in values:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return runs


def rank_set(ranks: Iterable[int], noun: str = "GPUs", parts: int = 4) -> str:
    """A GPU set, compact but never read as a contiguous range when it is not.

    ``[0, 1, 4, 5, 8, 9, 12, 13]`` -> ``GPUs 0–1, 4–5, 8–9, 12–13``; with more than ``parts``
    runs, the first two, an ellipsis, the last and the pattern when there is one:
    ``GPUs 0–1, 4–5, …, 28–29 (16 GPUs, blocks of 2, stride 4)``; ``GPUs 0, 8, …, 56 (8 GPUs, stride 8)``.
    """
    runs = _runs(ranks)
    if not runs:
        return f"{noun} none"
    text = lambda r: str(r[0]) if r[0] == r[1] else f"{r[0]}–{r[1]}"  # noqa: E731
    if len(runs) <= parts:
        return f"{noun} {', '.join(map(text, runs))}"
    count = sum(b - a + 1 for a, b in runs)
    lengths = {b - a + 1 for a, b in runs}
    strides = {runs[i + 1][0] - runs[i][0] for i in range(len(runs) - 1)}
    pattern = ""
    if len(lengths) == 1 and len(strides) == 1:
        length, stride = lengths.pop(), strides.pop()
        pattern = f", stride {stride}" if length == 1 else f", blocks of {length}, stride {stride}"
    return f"{noun} {text(runs[0])}, {text(runs[1])}, …, {text(runs[-1])} ({count} {noun}{pattern})"


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
        """The bin as percentages of the hottest box: ``< 2%``, ``2–10%``, ``≥ 95%``."""
        pct = lambda x: f"{x * 100:.0f}%"  # noqa: E731
        if self.high == math.inf:
            return f"≥\u00a0{pct(self.low)}"
        if self.low == 0:
            return f"<\u00a0{pct(self.high)}"
        return f"{self.low * 100:.0f}–{pct(self.high)}"


# A drawing is coloured relative to its hottest box (the bottleneck at that level): a share
# of the iteration divided by the largest share of any box on the same drawing.  Absolute bins
# (the scale before issue 19, 0.1% ... 40%) saturated at 40%, so every stage of a pipeline
# came out the same dark red.  The ratio bins are finer near the top, where the question "which
# box is the bottleneck" is decided, and the top bin starts at 95% of the hottest.
# Compute: ColorBrewer YlOrRd (7 classes); communication: ColorBrewer Blues (7 classes)
# (Harrower and Brewer, "ColorBrewer.org", The Cartographic Journal 40(1), 2003).
_EDGES = (0.0, 0.02, 0.10, 0.25, 0.50, 0.75, 0.95, math.inf)
_HEAT = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#f03b20", "#bd0026")
_COMM = ("#eff3ff", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c")
_DARK = 5  # bins from here on are dark: white text
#: A box whose share is at least this fraction of the hottest share is "the hottest" (ties
#: within 0.1% count as the same bottleneck) and gets :data:`HOTTEST_OUTLINE`.
HOTTEST_TIE = 0.999
HOTTEST_OUTLINE = "#202124"

HEAT_BINS: tuple[HeatBin, ...] = tuple(
    HeatBin(_EDGES[i], _EDGES[i + 1], _HEAT[i], "#ffffff" if i >= _DARK else "#1a1a1a") for i in range(len(_HEAT))
)
COMM_BINS: tuple[HeatBin, ...] = tuple(
    HeatBin(_EDGES[i], _EDGES[i + 1], _COMM[i], "#ffffff" if i >= _DARK else "#1a1a1a") for i in range(len(_COMM))
)


def heat_bin(ratio: float | None, comm: bool = False) -> HeatBin:
    """The bin of ``ratio`` -- a box's share of the iteration divided by the share of the
    hottest box on its drawing, 0..1 -- on the compute or the communication scale."""
    bins = COMM_BINS if comm else HEAT_BINS
    if ratio is None or not math.isfinite(ratio) or ratio < 0:
        return bins[0]
    for b in bins:
        if b.low <= ratio < b.high:
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
