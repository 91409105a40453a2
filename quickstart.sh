#!/usr/bin/env bash
# Set up, then analyse the bundled example (GPT-2 small shape) at d=2 p=4 t=2 on two DGX A100 nodes
# into ./out/: out/data.json, out/svg_file/ and the drill-down site out/site/ (add --serve to browse it).
# The batch fills the pipeline: 256 samples in micro-batches of 8 make m = 16 = 4p micro-batches per
# replica, so the bubble is about 11% and the busiest stage (stage 3: the last blocks, the 50k-word
# LM head and the loss) sets the pace -- the plan a reviewer would recognise.  Afterwards
# `python main.py ...` works as written: main.py re-runs itself under .venv when needed.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
SHOWCASE=(examples/gpt2-small.onnx --d 2 --p 4 --t 2 --micro-batch-size 8 --global-batch-size 256 --cluster dgx-a100)
.venv/bin/python main.py "${SHOWCASE[@]}" --out out "$@"
echo "open $(pwd)/out/site/index.html in a browser (or: python main.py ${SHOWCASE[*]} --out out --serve)"
