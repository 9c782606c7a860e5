#!/usr/bin/env bash
# QLoRA on a TinyLlama-1.1B-shaped model: memfit against PyTorch + peft + bitsandbytes on the
# CPU, in one run (issue 17, must-show 4). Both sides: NF4 base with double quantisation
# (block 64), LoRA r = 16 (alpha 8, no dropout unless given) on every linear layer but lm_head, bf16
# compute, recomputation (gradient checkpointing), AdamW over the adapters, batch 4 x 256, the
# same synthetic tokens (one llm.c file both read, in the same order), the same thread count.
# Random base weights: memfit initialises and quantises them at start-up; PyTorch loads a
# random bf16 checkpoint with a BitsAndBytesConfig (quantised while loading, as a user would).
# Beside them: memfit's plan of the full fine-tune (fp32 AdamW, same shape) and the products'
# peaks probed by `memfit plan --hardware cpu`.
#
# memfit runs twice in each round: once with PyTorch's recomputation (every block, as
# gradient checkpointing does), and once with `--recompute auto --memory-budget BUDGET`, where
# memfit chooses per block what to recompute so that the plan fits the budget with the least
# recomputed FLOPs (default budget 1.9 GiB: with the ~0.1 GiB the process adds, under half PyTorch's measured peak of 4.1-4.6 GiB).
#
#   bench/qlora_tinyllama.sh [--steps 2] [--rounds 1] [--threads 2] [--dir DIR] [--budget 1.9GiB] [--dora]
#                            [--lora-dropout P]
#
# --dora runs QDoRA on both sides (memfit --lora-dora, peft use_dora=True) instead of QLoRA.
# --lora-dropout P gives both sides' adapters dropout P (with --dora, PEFT's second base
# product of the dropped input).
#
# --steps counts timed steps; each side runs one untimed step first. --dir keeps the config,
# tokens and the 2.2 GB random checkpoint between runs (default /tmp/memfit-qlora-bench).
# Needs a built memfit (MEMFIT, default build/memfit) and a Python with torch, transformers,
# peft and bitsandbytes (PYTHON, default /work/venv/bin/python). About 10-15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=2 rounds=1 threads=2 dir=/tmp/memfit-qlora-bench batch=4 seq=256 budget=1.9GiB dora=() dropout=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --dora) dora=(--dora); shift ;;
    --lora-dropout) dropout=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-/work/venv/bin/python}
memfit=${MEMFIT:-build/memfit}
mkdir -p "$dir"
out=$(mktemp -d)
cat > "$dir/config.json" <<'JSON'
{
  "model_type": "llama",
  "architectures": ["LlamaForCausalLM"],
  "num_hidden_layers": 22,
  "num_attention_heads": 32,
  "num_key_value_heads": 4,
  "hidden_size": 2048,
  "intermediate_size": 5632,
  "vocab_size": 32000,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "hidden_act": "silu",
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "torch_dtype": "bfloat16"
}
JSON
# llm.c layout (magic 20240520, uint16 tokens): enough for every step of one side.
"$python" - "$dir/tokens.bin" $((batch * seq * (steps + 1) + 1)) <<'PY'
import sys, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
header = np.zeros(256, dtype="<i4"); header[:3] = (20240520, 1, n)
tokens = np.random.default_rng(1234).integers(0, 32000, size=n).astype("<u2")
with open(path, "wb") as f:
    header.tofile(f); tokens.tofile(f)
PY
lora=(--lora-rank 16 --lora-alpha 8 --lora-dropout "$dropout" --lora-targets all-linear --quantize-base nf4 --double-quant)
[ ${#dora[@]} -gt 0 ] && lora+=(--lora-dora)
run=(--model "$dir/config.json" --precision bf16 --attention flash --batch "$batch" --seq "$seq")
full=(--recompute full)
auto=(--recompute auto --memory-budget "$budget")
"$memfit" plan --model "$dir/config.json" --precision fp32 --batch "$batch" --seq "$seq" --hardware cpu --json \
  > "$out/plan-full.json"
"$memfit" plan "${run[@]}" "${full[@]}" "${lora[@]}" --hardware cpu --json > "$out/plan-qlora.json"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  for mode in full auto; do
    [ $mode = full ] && policy=("${full[@]}") || policy=("${auto[@]}")
    OMP_NUM_THREADS=$threads /usr/bin/time -v -o "$out/memfit-$mode-time-$r.txt" stdbuf -oL "$memfit" train "${run[@]}" \
      "${policy[@]}" "${lora[@]}" --steps $((steps + 1)) --lr 3e-4 --data "$dir/tokens.bin" --val-fraction 0 \
      --log-every 1 --report-json "$out/memfit-$mode-$r.json" | tee "$out/memfit-$mode-$r.log" >&2
  done
  OMP_NUM_THREADS=$threads "$python" tools/peft_qlora_bench.py --config "$dir/config.json" \
    --checkpoint "$dir/checkpoint" --data "$dir/tokens.bin" --batch "$batch" --seq "$seq" --warmup 1 \
    --steps "$steps" --threads "$threads" --lr 3e-4 --lora-dropout "$dropout" "${dora[@]}" --json 2> "$out/torch-$r.log" | tail -1 > "$out/torch-$r.json"
  grep -E '^(warmup|step) ' "$out/torch-$r.log" >&2 || true
done
"$python" bench/summarize_qlora_bench.py "$out" "$rounds"
echo "(raw results in $out)" >&2
