#!/usr/bin/env bash
# The QLoRA paper's headline, planned: LLaMA-65B fine-tuned on one 48 GB GPU (RTX A6000) with
# LoRA r = 64 on every linear layer, the base in NF4 with double quantisation, bf16 compute,
# gradient checkpointing (--recompute full), batch 1 x 512 (the shape of the paper's memory
# breakdown, Figure 6). Prints memfit's plan category by category against the card's memory,
# then the same run with bf16 gradients (what PEFT keeps), then training every weight for scale.
# The real LoRA + NF4 program is built and planned (graph/lora, graph/quantize_base).
#
#   bench/qlora_65b_plan.sh [--json]
# Needs a built memfit (scripts/build).
set -euo pipefail
cd "$(dirname "$0")/.."
memfit=${MEMFIT:-build/memfit}
json=""
[ "${1:-}" = "--json" ] && json="--json"
run=(--model llama-65b --hardware a6000-48gb --precision bf16 --recompute full --batch 1 --seq 512)
qlora=(--lora-rank 64 --lora-targets all-linear --quantize-base nf4 --double-quant)
echo "== QLoRA: ${run[*]} ${qlora[*]}"
"$memfit" plan "${run[@]}" "${qlora[@]}" $json
echo
echo "== the same with bf16 gradients (--grad-dtype bf16)"
"$memfit" plan "${run[@]}" "${qlora[@]}" --grad-dtype bf16 $json
echo
echo "== training every weight, same shape"
"$memfit" plan "${run[@]}" $json | sed -n '1,14p'
