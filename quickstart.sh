#!/usr/bin/env bash
# Set up, then analyse the bundled example (GPT-2 small shape) at d=2 p=4 t=2 into ./out/:
# out/data.json, out/svg_file/ and the drill-down site out/site/ (add --serve to browse it).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/python main.py examples/gpt2-small.onnx --d 2 --p 4 --t 2 --out out "$@"
echo "open $(pwd)/out/site/index.html in a browser (or: .venv/bin/python main.py examples/gpt2-small.onnx --d 2 --p 4 --t 2 --out out --serve)"
