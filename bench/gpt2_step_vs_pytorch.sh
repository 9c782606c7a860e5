#!/usr/bin/env bash
# Side-by-side benchmark of one GPT-2 training step: memfit vs PyTorch eager, same model
# shape, batch, sequence and thread count, measured in one run (alternating, so all sides see
# the same machine load). Prints a markdown table for docs/benchmarks.md.
#
#   bench/gpt2_step_vs_pytorch.sh [--model gpt2] [--batch 4] [--seq 256] [--steps 5] [--rounds 2]
#                                 [--precision fp32|bf16]
#
# --model takes a GPT-2 preset or the path of an HF config.json (e.g. bench/configs/llama-125m.json:
# PyTorch then builds it with AutoModelForCausalLM).
#
# --precision bf16 runs memfit bf16 (bf16 parameters and activations, fp32 masters, AdamW
# state and gradients), memfit fp32 (for the speed-up of bf16 over fp32), and PyTorch with
# torch.autocast('cpu', dtype=torch.bfloat16) (fp32 parameters, bf16 matmuls).
#
# Needs a built memfit (scripts/build; MEMFIT, default build/memfit) and, for the PyTorch
# side, a Python with torch and transformers (PYTHON, default /opt/torchenv/bin/python; see
# tools/pytorch_gpt2_bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2 batch=4 seq=256 steps=5 rounds=2 threads=2 precision=fp32
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$precision" in
  fp32) memfit_precisions="fp32" ;;
  bf16) memfit_precisions="bf16 fp32" ;;
  *) echo "--precision must be fp32 or bf16" >&2; exit 2 ;;
esac
python=${PYTHON:-/opt/torchenv/bin/python}
if [ -f "$model" ]; then torch_model="--config $model"; else torch_model="--model $model"; fi
memfit=${MEMFIT:-build/memfit}
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  for p in $memfit_precisions; do
    OMP_NUM_THREADS=$threads "$memfit" train --model "$model" --batch "$batch" --seq "$seq" --steps $((steps + 1)) \
      --precision "$p" --val-fraction 0 --log-every 1000 --report-json "$out/memfit-$p-$r.json" >/dev/null
  done
  "$python" tools/pytorch_gpt2_bench.py $torch_model --batch "$batch" --seq "$seq" --steps "$steps" --warmup 1 \
    --threads "$threads" --precision "$precision" --json > "$out/torch-$precision-$r.json"
done
"$python" bench/summarize_step_bench.py "$out" "$rounds" "$precision"
