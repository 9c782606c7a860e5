#!/usr/bin/env bash
# LoRA against a full fine-tune on a shifted distribution (issue 17, must-show 5). gpt2-tiny
# (byte-level, vocabulary 256) is pretrained on the first --split of the text and saved; from
# that base the rest of the text (a part the base never saw) is fine-tuned twice: every weight
# (AdamW, --lr-full) and LoRA r = --rank on every linear layer (alpha --alpha, --lr-lora), with
# the same batch, sequence, seed, data order and schedule. The fine-tune text's last
# --val-fraction is held out; its loss is measured every 50 steps (all its batches, so the
# number does not depend on which batches a shorter evaluation would pick). Prints a markdown
# table for docs/benchmarks.md.
#
#   bench/lora_convergence.sh [--data ../shared/data/tinyshakespeare.txt] [--split 0.9]
#       [--pretrain-steps 1500] [--steps 300] [--batch 16] [--seq 128] [--lr-full 3e-4]
#       [--lr-lora 3e-3] [--rank 8] [--alpha 16] [--targets all-linear] [--threads 2]
#       [--reuse-base]   (OUT=DIR: keep the work in DIR; --reuse-base skips pretraining when
#                         DIR already holds the base, to try other fine-tune settings)
#       [--dora]         (also fine-tune with DoRA, --lora-dora, at LoRA's rank, alpha and rate)
#       [--init pissa,pissa_niter_4]  (also fine-tune LoRA started by each --lora-init, at LoRA's settings;
#                        olora is refused on GPT-2's Conv1D)
#
# Needs a built memfit (MEMFIT overrides build/memfit) and python3. The text is read where it
# is and split into a temporary directory; nothing is written into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${MEMFIT_TEXT:-../shared/data/tinyshakespeare.txt}
split=0.9 pretrain_steps=1500 steps=300 batch=16 seq=128 lr_full=3e-4 lr_lora=3e-3
rank=8 alpha=16 targets=all-linear threads=2 val_fraction=0.2 seed=1337 reuse_base=0 dora=0 inits=
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --split) split=$2; shift 2 ;;
    --pretrain-steps) pretrain_steps=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --lr-full) lr_full=$2; shift 2 ;;
    --lr-lora) lr_lora=$2; shift 2 ;;
    --rank) rank=$2; shift 2 ;;
    --alpha) alpha=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --val-fraction) val_fraction=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reuse-base) reuse_base=1; shift ;;
    --dora) dora=1; shift ;;
    --init) inits=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
[ -r "$data" ] || { echo "cannot read $data (give --data PATH or MEMFIT_TEXT)" >&2; exit 2; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "work directory: $out; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Byte-level: a byte offset is a token offset.
size=$(stat -c %s "$data")
cut_at=$(python3 -c "print(int($size * $split))")
head -c "$cut_at" "$data" >"$out/pretrain.txt"
tail -c +"$((cut_at + 1))" "$data" >"$out/finetune.txt"
ft_tokens=$((size - cut_at))
# Every held-out batch of the fine-tune text (the validation split is its last val_fraction).
val_batches=$(python3 -c "
n = $ft_tokens; v = n - int(n * (1 - $val_fraction))
print(max(1, (v - 1) // ($batch * $seq)))")

common=(--model gpt2-tiny --batch "$batch" --seq "$seq" --seed "$seed" --grad-clip 1.0 --log-every 1000000)
if [ "$reuse_base" = 0 ] || [ ! -f "$out/pretrain.json" ]; then
  OMP_NUM_THREADS=$threads "$memfit" train "${common[@]}" --data "$out/pretrain.txt" --val-fraction 0.05 \
    --steps "$pretrain_steps" --lr 2e-3 --warmup $((pretrain_steps / 10)) --lr-schedule cosine \
    --eval-batches 20 --save "$out/base" --report-json "$out/pretrain.json" >"$out/pretrain.log"
fi

finetune() {  # name lr extra-flags...
  local name=$1 lr=$2
  shift 2
  OMP_NUM_THREADS=$threads "$memfit" train "${common[@]}" --load "$out/base" --data "$out/finetune.txt" \
    --val-fraction "$val_fraction" --steps "$steps" --lr "$lr" --warmup $((steps / 10)) --lr-schedule cosine \
    --eval-every 50 --eval-batches "$val_batches" --report-json "$out/$name.json" "$@" >"$out/$name.log"
}
finetune full "$lr_full"
finetune lora "$lr_lora" --lora-rank "$rank" --lora-alpha "$alpha" --lora-targets "$targets"
rm -f "$out/dora.json"
[ "$dora" = 1 ] && finetune dora "$lr_lora" --lora-rank "$rank" --lora-alpha "$alpha" --lora-targets "$targets" --lora-dora
rm -f "$out"/init_*.json
for init in ${inits//,/ }; do
  finetune "init_$init" "$lr_lora" --lora-rank "$rank" --lora-alpha "$alpha" --lora-targets "$targets" --lora-init "$init"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
pre, full, lora = (json.loads((out / f"{n}.json").read_text()) for n in ("pretrain", "full", "lora"))
dora = json.loads((out / "dora.json").read_text()) if (out / "dora.json").exists() else None
p = full["policy"]
print(f"model {full['model']['name']} ({full['model']['parameters']} parameters), batch {p['batch']} x {p['seq']}, "
      f"pretrain {pre['steps']} steps (validation loss {pre['validation']['last']:.4f} on its own held-out part)")
print()
print("| fine-tune step | full fine-tune | LoRA | LoRA vs full |")
print("|---|---|---|---|")
for a, b in zip(full["validation"]["history"], lora["validation"]["history"]):
    print(f"| {a['step']} | {a['loss']:.4f} | {b['loss']:.4f} | {100 * (b['loss'] - a['loss']) / a['loss']:+.2f}% |")
va, vb = full["validation"]["last"], lora["validation"]["last"]
print(f"| final training loss (one batch) | {full['loss']['last']:.4f} | {lora['loss']['last']:.4f} | |")
def memory(r):
    m = r["memory"]
    return (f"planned peak {m['planned_peak_bytes']['device'] / 2**20:.2f} MiB (measured "
            f"{m['measured_peak_bytes']['device'] / 2**20:.2f} MiB), peak RSS {m['max_rss_bytes'] / 2**20:.1f} MiB "
            f"against a {m['process']['planned_peak_rss_bytes'] / 2**20:.1f} MiB process plan")
for name, r in (("full", full), ("lora", lora)):
    print(f"| {name}: {memory(r)}, ms/step {r['ms_per_step']:.1f} | | |")
print()
print(f"validation loss at step {full['steps']}: full {va:.4f}, LoRA {vb:.4f}, LoRA {100 * (vb - va) / va:+.2f}% "
      f"({'within' if vb <= va * 1.02 else 'NOT within'} 2%)")
# Variants beside plain LoRA: DoRA, and LoRA started by each --init.
variants = ([("DoRA", dora)] if dora else []) + [
    (f"LoRA started by {p.stem[len('init_'):]}", json.loads(p.read_text())) for p in sorted(out.glob("init_*.json"))]
for name, v in variants:
    print()
    print(f"| fine-tune step | LoRA | {name} | {name} vs full |")
    print("|---|---|---|---|")
    for a, b, d in zip(full["validation"]["history"], lora["validation"]["history"], v["validation"]["history"]):
        print(f"| {a['step']} | {b['loss']:.4f} | {d['loss']:.4f} | {100 * (d['loss'] - a['loss']) / a['loss']:+.2f}% |")
    print(f"{name}: {memory(v)}, ms/step {v['ms_per_step']:.1f}")
EOF
