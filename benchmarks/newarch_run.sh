#!/bin/bash
# Run the tool three ways on each export of benchmarks/newarch_export.py (default folder /tmp/newarch):
# one GPU, d2 t2 p2 on 8 GPUs, and the sweep; logs DIR/log-KEY-RUN.txt with the exit code.
#   cd <worktree> && bash benchmarks/newarch_run.sh [/tmp/newarch] [KEY ...]
DIR=${1:-/tmp/newarch}; shift
PY=/work/main/.venv/bin/python
KEYS=${*:-phi3 phi stablelm starcoder2 olmo2 qwen2_moe opt granite}
COMMON="--micro-batch-size 4 --seq-len 512 --cluster dgx-h100 --stack pytorch --precision bf16 --no-site"
for k in $KEYS; do
  f=$DIR/$k.onnx
  PYTHONPATH=. $PY main.py $f $COMMON --out $DIR/out-$k >$DIR/log-$k-1gpu.txt 2>&1; echo "rc=$?" >>$DIR/log-$k-1gpu.txt
  PYTHONPATH=. $PY main.py $f $COMMON --d 2 --t 2 --p 2 --out $DIR/out-$k-dtp >$DIR/log-$k-dtp.txt 2>&1; echo "rc=$?" >>$DIR/log-$k-dtp.txt
  PYTHONPATH=. $PY main.py sweep $f --gpus 8 --global-batch-size 32 --seq-len 512 --no-site --out $DIR/out-$k-sweep >$DIR/log-$k-sweep.txt 2>&1; echo "rc=$?" >>$DIR/log-$k-sweep.txt
  echo "$k: $(tail -1 $DIR/log-$k-1gpu.txt) $(tail -1 $DIR/log-$k-dtp.txt) $(tail -1 $DIR/log-$k-sweep.txt)"
done
