#!/usr/bin/env bash
# ZeRO++ against plain ZeRO-3 on real text (issue 18, must-show 3): gpt2-tiny (byte-level) trained
# from scratch on --ranks ranks under mpirun, once at plain --zero 3 and once with the ZeRO++
# flags (--zeropp, by default all three: qwZ, hpZ over pairs of ranks, qgZ), both runs told
# --ranks-per-node 2 (so qgZ's two hops run, and the bytes split as on nodes of two ranks), same seed, data order, schedule and precision. The text's last
# --val-fraction is held out and evaluated whole every --eval-every steps. Prints a markdown
# table for docs/benchmarks.md, with each run's bytes sent per rank per step (intra/inter node)
# and planned vs measured peak.
#
#   bench/zeropp_convergence.sh [--data ../shared/data/tinyshakespeare.txt] [--steps 600]
#       [--ranks 4] [--batch 4] [--seq 128] [--lr 2e-3] [--precision bf16]
#       [--ranks-per-node 2] [--zeropp "--zero-quantized-weights ..."]   (OUT=DIR keeps the work in DIR)
#
# Needs a built memfit (MEMFIT overrides build/memfit), mpirun and python3. Ranks run one
# OpenMP thread each, passive (more ranks than cores spin otherwise). Nothing is written into
# the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${MEMFIT_TEXT:-../shared/data/tinyshakespeare.txt}
steps=600 ranks=4 batch=4 seq=128 lr=2e-3 precision=bf16 val_fraction=0.1 eval_every=100 seed=1337
zeropp="--zero-quantized-weights --zero-hpz-partition-size 2 --zero-quantized-gradients"
ranks_per_node=2
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --zeropp) zeropp=$2; shift 2 ;;
    --ranks-per-node) ranks_per_node=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
[ -r "$data" ] || { echo "cannot read $data (give --data PATH or MEMFIT_TEXT)" >&2; exit 2; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "work directory: $out; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Every held-out batch (byte-level: bytes are tokens; each rank reads its share of a batch).
size=$(stat -c %s "$data")
val_batches=$(python3 -c "print(max(1, (int($size * $val_fraction) - 1) // ($batch * $ranks * $seq)))")
run() {  # name flags...
  local name=$1
  shift
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive \
    "$memfit" train --model gpt2-tiny --data "$data" --val-fraction "$val_fraction" --batch "$batch" --seq "$seq" \
    --seed "$seed" --precision "$precision" --zero 3 --steps "$steps" --lr "$lr" --warmup $((steps / 10)) \
    --lr-schedule cosine --grad-clip 1.0 --eval-every "$eval_every" --eval-batches "$val_batches" \
    --ranks-per-node "$ranks_per_node" --log-every 1000000 --report-json "$out/$name.json" "$@" >"$out/$name.log"
}
run zero3
# shellcheck disable=SC2086  # the flags are words
run zeropp $zeropp
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$out" "$zeropp" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
a, b = (json.loads((out / f"{n}.json").read_text()) for n in ("zero3", "zeropp"))
p = a["policy"]
print(f"gpt2-tiny, {a['distributed']['world_size']} ranks, batch {p['batch']} x {p['seq']} per rank, {p['precision']}, "
      f"{a['steps']} steps; ZeRO++ flags: {sys.argv[2]}")
print()
print("| step | ZeRO-3 validation loss | ZeRO++ | ZeRO++ vs ZeRO-3 |")
print("|---|---|---|---|")
for x, y in zip(a["validation"]["history"], b["validation"]["history"]):
    print(f"| {x['step']} | {x['loss']:.4f} | {y['loss']:.4f} | {100 * (y['loss'] - x['loss']) / x['loss']:+.2f}% |")
for name, r in (("ZeRO-3", a), ("ZeRO++", b)):
    m, c = r["memory"], r.get("distributed", {}).get("communication", {})
    sent = (f"sent {c['bytes'] / 2**20:.2f} MiB per rank per step "
            f"(rank 0: intra-node {c['intra_node_bytes'] / 2**20:.2f}, inter-node {c['inter_node_bytes'] / 2**20:.2f}; "
            f"leaving each node {c['node_link_bytes'] / 2**20:.2f})") if c else ""
    # No speed: 4 ranks share 2 cores here, so ms/step says nothing of ZeRO++'s cost on a network.
    print(f"| {name}: planned device peak {m['planned_peak_bytes']['device']:,} B, measured "
          f"{m['measured_peak_bytes']['device']:,} B; peak RSS {m['process']['max_rss_bytes']:,} B against a "
          f"planned {m['process']['planned_peak_rss_bytes']:,} B; {sent} | | | |")
va, vb = a["validation"]["last"], b["validation"]["last"]
print()
print(f"final validation loss: ZeRO-3 {va:.4f}, ZeRO++ {vb:.4f} ({100 * (vb - va) / va:+.2f}%: "
      f"{'within' if abs(vb - va) <= 0.01 * va else 'NOT within'} 1%)")
PY
