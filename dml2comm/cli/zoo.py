"""The ``zoo`` subcommand: build a shape-only ONNX model (:mod:`dml2comm.zoo`) and write it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Sequence

from dml2comm.cli.args import OneLineParser
from dml2comm.errors import ConfigError
from dml2comm.fmt import decimal_int

__all__ = ["run_zoo"]


def _int_list(text: str) -> list[int]:
    try:
        return [decimal_int(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _integer(text: str) -> int:
    """A zoo size in plain digits (``int()`` would also read '１６' and '1_6'); its range is the
    zoo's own check (:func:`dml2comm.zoo.build`)."""
    try:
        return decimal_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    """A zoo quantity in ASCII (``float()`` would also read '１.５' and '1_0'); whether it is finite
    and in range is the zoo's own check."""
    try:
        if not text.isascii() or "_" in text:
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def run_zoo(argv: Sequence[str]) -> int:
    from dml2comm import zoo

    parser = OneLineParser(
        prog="python main.py zoo",
        description="Build a shape-only ONNX model (weights are external references to a file that is not written).",
        epilog="examples:\n  python main.py zoo gpt --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq-len 2048 -o out/gpt3.onnx\n"
        "  python main.py zoo llama --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn-hidden 28672 --vocab 32000 "
        "--seq-len 4096 -o out/llama70b.onnx\n"
        "  python main.py zoo preset gpt2-small -o out/gpt2.onnx",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="kind", required=True, parser_class=OneLineParser)
    for kind_name, kind in zoo.KINDS.items():
        sp = sub.add_parser(kind_name, help=kind.help, description=kind.help)
        for prm in kind.params:
            kwargs: dict[str, Any] = {"dest": prm.name, "help": prm.help}
            if prm.type is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif prm.many:
                kwargs["type"] = _int_list if prm.type is int else (lambda s: [x for x in s.split(",") if x])
            else:
                kwargs["type"] = {int: _integer, float: _number}.get(prm.type, prm.type)
            if prm.choices:
                kwargs["choices"] = list(prm.choices)
            if prm.required:
                kwargs["required"] = True
            else:
                kwargs["default"] = None
                kwargs["help"] = f"{prm.help} (default {prm.default!r})"
            sp.add_argument(prm.flag, **kwargs)
        sp.add_argument("-o", "--output", required=True, help="where to write the .onnx")
    pp = sub.add_parser("preset", help="build a named preset: " + ", ".join(sorted(zoo.PRESETS)))
    pp.add_argument("name", choices=sorted(zoo.PRESETS))
    pp.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.kind == "preset":
        kind, kwargs = zoo.PRESETS[args.name]
        model = zoo.build(kind, **kwargs)
    else:
        kwargs = {prm.name: getattr(args, prm.name) for prm in zoo.KINDS[args.kind].params if getattr(args, prm.name) is not None}
        model = zoo.build(args.kind, **kwargs)
    out = Path(args.output)
    if out.is_dir():
        raise ConfigError(f"-o {str(out)!r} is a folder; give a file name (e.g. {str(out / 'model.onnx')!r})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # as --out is: created if missing
    except OSError as exc:
        raise ConfigError(f"-o {str(out)!r}: cannot make its folder ({exc.strerror}); give a path under a folder") from None
    zoo.save(model, out)
    print(f"wrote {out} ({len(model.graph.node)} nodes) in {time.perf_counter() - start:.2f} s")
    return 0
