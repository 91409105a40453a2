"""The bundled measurement files (``dml2comm/validate/data/``), read as package data so an
installed package finds them (:func:`importlib.resources.files`)."""

from __future__ import annotations

import csv
import io
import json
from importlib import resources
from typing import Any

__all__ = ["data_text", "read_csv", "read_json"]


def data_text(name: str) -> str:
    """The text of bundled file ``name`` (see ``data/PROVENANCE.md``)."""
    return resources.files("dml2comm.validate").joinpath("data", name).read_text(encoding="utf-8")


def read_csv(name: str) -> list[dict[str, str]]:
    """The rows of bundled CSV ``name`` as dicts keyed by its header."""
    return list(csv.DictReader(io.StringIO(data_text(name))))


def read_json(name: str) -> Any:
    return json.loads(data_text(name))
