"""Shared argparse pieces of the command-line entry points (cli, collective, sweep, compare).

Every bad argument becomes one :class:`~dml2comm.errors.ConfigError` line, which the caller
turns into ``error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
import difflib

from dml2comm.errors import ConfigError

__all__ = ["OneLineParser", "positive_int", "suggest_options"]


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
    flag close to a known one gets a suggestion (``--pp 2`` -> did you mean --p?)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message}{suggest_options(self, message)} (see --help)")


def positive_int(text: str) -> int:
    """argparse ``type=`` for sizes: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
