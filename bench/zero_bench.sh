#!/usr/bin/env bash
# ZeRO benchmark (issue 6): per-rank memory and communication of GPT-2 124M, fp32 AdamW,
# batch 1 x 64 per rank (so model state dominates), for 1, 2 and 4 ranks and stages 0..3.
#   `mpirun -np N memfit train ... --steps 2 --report-json`: rank 0's planned peak (its
#   program, built by graph/zero.cpp for Topology{.data = N}) and arena high-water mark; the
#   report also says whether every rank matched its plan.
# Communication is the program's own count (ring volumes of its collectives), reported in
# units of Psi elements (Psi = parameters; 4 bytes each in fp32).
# Usage: bench/zero_bench.sh [build dir (default build)]
set -euo pipefail
BUILD=${1:-build}
MEMFIT=$BUILD/memfit
OUT=$(mktemp -d)
ARGS="--model gpt2 --batch 1 --seq 64 --val-fraction 0"
echo "load before: $(uptime)"
printf "| ranks | stage | planned peak MiB (rank 0) | measured (rank 0) | every rank measured == planned | max RSS MiB (rank 0) | sent per rank per step (Psi elements) | expected |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for N in 1 2 4; do
  for S in 0 1 2 3; do
    if [ "$N" = 1 ] && [ "$S" != 0 ]; then continue; fi
    if [ "$N" = 1 ]; then
      OMP_NUM_THREADS=1 "$MEMFIT" train $ARGS --zero "$S" --steps 2 --log-every 0 --report-json "$OUT/run.json" > /dev/null
    else
      OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np "$N" "$MEMFIT" train $ARGS --zero "$S" --steps 2 \
        --log-every 0 --report-json "$OUT/run.json" > /dev/null
    fi
    python3 - "$OUT/run.json" "$N" "$S" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
n, s = int(sys.argv[2]), int(sys.argv[3])
psi = run["model"]["parameters"]
mib = 1 << 20
sent = run["distributed"]["comm_bytes_per_step"] / 4 / psi
ring = (n - 1) / n
expected = 0 if n == 1 else (3 if s == 3 else 2) * ring
m = run["memory"]
print(f"| {n} | {s} | {m['planned_peak_bytes']['device'] / mib:.1f} | {m['measured_peak_bytes']['device'] / mib:.1f} | {m.get('all_ranks_equal', True)} | "
      f"{m['max_rss_bytes'] / mib:.0f} | {sent:.4f} | {expected:.4f} ({'3' if s == 3 else '2'}Psi x (N-1)/N) |")
PY
  done
done
echo "load after: $(uptime)"
rm -rf "$OUT"
