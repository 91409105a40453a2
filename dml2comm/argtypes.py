"""Shared argparse pieces of the command-line entry points (cli, collective, sweep, compare).

Every bad argument becomes one :class:`~dml2comm.errors.ConfigError` line, which the caller
turns into ``error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse

from dml2comm.errors import ConfigError

__all__ = ["OneLineParser", "positive_int"]


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so every error is one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see --help)")


def positive_int(text: str) -> int:
    """argparse ``type=`` for sizes: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
