#!/usr/bin/env bash
# Side-by-side GPT-2 training step of two memfit binaries (an older commit and this one), to show
# a refactor costs nothing: same model, batch, sequence, precision and threads, runs alternating
# old/new within each round so both see the same machine load. The fp32 and bf16 product peaks
# are probed (`memfit plan --hardware cpu`) before every round, and each speed is reported as a
# share of the peak probed in its own round.
#
#   MEMFIT_OLD=/path/to/old/memfit bench/step_old_vs_new.sh [--model gpt2] [--batch 4] [--seq 256]
#                                                           [--steps 5] [--rounds 3]
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2 batch=4 seq=256 steps=5 rounds=3 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
old=${MEMFIT_OLD:?set MEMFIT_OLD to the older memfit binary}
new=${MEMFIT:-build/memfit}
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  OMP_NUM_THREADS=$threads "$new" plan --hardware cpu 2>&1 | grep 'peaks measured' > "$out/probe-$r.txt"
  for p in fp32 bf16; do
    for side in old new; do
      bin=$old; [ "$side" = new ] && bin=$new
      OMP_NUM_THREADS=$threads "$bin" train --model "$model" --batch "$batch" --seq "$seq" --steps $((steps + 1)) \
        --precision "$p" --val-fraction 0 --log-every 1000 --report-json "$out/$side-$p-$r.json" >/dev/null
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, re, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
peaks = []
for r in range(1, rounds + 1):
    t = (out / f"probe-{r}.txt").read_text()
    peaks.append({"fp32": float(re.search(r"fp32 products ([\d.]+)", t).group(1)),
                  "bf16": float(re.search(r"bf16 ([\d.]+)", t).group(1))})
print("| precision | old ms/step | new ms/step | new / old (per-round ratios) | old % of probed peak | new % of probed peak "
      "| planned device peak, new (= measured?) | peak RSS old / new |")
print("|---|---|---|---|---|---|---|---|")
for p in ("fp32", "bf16"):
    rows = {s: [json.loads((out / f"{s}-{p}-{r}.json").read_text()) for r in range(1, rounds + 1)] for s in ("old", "new")}
    m0 = rows["new"][0]
    n, L, C, T = m0["model"]["parameters"], m0["model"]["n_layer"], m0["model"]["n_embd"], m0["policy"]["seq"]
    flops = m0["tokens_per_step"] * (6 * n + 6 * L * T * C)
    ms = {s: [x["ms_per_step"] for x in rows[s]] for s in rows}
    share = {s: statistics.median(flops / m / 1e6 / peaks[i][p] * 100 for i, m in enumerate(ms[s])) for s in ms}
    ratios = [b / a for a, b in zip(ms["old"], ms["new"])]
    equal = all(x["memory"]["planned_peak_bytes"] == x["memory"]["measured_peak_bytes"] for x in rows["new"])
    planned = m0["memory"]["planned_peak_bytes"]["device"] / 2**30
    rss = {s: max(x["memory"]["max_rss_bytes"] for x in rows[s]) / 2**30 for s in rows}
    print(f"| {p} | {statistics.median(ms['old']):.0f} | {statistics.median(ms['new']):.0f} | "
          f"{statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)}) | {share['old']:.0f}% | "
          f"{share['new']:.0f}% | {planned:.3f} GiB ({'= measured' if equal else 'MEASURED DIFFERS'}) | "
          f"{rss['old']:.2f} / {rss['new']:.2f} GiB |")
print("\nprobed peaks (GFLOP/s, fp32 / bf16) per round: " +
      "; ".join(f"{q['fp32']:.0f} / {q['bf16']:.0f}" for q in peaks))
PY
