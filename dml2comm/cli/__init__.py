"""Command line front end: the only package that parses arguments, prints or sets exit codes.

    python main.py MODEL.onnx --d 2 --p 4 --t 2          analyse, write data.json
    python main.py zoo gpt --layers 12 ... -o gpt.onnx   build a shape-only model
    python main.py presets                               list GPUs and clusters

One module per command (:mod:`~dml2comm.cli.analyse` the main command, :mod:`~dml2comm.cli.zoo`,
:mod:`~dml2comm.cli.presets`, :mod:`~dml2comm.cli.collective`, :mod:`~dml2comm.cli.search` for
sweep and compare, :mod:`~dml2comm.cli.trace`, :mod:`~dml2comm.cli.validate`), imported when it
runs, beside the argument pieces they share (:mod:`~dml2comm.cli.args`) and the terminal's
progress bars (:mod:`~dml2comm.cli.progress`).  The packages below return values and raise
:class:`~dml2comm.errors.Dml2CommError`; :func:`main` turns such an error into one line
``error: ...`` on stderr and exit code 2; nothing is written.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path
from typing import Any, Sequence

from dml2comm.errors import ConfigError, Dml2CommError, Terminated
from dml2comm.cli.commands import COMMANDS
from dml2comm.gc_tuning import collect_rarely

__all__ = ["main"]


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    own = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if own else None
    try:
        with collect_rarely():  # dml2comm.gc_tuning: fewer needless collections of the analysis's objects
            return _main(argv)
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:  # each command's module is imported when it runs
            module, function = COMMANDS[argv[0]]
            return getattr(importlib.import_module(module), function)(argv[1:])
        from dml2comm.cli.analyse import analysis_parser, run_analysis

        if not argv:
            analysis_parser().print_help()
            return 2
        _check_not_a_command_typo(argv[0])
        return run_analysis(argv)
    except Dml2CommError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a write that failed after the up-front checks (disk full, a folder removed meanwhile)
        where = f" {str(exc.filename)!r}" if exc.filename else ""
        print(f"error: cannot read or write{where}: {_one_line(exc.strerror or str(exc))}; check the output path, its permissions "
              "and the free space", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("error: terminated (SIGTERM); nothing was written (the staging folders are removed)", file=sys.stderr)
        return 143


def _check_not_a_command_typo(first: str) -> None:
    """``sweeep model.onnx`` -> ``unknown command 'sweeep'; did you mean 'sweep'?`` instead of
    argparse's "unrecognized arguments: model.onnx". A first word that is an existing file, names an
    ``.onnx`` file or is a flag is a model (or an option), never a command."""
    if first.startswith("-") or first.lower().endswith(".onnx") or Path(first).exists():
        return
    from dml2comm.cli.analyse import SUBCOMMANDS

    close = difflib.get_close_matches(first.lower(), SUBCOMMANDS, n=1, cutoff=0.6)
    if close:
        raise ConfigError(f"unknown command {first!r}; did you mean {close[0]!r}? (commands: {', '.join(SUBCOMMANDS)}; "
                          "or give a model file)")


def _one_line(text: str) -> str:
    """The error on one line, its control characters (a model's dim name holding ESC) replaced."""
    from dml2comm.fmt import printable

    return " ".join(printable(text).split())
