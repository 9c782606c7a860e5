#!/usr/bin/env bash
# Checkpoints on any layout (issue 18). Two parts:
#  1. The resume matrix through the CLI: gpt2-tiny saved at step 2 on 4 ranks (ZeRO 3) and on
#     2 ranks (ZeRO 2), resumed on 2 ranks (ZeRO 1), 1 rank, and 4 ranks (ZeRO 3) to step 4,
#     with the global batch kept at 4 rows (--batch x ranks x --grad-accum). For each: the
#     resumed losses against an uninterrupted run of the new layout (largest relative
#     difference; 0 = bit for bit), the resumed run's wall time (set-up and 2 steps) and planned ==
#     measured.
#  2. memfit consolidate's peak RSS against the largest tensor and the whole model in fp32:
#     MODEL (default gpt2, 124M parameters; wte is the largest tensor) trained one step on
#     2 ranks at ZeRO 3 in bf16 (fp32 masters), then consolidated; its output is compared with
#     --save of the same run.
#
#   bench/checkpoint_reshard.sh [--model gpt2] [--skip-matrix] [--skip-consolidate]
#
# Needs a built memfit (MEMFIT, default build/memfit), mpirun, jq and GNU time.
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2 matrix=1 consolidate=1
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --skip-matrix) matrix=0; shift ;;
    --skip-consolidate) consolidate=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=$(realpath "${MEMFIT:-build/memfit}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

launch() {  # ranks, args...
  local n=$1
  shift
  if [ "$n" = 1 ]; then "$memfit" "$@"; else mpirun --allow-run-as-root --oversubscribe -np "$n" "$memfit" "$@"; fi
}

# ranks stage batch accum
layout_flags() { echo "--zero $2 --batch $3 --grad-accum $4"; }

if [ "$matrix" = 1 ]; then
  common="--model gpt2-tiny --seq 32 --val-fraction 0.05 --eval-batches 1 --log-every 0"
  echo "resume matrix (gpt2-tiny, 4 rows of 32 tokens per step; saved at step 2, resumed to step 4)"
  printf '%-38s %-22s %-13s %-9s %s\n' "saved on" "resumed on" "max rel diff" "run s" "planned == measured"
  for row in "4 3 1 1|2 1 2 1" "4 3 1 1|1 0 2 2" "2 2 2 1|4 3 1 1" "2 2 2 1|1 0 2 2" "1 0 2 2|2 3 2 1"; do
    IFS='|' read -r from to <<<"$row"
    read -r fr fs fb fa <<<"$from"
    read -r tr ts tb ta <<<"$to"
    for precision in fp32 bf16; do
      for optimizer in adamw adamw8bit; do
        ck="$work/ck-$fr-$fs-$precision-$optimizer"
        rm -rf "$ck"
        # shellcheck disable=SC2046
        launch "$fr" train $common --precision "$precision" --optimizer "$optimizer" $(layout_flags $from) --steps 2 \
          --checkpoint-dir "$ck" >"$work/save.log" 2>&1
        # shellcheck disable=SC2046
        launch "$tr" train $common --precision "$precision" --optimizer "$optimizer" $(layout_flags $to) --steps 4 \
          --report-json "$work/whole.json" >"$work/whole.log" 2>&1
        start=$(date +%s%N)
        # shellcheck disable=SC2046
        launch "$tr" train $common --precision "$precision" --optimizer "$optimizer" $(layout_flags $to) --steps 4 \
          --resume "$ck" --report-json "$work/resumed.json" >"$work/resumed.log" 2>&1
        secs=$(echo "scale=2; ($(date +%s%N) - $start) / 1000000000" | bc)
        diff=$(jq -n --slurpfile w "$work/whole.json" --slurpfile r "$work/resumed.json" \
          '[$w[0].loss.history[2:], $r[0].loss.history] | transpose | map(((.[0] - .[1]) / .[0]) | fabs) | max')
        diff=$(printf '%.1e' "$diff")
        equal=$(jq -r '[.memory.planned_peak_bytes as $p | .memory.measured_peak_bytes | to_entries[] | .value == $p[.key]] | all' \
          "$work/resumed.json")
        printf '%-38s %-22s %-13s %-9s %s\n' "$fr ranks ZeRO $fs B$fb K$fa $precision $optimizer" \
          "$tr ranks ZeRO $ts B$tb K$ta" "$diff" "$secs" "$equal"
      done
    done
  done
fi

if [ "$consolidate" = 1 ]; then
  ck="$work/ck-consolidate"
  echo
  echo "consolidate: $model, 1 step on 2 ranks at ZeRO 3, bf16 with fp32 masters"
  launch 2 train --model "$model" --precision bf16 --zero 3 --batch 1 --seq 64 --steps 1 --val-fraction 0 \
    --checkpoint-dir "$ck" --save "$work/saved" >"$work/train.log" 2>&1
  du -sh "$ck"/step-* | sed 's/^/  checkpoint: /'
  /usr/bin/time -v "$memfit" consolidate "$ck" --out "$work/out" >"$work/consolidate.log" 2>"$work/time.log"
  sed 's/^/  /' "$work/consolidate.log"
  rss_kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time.log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time.log")
  params=$(jq -r '.model_spec.parameters' "$ck"/step-*/manifest.json)
  echo "  peak RSS (GNU time) $(echo "scale=1; $rss_kib / 1024" | bc) MiB, wall $wall;" \
    "the model in fp32: $(echo "scale=1; $params * 4 / 1048576" | bc) MiB"
  if cmp -s "$work/out/model.safetensors" "$work/saved/model.safetensors" &&
     cmp -s "$work/out/config.json" "$work/saved/config.json"; then
    echo "  output equals --save of the same run bit for bit"
  else
    echo "  output DIFFERS from --save of the same run"
    exit 1
  fi
fi
