#!/usr/bin/env bash
# How fast memfit plans big models: wall seconds of `memfit plan` for Llama-2-70B (one plan,
# bf16, plus its fp32 comparison plan) and of `memfit plan --fit` for Llama-2-70B on 8 x H100
# (target: under 10 s), alternated over rounds; prints the median of each and the load.
# Usage: [MEMFIT=path/to/memfit] bench/fit_planning.sh [--rounds N]   (needs a build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
if [ "${1:-}" = "--rounds" ]; then rounds=$2; shift 2; fi
memfit=${MEMFIT:-build/memfit}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc -l; }
for r in $(seq 1 "$rounds"); do
  secs "$memfit" plan --model llama-2-70b --batch 1 --seq 4096 --precision bf16 --grad-dtype bf16 --attention flash >>"$tmp/plan"
  secs "$memfit" plan --model llama-2-70b --hardware h100-80gb --gpus-per-node 8 --seq 4096 --fit >>"$tmp/fit"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "plan llama-2-70b (bf16 + fp32 comparison), median s: $(median "$tmp/plan")  [all: $(tr '\n' ' ' <"$tmp/plan")]"
echo "plan --fit llama-2-70b on 8 x h100-80gb, median s: $(median "$tmp/fit")  [all: $(tr '\n' ' ' <"$tmp/fit")]"
