#!/usr/bin/env bash
# Side-by-side benchmark of one GPT-2 training step: memfit vs PyTorch eager, same model
# shape, batch, sequence and thread count, measured in one run (alternating, so both see the
# same machine load). Prints a markdown table for docs/benchmarks.md.
#
#   bench/gpt2_step_vs_pytorch.sh [--model gpt2] [--batch 4] [--seq 256] [--steps 5] [--rounds 2]
#
# Needs a built memfit (scripts/build) and, for the PyTorch side, a Python with torch and
# transformers (PYTHON, default /opt/torchenv/bin/python; see tools/pytorch_gpt2_bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2 batch=4 seq=256 steps=5 rounds=2 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-/opt/torchenv/bin/python}
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  OMP_NUM_THREADS=$threads build/memfit train --model "$model" --batch "$batch" --seq "$seq" --steps $((steps + 1)) \
    --val-fraction 0 --log-every 1000 --report-json "$out/memfit$r.json" >/dev/null
  "$python" tools/pytorch_gpt2_bench.py --model "$model" --batch "$batch" --seq "$seq" --steps "$steps" --warmup 1 \
    --threads "$threads" --json > "$out/torch$r.json"
done
"$python" bench/summarize_step_bench.py "$out" "$rounds"
