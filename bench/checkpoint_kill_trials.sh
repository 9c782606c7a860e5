#!/usr/bin/env bash
# kill -9 trials for training checkpoints (issue 20). Each trial starts a run that checkpoints
# every step (gpt2-tiny, small batches) at 1 rank or under mpirun at 2 ranks, kills one of its
# processes with SIGKILL at a random moment (the memfit process; at 2 ranks rank 0, rank 1 or
# mpirun itself; whatever of the launch survives is killed 0.3 s later, like a lost node),
# then resumes from the checkpoint root with a timeout. It counts:
#   lost       the resume started before the newest checkpoint the killed run had reported
#              complete, or failed although one had been reported (must be 0)
#   hangs      resumes that hit the timeout (must be 0)
#   bit-exact  resumes whose loss history equals the uninterrupted run's from that step on
# plus where the kills landed and what the resumes skipped or cleaned up.
#
#   bench/checkpoint_kill_trials.sh [--trials 100] [--steps 16] [--seed 20] [--timeout 120]
#
# Needs a built memfit (scripts/build), mpirun and jq. Not timing-sensitive: the kill moments
# are drawn from the measured length of an uninterrupted run, so they spread over start-up,
# steps and saves on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=100 steps=16 seed=20 limit=120
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=$(realpath "${MEMFIT:-build/memfit}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
RANDOM=$seed

# Config name -> ranks and flags. A cosine schedule without --decay-steps: the resume must use
# the stored horizon to be bit-exact.
names=(np1-fp16 np2-zero2-fp32)
declare -A ranks=([np1-fp16]=1 [np2-zero2-fp32]=2)
declare -A flags=([np1-fp16]="--precision fp16" [np2-zero2-fp32]="--zero 2")
common="--model gpt2-tiny --batch 2 --seq 32 --val-fraction 0 --lr-schedule cosine --warmup 2 --steps $steps --log-every 1"

launch() {  # ranks, args...
  local n=$1
  shift
  if [ "$n" = 1 ]; then "$memfit" "$@"; else mpirun --allow-run-as-root --oversubscribe -np "$n" "$memfit" "$@"; fi
}

declare -A ref_ms
for name in "${names[@]}"; do
  start=$(date +%s%N)
  # shellcheck disable=SC2086
  launch "${ranks[$name]}" train $common ${flags[$name]} --report-json "$work/ref-$name.json" >"$work/ref-$name.log" 2>&1
  ref_ms[$name]=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "reference $name: ${ref_ms[$name]} ms, losses $(jq -c '.loss.history | length' "$work/ref-$name.json")"
done

lost=0 hangs=0 exact=0 inexact=0 resumed=0 finished=0 nothing=0 failed=0 skipped=0 cleaned=0 set_aside=0
declare -A target_count kill_phase
for t in $(seq 1 "$trials"); do
  name=${names[$((RANDOM % ${#names[@]}))]}
  n=${ranks[$name]}
  dir="$work/t$t"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  setsid bash -c "$(declare -f launch); memfit=$memfit; launch $n train $common ${flags[$name]} \
      --checkpoint-dir $dir/ck --checkpoint-every 1" >"$dir/run.log" 2>&1 &
  leader=$!
  # Uniform over [1/5, 11/10] of the uninterrupted run's length: mostly steps and saves, some
  # start-up, some after the last step.
  delay_ms=$(( ref_ms[$name] / 5 + RANDOM * (ref_ms[$name] * 9 / 10) / 32768 ))
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  members=$(pgrep -s "$leader" || true)
  ranks_pids=$(for p in $members; do [ "$(cat /proc/$p/comm 2>/dev/null)" = memfit ] && echo "$p"; done || true)
  if [ "$n" = 1 ]; then
    target=memfit victim=$(echo "$ranks_pids" | head -1)
  else
    pick=$((RANDOM % 3))
    if [ $pick = 2 ]; then target=mpirun victim=$(for p in $members; do [ "$(cat /proc/$p/comm 2>/dev/null)" = mpirun ] && echo "$p"; done | head -1 || true)
    else target=rank$pick victim=$(echo "$ranks_pids" | sed -n "$((pick + 1))p"); fi
  fi
  if [ -n "${victim:-}" ]; then kill -9 "$victim" 2>/dev/null || true; else target="$target(gone)"; fi
  sleep 0.3
  for p in $(pgrep -s "$leader" || true); do kill -9 "$p" 2>/dev/null || true; done
  wait "$leader" 2>/dev/null || true
  target_count[$target]=$(( ${target_count[$target]:-0} + 1 ))

  reported=$(grep -o 'checkpoint written to [^ ]*step-[0-9]*' "$dir/run.log" | sed 's/.*step-0*//' | sort -n | tail -1 || true)
  reported=${reported:-0}
  if grep -q '^memory:' "$dir/run.log"; then phase=after-run
  elif [ "$reported" = 0 ]; then phase=before-first-save
  else phase=during-steps; fi
  kill_phase[$phase]=$(( ${kill_phase[$phase]:-0} + 1 ))

  set +e
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" bash -c "$(declare -f launch); memfit=$memfit; launch $n train $common ${flags[$name]} \
      --resume $dir/ck --checkpoint-dir $dir/ck --checkpoint-every 1 --report-json $dir/resumed.json" \
      >"$dir/resume.log" 2>&1
  rc=$?
  set -e
  from=$(grep -o 'resumed from [^ ]* at step [0-9]*' "$dir/resume.log" | awk '{print $NF}' | head -1 || true)
  skipped=$(( skipped + $(grep -c 'resume: skipped' "$dir/resume.log" || true) ))
  cleaned=$(( cleaned + $(grep -c 'checkpoints: removed' "$dir/resume.log" || true) ))
  set_aside=$(( set_aside + $(grep -c 'checkpoints: moved' "$dir/resume.log" || true) ))
  verdict=""
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    hangs=$((hangs + 1)) verdict="HANG"
  elif [ $rc = 0 ] && [ -n "$from" ]; then
    resumed=$((resumed + 1))
    if [ "$from" -lt "$reported" ]; then lost=$((lost + 1)) verdict="LOST"; fi
    if [ "$(jq -c '.loss.history' "$dir/resumed.json")" = "$(jq -c ".loss.history[$from:]" "$work/ref-$name.json")" ]; then
      exact=$((exact + 1))
    else
      inexact=$((inexact + 1)) verdict="$verdict NOT-BIT-EXACT"
    fi
  elif grep -q "is at step $steps, not before --steps" "$dir/resume.log"; then
    finished=$((finished + 1))  # every step ran before the kill: nothing to resume
  elif [ "$reported" = 0 ] && grep -q 'holds no\( valid\)\? checkpoint\|is neither a checkpoint' "$dir/resume.log"; then
    nothing=$((nothing + 1))  # killed before its first save completed
  else
    failed=$((failed + 1)) verdict="FAILED"
    if [ "$reported" != 0 ]; then lost=$((lost + 1)) verdict="FAILED+LOST"; fi
  fi
  printf 'trial %3d %-15s kill %-7s at %5d ms (%-17s reported step %2d) -> resume rc %d from step %s %s\n' \
    "$t" "$name" "$target" "$delay_ms" "$phase," "$reported" "$rc" "${from:--}" "$verdict"
  if [ -n "$verdict" ]; then sed 's/^/    | /' "$dir/resume.log" | tail -5; fi
  rm -rf "$dir"
done

echo
echo "trials $trials: resumed $resumed, finished before the kill $finished, killed before any save $nothing, failed $failed"
echo "lost checkpoints: $lost    hangs: $hangs    bit-exact resumes: $exact of $resumed (not bit-exact: $inexact)"
echo "resumes skipped $skipped damaged or unfinished checkpoints, removed $cleaned unfinished directories, set aside $set_aside"
printf 'kill targets:'; for k in "${!target_count[@]}"; do printf ' %s %d' "$k" "${target_count[$k]}"; done; echo
printf 'kill moments:'; for k in "${!kill_phase[@]}"; do printf ' %s %d' "$k" "${kill_phase[$k]}"; done; echo
[ "$lost" = 0 ] && [ "$hangs" = 0 ] && [ "$inexact" = 0 ] && [ "$failed" = 0 ]
