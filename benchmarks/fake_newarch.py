"""FakeTensor count of one training step of each architecture of ``benchmarks/newarch_configs.py``
(decoder-only causal LMs without a fixture), the same count as ``benchmarks/fake_fixtures.py``'s
(``fake_memory.count_step``: AdamW fused, 3 warm-up steps, one counted; micro-batch 4, sequence 512;
modes bf16 and amp; ``use_cache`` False as exported and True as transformers defaults; SDPA routed to
cuDNN; dropouts 0, as the eval-mode exports have no Dropout node).  Dev script (torch, transformers):

    /work/fake-venv/bin/python benchmarks/fake_newarch.py [KEY ...]   # every key writes the JSON
    /work/fake-venv/bin/python benchmarks/fake_newarch.py saved KEY LAYER MODE [cache]
        # block LAYER's saved tensors (benchmarks/fake_saved.py's listing), against
        # PYTHONPATH=. .venv/bin/python benchmarks/saved_by_op.py /tmp/newarch/KEY.onnx 4 512 LAYER MODE

The parameter count is checked against the export's (``/tmp/newarch/newarch_params.json`` written by
``benchmarks/newarch_export.py``) when that file exists.  Output: ``benchmarks/data/fake_memory_newarch.json``,
compared with the tool by ``benchmarks/bench_fake_newarch.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import fake_fixtures as ff  # noqa: E402  train_config, no_packed_sequences, B, S, MODES, USE_CACHE
import fake_memory as fm  # noqa: E402
from newarch_configs import CONFIGS, make_config  # noqa: E402

OUT = ROOT / "data" / "fake_memory_newarch.json"
EXPORTS = Path("/tmp/newarch")


def arch_row(key: str, mode: str, use_cache: bool, want: int | None) -> dict:
    cfg = make_config(key)
    config = json.loads(cfg.to_json_string(use_diff=True))
    dropouts = ff.train_config(cfg)
    cfg.use_cache = use_cache
    row = dict(name=key, fixture=str(EXPORTS / f"{key}.onnx"), config_class=type(cfg).__name__, hf_config=config,
               dropout_zeroed=dropouts, attn_implementation="sdpa", use_cache=use_cache,
               micro_batch=ff.B, seq=ff.S, b=ff.B, s=ff.S, mode=mode)
    row.update(fm.count_step(cfg, "clm", ff.B, ff.S, mode, "sdpa"))
    if want is not None and row["params"] != want:
        raise SystemExit(f"{key}: {row['params']} parameters, the export's model has {want}")
    return row


def saved(key: str, layer: int, mode: str, use_cache: bool) -> None:
    """``fake_saved.py``'s per-block listing of the saved tensors, for ``key``'s config."""
    import fake_saved

    ff.no_packed_sequences()
    cfg = make_config(key)
    ff.train_config(cfg)
    cfg.use_cache = use_cache
    fake_saved.saved_cfg(key, cfg, "clm", ff.B, ff.S, layer, mode, "sdpa")


def main(argv: list[str]) -> None:
    import transformers

    if argv[:1] == ["saved"]:
        saved(argv[1], int(argv[2]), argv[3], argv[4:5] == ["cache"])
        return

    ff.no_packed_sequences()
    meta_path = EXPORTS / "newarch_params.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    rows = []
    for key in argv or CONFIGS:
        for mode, use_cache in ((m, c) for c in ff.USE_CACHE for m in ff.MODES):
            try:
                row = arch_row(key, mode, use_cache, meta.get(key, {}).get("params"))
            except Exception as exc:  # noqa: BLE001  a model the fake step cannot run: say so
                print(f"{key:12s} {mode:4s} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            rows.append(row)
            print(f"{key:12s} {mode:4s} cache={use_cache:d} params {row['params']:>9,d} peak "
                  f"{row['peak_alloc_bytes'] / 1e9:7.4f} GB in {row['peak_phase']}", flush=True)
    if argv:
        return
    doc = {"how": "/work/fake-venv/bin/python benchmarks/fake_newarch.py (see its docstring)",
           "torch": torch.__version__, "transformers": transformers.__version__, "runs": rows}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
