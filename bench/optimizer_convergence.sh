#!/usr/bin/env bash
# AdamW against 8-bit AdamW on a real corpus: the same model, seed, data order and schedule,
# only the optimizer differs. Reports the validation loss of both after a fixed number of
# steps (and its relative difference), the optimizer-state bytes of both from their plans,
# and the step-time ratio (median over rounds; the two runs alternate so that both see the
# same machine load). Prints a markdown table for docs/benchmarks.md.
#
#   bench/optimizer_convergence.sh [--data ../shared/data/tinyshakespeare.txt] [--model gpt2-tiny]
#       [--batch 16] [--seq 128] [--steps 600] [--rounds 3] [--threads 2]
#
# Needs a built memfit (scripts/build) and python3 for the summary (tools/).
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/tinyshakespeare.txt model=gpt2-tiny batch=16 seq=128 steps=600 rounds=3 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
out=$(mktemp -d)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$rounds"); do
  for opt in adamw adamw8bit; do
    OMP_NUM_THREADS=$threads "$memfit" train --model "$model" --data "$data" --batch "$batch" --seq "$seq" \
      --steps "$steps" --lr 2e-3 --warmup $((steps / 10)) --lr-schedule cosine --grad-clip 1.0 --seed 1337 \
      --eval-every $((steps / 4)) --eval-batches 40 --optimizer "$opt" --log-every 1000000 \
      --report-json "$out/$opt$r.json" >/dev/null
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 tools/summarize_optimizer_bench.py "$out" "$rounds"
