#!/usr/bin/env bash
# Parameter offload at ZeRO stage 3 (ZeRO-Infinity's parameter half) against the same run with
# everything resident, on one rank: GPT-2 (124M) with fp32 AdamW, stage 3, resident, then with
# the parameter shards on disk, then with the shards and the optimizer on disk. For each run: planned and measured bytes
# of every tier, peak RSS (/usr/bin/time), the step time and how much of it the main thread
# waited for transfers (the overlap), and the transfer workers' achieved read and write GB/s.
#
#   bench/offload_params.sh [DIR] [--model gpt2] [--seq 256] [--steps 4]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=/work/offload-params-bench model=gpt2 seq=256 steps=4
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then dir=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
out=$(mktemp -d)
mkdir -p "$dir"
run=(--model "$model" --batch 1 --seq "$seq" --attention flash --val-fraction 0 --steps "$steps" --zero 3)

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
bench() {  # NAME FLAGS...
  local name=$1
  shift
  /usr/bin/time -v "$memfit" train "${run[@]}" "$@" --report-json "$out/$name.json" > "$out/$name.log" 2> "$out/$name.time"
}
bench resident
bench params --offload-params disk --offload-dir "$dir"
bench both --offload-params disk --offload-optimizer disk --offload-dir "$dir"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$out" "$model" "$seq" <<'PY'
import json, re, sys
from pathlib import Path
out, model, seq = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"{model}, batch 1 x {seq}, fp32 AdamW, ZeRO stage 3 on one rank")
steps = {}
for name in ("resident", "params", "both"):
    j = json.loads((out / f"{name}.json").read_text())
    mem = j["memory"]
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", (out / f"{name}.time").read_text()).group(1))
    print(f"{name}:")
    for t in ("device", "host", "disk"):
        p, m = mem["planned_peak_bytes"][t], mem["measured_peak_bytes"][t]
        if p or m:
            print(f"  {t:>6}: planned {p} bytes ({p / 2**20:.1f} MiB), measured {m} ({'equal' if p == m else 'DIFFERENT'})")
    print(f"  peak RSS {rss / 2**20:.2f} GiB")
    step = j["ms_per_step"]
    phases = j["ms_per_step_by_phase"]
    waited = phases.get("transfer", 0.0)
    steps[name] = step
    print(f"  step {step:.0f} ms, of which waiting for transfers {waited:.0f} ms (phases, ms: " +
          ", ".join(f"{k} {v:.0f}" for k, v in phases.items()) + ")")
    for q, verb in (("transfer.in", "read"), ("transfer.out", "write")):
        t = j.get("transfers", {}).get(q)
        if t:
            print(f"  {verb}: {t['bytes_per_step'] / 2**20:.1f} MiB per step in {t['busy_ms_per_step']:.0f} ms of the "
                  f"worker's time: {t['gigabytes_per_second']:.2f} GB/s")
for name in ("params", "both"):
    print(f"step time {name} / resident = {steps[name] / steps['resident']:.3f}")
PY
rm -rf "$out"
