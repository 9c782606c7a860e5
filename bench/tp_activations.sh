#!/usr/bin/env bash
# Per-layer activation memory under tensor (and sequence) parallelism, as memfit plans it for
# one rank, next to Korthikanti et al. 2022 (Reducing Activation Recomputation in Large
# Transformer Models): sbh(10 + 24/t + 5as/(ht)) bytes per layer with tensor parallelism,
# sbh/t (34 + 5as/h) with sequence parallelism too, 16-bit activations, no recomputation.
# Blocks of GPT-3 175B (h 12288, a 96, s 2048, b 1) and Llama-2-70B (h 8192, a 64, 8 key/value
# heads, SwiGLU 28672, s 4096), one layer each (the per-layer count does not depend on depth),
# planned with `memfit plan --json` (memory.saved_activations_by_layer: the activations live
# across the start of the backward). The formula's dropout masks and dropped-out probabilities
# are what memfit never stores; the exact relation is tests/plan/tensor_parallel_activations_test.cpp.
#
#   bench/tp_activations.sh [--degrees "1 2 8"]
# Needs a built memfit (scripts/build) and python3. Plans only: runs in seconds, no memory.
set -euo pipefail
cd "$(dirname "$0")/.."
degrees="1 2 8"
while [ $# -gt 0 ]; do
  case "$1" in
    --degrees) degrees=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo '{"model_type":"gpt2","n_layer":1,"n_head":96,"n_embd":12288,"vocab_size":50257,"n_positions":2048,"n_ctx":2048}' \
  > "$out/gpt3-175b-block.json"
echo '{"model_type":"llama","num_hidden_layers":1,"num_attention_heads":64,"num_key_value_heads":8,"hidden_size":8192,"intermediate_size":28672,"vocab_size":32000,"max_position_embeddings":4096,"rms_norm_eps":1e-5}' \
  > "$out/llama-2-70b-block.json"
for model in gpt3-175b-block:2048 llama-2-70b-block:4096; do
  name=${model%%:*} seq=${model#*:}
  for t in $degrees; do
    for sp in "" --sequence-parallel; do
      [ "$t" = 1 ] && [ -n "$sp" ] && continue
      build/memfit plan --model "$out/$name.json" --batch 1 --seq "$seq" --precision bf16 --grad-dtype bf16 \
        --attention plain --recompute none --val-fraction 0 --world-size "$t" --tensor-parallel "$t" $sp --json \
        > "$out/$name-t$t${sp:+-sp}.json"
    done
  done
done
python3 - "$out" "$degrees" <<'PY'
import json, sys
out, degrees = sys.argv[1], [int(t) for t in sys.argv[2].split()]
shapes = {"gpt3-175b-block": (2048, 12288, 96), "llama-2-70b-block": (4096, 8192, 64)}
print("| block | t | sequence parallel | memfit per layer (MiB) | Korthikanti (MiB) | memfit / formula |")
print("|---|---|---|---|---|---|")
for name, (s, h, a) in shapes.items():
    for t in degrees:
        for sp in (False, True):
            if t == 1 and sp:
                continue
            plan = json.load(open(f"{out}/{name}-t{t}{'-sp' if sp else ''}.json"))
            got = plan["memory"]["saved_activations_by_layer"][0]
            formula = s * h / t * (34 + 5 * a * s / h) if sp else s * h * (10 + 24 / t + 5 * a * s / (h * t))
            print(f"| {name} | {t} | {'yes' if sp else 'no'} | {got / 2**20:.1f} | {formula / 2**20:.1f} | {got / formula:.3f} |")
PY
