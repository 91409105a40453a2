"""Export each tiny config of ``benchmarks/newarch_configs.py`` with ``torch.onnx.export(dynamo=True)``
the way ``tests/fixtures/export_models.py`` exports its causal-LM fixtures (its ``_causal_lm`` spec:
input_ids only, batch and seq symbolic, traced at [2, 16]; its ``export_dynamo``; its ``_randomise``),
into a scratch folder outside the repo (default /tmp/newarch).  Weights are kept (no stripping).
Dev script, needs the fixture venv:

    /work/fixture-venv/bin/python benchmarks/newarch_export.py [KEY ...] [--out DIR]

Prints each model's class and parameter count (``newarch_params.json`` beside the exports).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT))
import export_models as em  # noqa: E402  (also patches find_packed_sequence_indices, as for the fixtures)
from newarch_configs import CONFIGS, make_config  # noqa: E402


def export_one(key: str, out: Path) -> dict:
    import transformers

    torch.manual_seed(em.SEED)
    cfg = make_config(key)
    m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    em._randomise(m, em.SEED)
    params = sum(p.numel() for p in m.parameters())
    spec = em._causal_lm(key, key, m, cfg.vocab_size, cfg.max_position_embeddings, [])
    gen = torch.Generator().manual_seed(em.SEED)
    args = spec.make_inputs(gen, *spec.sizes(spec.traced))
    t0 = time.time()
    mp = em.export_dynamo(spec, args)
    path = out / f"{key}.onnx"
    path.write_bytes(mp.SerializeToString())
    return dict(key=key, cls=type(m).__name__, attn=cfg._attn_implementation, params=params,
                bytes=path.stat().st_size, export_s=round(time.time() - t0, 1))


def main(argv: list[str]) -> None:
    out = Path("/tmp/newarch")
    if "--out" in argv:
        i = argv.index("--out")
        out = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "newarch_params.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    for key in argv or CONFIGS:
        try:
            row = export_one(key, out)
        except Exception as exc:  # noqa: BLE001  record and go on
            print(f"{key:12s} EXPORT FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        meta[key] = row
        print(json.dumps(row), flush=True)
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
