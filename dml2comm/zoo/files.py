"""Saving and validating zoo models without their (never written) weights file.

A zoo model's initializers are external-data references only.  ``onnx.save_model`` writes
external data only for tensors that still hold ``raw_data`` (``write_external_data_tensors``
skips the rest), so saving the proto as is writes the ``.onnx`` file alone.  Read it back with
``onnx.load(path, load_external_data=False)``; a plain ``onnx.load`` would try to open the
missing ``.weights.bin``.

``onnx.checker.check_model`` (onnx 1.23) resolves every external ``location`` and fails with
"should be stored in ..., but it is not regular file" when the file is absent; it checks only
that a regular file exists there and never reads it.  :func:`check` therefore saves the model
into a temporary folder next to an empty ``<stem>.weights.bin`` and runs the checker on that
path (``full_check=True`` also runs strict shape inference), after checking the external-data
entries itself (``offset``/``length`` contiguous and equal to dims x element size).

References
----------
ONNX, ``docs/ExternalData.md``; ``onnx/external_data_helper.py``; ``onnx/checker.py``.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from dml2comm.errors import InputFileError, ModelError

__all__ = ["save", "check", "weights_location"]


def weights_location(onnx_path: str | os.PathLike[str]) -> str:
    """Weights file a zoo model saved at ``onnx_path`` refers to: ``<stem>.weights.bin``."""
    return f"{Path(onnx_path).stem}.weights.bin"


def save(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write only ``path`` (the ``.onnx``); its weights point at ``<stem>.weights.bin``.

    The model passed in is not modified: a copy gets the location renamed after the file stem
    and is written with ``onnx.save_model`` (no external-data conversion, nothing else written).

    Raises
    ------
    ModelError
        An initializer holds inline data (not a zoo model).
    InputFileError
        The file cannot be written.
    """
    target = Path(path)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    location = weights_location(target)
    for t in out.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL or t.HasField("raw_data"):
            raise ModelError(
                f"initializer {t.name!r} holds inline data; zoo.save writes shape-only models, "
                "use onnx.save_model for models with weights"
            )
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    try:
        onnx.save_model(out, os.fspath(target))
    except OSError as e:
        raise InputFileError(
            f"cannot write {target}: {e.strerror or e}; choose a writable path"
        ) from e
    return target


def _check_external(model: onnx.ModelProto) -> None:
    """Every initializer is external, with offsets contiguous and length = numel x itemsize."""
    offset = 0
    for t in model.graph.initializer:
        entries = {e.key: e.value for e in t.external_data}
        complete = {"location", "offset", "length"} <= set(entries)
        if t.data_location != TensorProto.EXTERNAL or not complete:
            raise ModelError(
                f"initializer {t.name!r} is not an external-data reference with location, "
                "offset and length; rebuild the model with dml2comm.zoo"
            )
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        length = math.prod(t.dims) * itemsize
        if int(entries["offset"]) != offset or int(entries["length"]) != length:
            raise ModelError(
                f"initializer {t.name!r} has offset {entries['offset']} / length "
                f"{entries['length']}, expected {offset} / {length}; rebuild the model"
            )
        offset += length


def check(model: onnx.ModelProto, full_check: bool = True) -> None:
    """Run ``onnx.checker.check_model`` on a zoo model whose weights file does not exist.

    Parameters
    ----------
    model:
        A zoo model (every initializer external).
    full_check:
        Also run the checker's strict shape inference (symbolic ``batch`` left unbound).

    Raises
    ------
    ModelError
        The checker or the external-data check failed; the message carries the checker's.
    """
    _check_external(model)
    with tempfile.TemporaryDirectory(prefix="dml2comm-zoo-") as folder:
        path = save(model, Path(folder) / "model.onnx")
        (Path(folder) / weights_location(path)).touch()
        try:
            onnx.checker.check_model(os.fspath(path), full_check=full_check)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(
                f"zoo model {model.graph.name!r} fails the ONNX checker: {first}; "
                "report this as a dml2comm.zoo bug"
            ) from e
