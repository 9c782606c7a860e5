#!/usr/bin/env bash
# ZeRO communication overlap (issue 6): each stage with --overlap-comm off (every collective
# blocks where the ZeRO pass puts it) and on (started early, waited for as late as the
# program allows; graph/schedule_async.hpp), alternating so both see the same load.
# Reports the median ms/step and the step's time in collective ops (starting them, and
# blocking in their waits), from the run report's ms_per_step_by_phase.communication.
# Usage: bench/zero_overlap_bench.sh [--ranks 2] [--rounds 3] [--steps 4] [--model gpt2]
#                                    [--batch 2] [--seq 128] [--build build]
set -euo pipefail
ranks=2 rounds=3 steps=4 model=gpt2 batch=2 seq=128 build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$rounds"); do
  for stage in 0 1 2 3; do
    for overlap in off on; do
      OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$build/memfit" train --model "$model" \
        --batch "$batch" --seq "$seq" --steps $((steps + 1)) --zero "$stage" --overlap-comm "$overlap" \
        --val-fraction 0 --log-every 0 --report-json "$out/$stage-$overlap-$r.json" > /dev/null
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" "$rounds" "$ranks" <<'PY'
import json, statistics, sys
out, rounds, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"| stage | overlap | ms/step (median of {rounds}) | in collectives, ms/step | planned peak MiB (rank 0) | measured == planned |")
print("|---|---|---|---|---|---|")
for stage in range(4):
    for overlap in ("off", "on"):
        runs = [json.load(open(f"{out}/{stage}-{overlap}-{r}.json")) for r in range(1, rounds + 1)]
        tokens = runs[0]["policy"]["batch"] * runs[0]["policy"]["seq"] * int(ranks)
        ms = statistics.median(1e3 * tokens / x["tokens_per_second"] for x in runs)
        comm = statistics.median(x["ms_per_step_by_phase"].get("communication", 0.0) for x in runs)
        m = runs[0]["memory"]
        equal = all(x["memory"]["planned_peak_bytes"]["device"] == x["memory"]["measured_peak_bytes"]["device"]
                    and x["memory"].get("all_ranks_equal", True) for x in runs)
        print(f"| {stage} | {overlap} | {ms:.0f} | {comm:.0f} | {m['planned_peak_bytes']['device'] / 2**20:.1f} | {equal} |")
PY
rm -rf "$out"
