#!/usr/bin/env bash
# Activation-memory policies measured in one run: for each ATTENTION:RECOMPUTE config, memfit
# trains the same model and shape for a few steps and reports the planned device peak, the
# activations and temporaries at the peak, the measured arena high-water mark and ms/step.
# Rounds run every config in turn (so all see the same machine load); the summary gives
# medians over rounds and step time relative to the first config (plain:none by default).
#
#   bench/activation_policies.sh [--model gpt2] [--batch 4] [--seq 1024] [--steps 2] [--rounds 2]
#                                [--configs "plain:none plain:full flash:none ..."]
#
# Long sequences need a model with more positions than GPT-2's 1024, e.g.
#   bench/activation_policies.sh --model bench/configs/gpt2-8k.json --batch 1 --seq 4096
# Needs a built memfit (scripts/build) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2 batch=4 seq=1024 steps=2 rounds=2 threads=2
configs="plain:none plain:full plain:every:sqrt plain:selective plain:selective:attention,mlp_activation,norms flash:none flash:selective flash:full"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/load.txt"
for r in $(seq 1 "$rounds"); do
  i=0
  for config in $configs; do
    attention=${config%%:*} recompute=${config#*:}
    OMP_NUM_THREADS=$threads build/memfit train --model "$model" --batch "$batch" --seq "$seq" --steps $((steps + 1)) \
      --attention "$attention" --recompute "$recompute" --val-fraction 0 --log-every 1000 \
      --report-json "$out/r${r}_c${i}.json" > /dev/null
    echo "$config" > "$out/c${i}.name"
    i=$((i + 1))
  done
  echo "load after round $r: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
done
python3 bench/summarize_activation_bench.py "$out" "$rounds"
