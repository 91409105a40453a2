#!/usr/bin/env bash
# Set up, then analyse the bundled example (GPT-2 small shape) at d=2 p=4 t=2 into ./out/.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/python main.py examples/gpt2-small.onnx --d 2 --p 4 --t 2 --out out "$@"
echo "open out/data.json (the drill-down site arrives with the site issue)"
