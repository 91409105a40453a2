"""Terminal tables that fit: every value readable at any width, never cut to ``ite…``.

rich shrinks a table wider than the console by wrapping cells at whitespace and cutting words
that still do not fit (``94.…``); it treats the no-break space between a number and its unit
as whitespace too (``rich/_wrap.py``: words are ``\\s*\\S+\\s*``, and ``\\s`` matches U+00A0), so
``620.0 µs`` can wrap to ``620.0`` / ``µs``.  These builders decide the layout themselves:

- :func:`fit_table`: a table whose columns are each at least as wide as their widest value
  (values never wrap); when those widths do not fit the console, the same rows *stacked*: one
  block per row, a key/value pair per column.
- :func:`kv_table`: a two-column key/value table whose values are wrapped with
  :mod:`textwrap`, which breaks only at ASCII whitespace, so a number stays with its unit.

Cells are plain strings (not rich markup: model and configuration text reaches the terminal
as written, control characters replaced by :func:`~dml2comm.fmt.printable`) or :class:`rich.text.Text` with one style for the whole cell (a red total).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import Sequence, Union

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dml2comm.fmt import printable

__all__ = ["Cell", "console_width", "fit_table", "kv_table", "line", "table_width"]

Cell = Union[str, Text]

#: Console width for files and pipes (no terminal to measure): the whole table on one line.
PIPE_WIDTH = 160
#: Most tables one table is split into before its rows are stacked instead.
MAX_PARTS = 3
#: Narrowest value column of a key/value table (below it, long words are folded).
MIN_VALUE_WIDTH = 12


def console_width() -> int:
    """The width to lay out for: ``COLUMNS`` when set (as rich and ``shutil`` read it), the
    terminal's width on a TTY, else :data:`PIPE_WIDTH`."""
    env = os.environ.get("COLUMNS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return PIPE_WIDTH


def _text(cell: Cell) -> Text:
    return cell.copy() if isinstance(cell, Text) else Text(printable(cell))


def _width(cell: Cell) -> int:
    return max((cell_len(line) for line in _text(cell).plain.split("\n")), default=0)


def _header_width(name: str) -> int:
    """Headers may wrap at their spaces: the longest word."""
    return max((cell_len(w) for w in name.split(" ")), default=0)


def table_width(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> int:
    """Width of the :func:`fit_table` table layout: each column as wide as its widest value
    (or header word), one space of padding each side, and a border between and around columns."""
    widths = [max([_header_width(c)] + [_width(r[i]) for r in rows]) for i, c in enumerate(columns)]
    return sum(widths) + 3 * len(columns) + 1


def fit_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Cell]], width: int,
              left: Sequence[int] = (0,)) -> RenderableType:
    """``rows`` under ``columns``, laid out for ``width``:

    1. one table, when every column at its widest value fits;
    2. else the columns split into consecutive tables that each fit, every part repeating the
       first column (the row's name), the later parts titled ``(continued)``, when that takes at
       most :data:`MAX_PARTS` tables;
    3. else stacked: one block per row headed by
       its first cell, then ``column  value`` lines.

    ``left``: indices of left-justified columns (the others are right-justified, as numbers are)."""
    rows = [list(r) + [""] * (len(columns) - len(r)) for r in rows]
    if table_width(columns, rows) <= width:
        return _table(title, columns, rows, range(len(columns)), left)
    parts: list[list[int]] = []
    for i in range(1, len(columns)):
        if parts and table_width([columns[j] for j in parts[-1] + [i]], [[r[j] for j in parts[-1] + [i]] for r in rows]) <= width:
            parts[-1].append(i)
        elif table_width([columns[0], columns[i]], [[r[0], r[i]] for r in rows]) <= width:
            parts.append([0, i])
        else:
            parts = []
            break
    if 0 < len(parts) <= MAX_PARTS:
        return Group(*[_table(title if n == 0 else f"{title} (continued)" if title else None, columns, rows, part, left)
                       for n, part in enumerate(parts)])
    table = kv_table(title, [], width, key_width=max(cell_len(c) for c in columns))
    for n, r in enumerate(rows):
        if n:
            table.add_section()
        head = _text(r[0])
        head.stylize("bold")
        table.add_row(Text(columns[0], style="bold"), head)
        for name, cell in zip(columns[1:], r[1:]):
            if _text(cell).plain.strip():
                table.add_row(name, *_wrapped(cell, _value_width(table, width)))
    return table


def _table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Cell]], which: Sequence[int],
           left: Sequence[int]) -> Table:
    table = Table(title=title)
    for i in which:
        value_width = max([_width(r[i]) for r in rows] + [_header_width(columns[i])])
        table.add_column(columns[i], justify="left" if i in left else "right", min_width=value_width, overflow="fold")
    for r in rows:
        table.add_row(*[_text(r[i]) for i in which])
    return table


def _value_width(table: Table, width: int) -> int:
    key = table.columns[0].min_width or 1
    return max(width - key - 7, MIN_VALUE_WIDTH)  # 2 columns: 2 x 2 padding + 3 borders


def _wrapped(cell: Cell, width: int) -> list[Text]:
    """``cell`` wrapped to ``width`` at ASCII spaces only (a no-break space holds)."""
    text = _text(cell)
    lines = []
    for para in text.plain.split("\n"):
        lines += textwrap.wrap(para, width, break_on_hyphens=False, break_long_words=False) or [""]
    out = Text("\n".join(lines), style=text.style)
    return [out]


def kv_table(title: str | None, items: Sequence[tuple[str, Cell]], width: int, key_width: int | None = None) -> Table:
    """A key/value table ``width`` wide at most: keys never wrap, values wrap at ASCII spaces
    (never between a number and its unit) and fold only a word longer than the whole column."""
    key_width = key_width if key_width is not None else max((cell_len(k) for k, _ in items), default=1)
    table = Table(title=title, show_header=False)
    table.add_column("key", no_wrap=True, min_width=key_width)
    table.add_column("value", overflow="fold")
    value_width = _value_width(table, width)
    for key, value in items:
        table.add_row(key, *_wrapped(value, value_width))
    return table


def line(text: str, width: int, prefix: str = "", style: str | None = None, indent: int = 2) -> Text:
    """One message of free text (``prefix`` + ``text``) wrapped to ``width`` at ASCII spaces
    only, the continuation lines indented by ``indent``; ``style`` colours the prefix
    (``warning:`` in yellow)."""
    head = f"{prefix} " if prefix else ""
    lines = textwrap.wrap(head + printable(text), width, subsequent_indent=" " * indent, break_on_hyphens=False,
                          break_long_words=False) or [head]
    out = Text("\n".join(lines))
    if prefix and style:
        out.stylize(style, 0, len(prefix))
    return out
