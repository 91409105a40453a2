"""Write ``dml2comm/validate/data/gpu_steps.json``: the measured one-GPU training steps of
``benchmarks/data/gpu_steps/`` (H100 and H200; PROVENANCE.md there), reduced to what the
``gpu-steps`` validation source reads (``dml2comm/validate/gpu_steps.py``): per measured run, the
GPU, the measuring run (one process on one machine), the model, precision mode, micro-batch and
sequence (image size for the image models), torch's parameter count, the step time (median of 10
timed steps) and the peak allocated memory.  ``tests/test_gpu_steps.py`` checks the bundled file
is what this script writes from the bundled measurements.

    PYTHONPATH=. python benchmarks/gpu_steps_package.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "gpu_steps"
OUT = ROOT / "dml2comm" / "validate" / "data" / "gpu_steps.json"
FIELDS = ("name", "mode", "micro_batch", "seq", "params", "step_s_median", "peak_alloc_bytes")


def package() -> dict:
    """The package file's content, from the bundled measurement files (``{gpu}_{run}.json``)."""
    runs = []
    for path in sorted(DATA.glob("h*_?.json")):
        gpu, run = path.stem.split("_")
        for r in json.loads(path.read_text())["runs"]:
            runs.append({"gpu": gpu, "run": run, **{k: r[k] for k in FIELDS}})
    return {"source": "benchmarks/data/gpu_steps/ (PROVENANCE.md there), written by benchmarks/gpu_steps_package.py",
            "runs": runs}


def text() -> str:
    return json.dumps(package(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(text())
    print(f"wrote {OUT.relative_to(ROOT)}: {len(package()['runs'])} runs")
