#!/usr/bin/env bash
# AdamW against 8-bit AdamW on a real corpus: the same model, seed, data order and schedule,
# only the optimizer differs. One run of each for --steps gives the validation losses (the
# kernels are deterministic, so a rerun gives the same losses); then --rounds shorter runs
# of --timing-steps each, alternating the two optimizers so that both see the same machine
# load, give the step-time ratio (median ms/step over rounds). Also reported: the
# optimizer-state bytes of both from their plans. Prints a markdown table for
# docs/benchmarks.md.
#
#   bench/optimizer_convergence.sh [--data ../shared/data/tinyshakespeare.txt] [--model gpt2-tiny]
#       [--batch 16] [--seq 128] [--steps 600] [--rounds 3] [--timing-steps 100] [--threads 2]
#
# Needs a built memfit (scripts/build; MEMFIT overrides the path) and python3 for the
# summary (tools/summarize_optimizer_bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/tinyshakespeare.txt model=gpt2-tiny batch=16 seq=128 steps=600 rounds=3 threads=2
timing_steps=100
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --timing-steps) timing_steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
out=$(mktemp -d)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() {  # optimizer steps report
  OMP_NUM_THREADS=$threads "$memfit" train --model "$model" --data "$data" --batch "$batch" --seq "$seq" \
    --steps "$2" --lr 2e-3 --warmup $(($2 / 10)) --lr-schedule cosine --grad-clip 1.0 --seed 1337 \
    --eval-every $(($2 / 4)) --eval-batches 40 --optimizer "$1" --log-every 1000000 --report-json "$3" >/dev/null
}
for opt in adamw adamw8bit; do run "$opt" "$steps" "$out/$opt.json"; done
for r in $(seq 1 "$rounds"); do
  for opt in adamw adamw8bit; do run "$opt" "$timing_steps" "$out/$opt.timing$r.json"; done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 tools/summarize_optimizer_bench.py "$out" "$rounds"
