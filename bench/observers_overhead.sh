#!/usr/bin/env bash
# What watching a run costs: ms per step of `memfit train`, `memfit train --check-leaks` and
# `memfit profile` (trace + arena scan after every op + sentinel fill) on the same run,
# alternated over rounds so that all three see the same load; prints the median per mode.
# Usage: [MEMFIT=path/to/memfit] bench/observers_overhead.sh [--rounds N] [memfit flags...]
# (default: gpt2-tiny, batch 8 x 128; needs a build, scripts/build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
if [ "${1:-}" = "--rounds" ]; then rounds=$2; shift 2; fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--model gpt2-tiny --batch 8 --seq 128)
steps=12
memfit=${MEMFIT:-build/memfit}  # the binary to measure
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  "$memfit" train "${args[@]}" --steps $steps --val-fraction 0 --log-every 0 --report-json "$tmp/train$r.json" >/dev/null
  "$memfit" train "${args[@]}" --steps $steps --val-fraction 0 --log-every 0 --check-leaks \
    --report-json "$tmp/leaks$r.json" >/dev/null
  "$memfit" profile "${args[@]}" --steps $steps --val-fraction 0 --log-every 0 --out "$tmp/profile$r" \
    --report-json "$tmp/profile$r.json" >/dev/null
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for mode in ("train", "leaks", "profile"):
    ms = [json.load(open(f"{tmp}/{mode}{r}.json"))["ms_per_step"] for r in range(1, rounds + 1)]
    med[mode] = statistics.median(ms)
    print(f"{mode:8s} ms/step median {med[mode]:8.2f}  (rounds: {', '.join(f'{m:.1f}' for m in ms)})")
for mode in ("leaks", "profile"):
    print(f"{mode:8s} / train = {med[mode] / med['train']:.2f}x")
PY
