#!/usr/bin/env bash
# A model larger than this machine trains: GPT-2 XL (1.56B parameters) with fp32 AdamW needs
# 16 bytes per parameter of model states (about 25 GB) against 24 GiB of RAM. The bench shows,
# in one run on one directory:
#   1. the disk's raw O_DIRECT bandwidth (dd, 4 GiB written then read, 16 MiB blocks);
#   2. `memfit train` refusing the run before step 1 and naming the fix;
#   3. the same run with --offload-optimizer disk: planned and measured bytes of every tier, peak
#      RSS (/usr/bin/time), the step time against the same step's compute (the step less the time
#      the main thread waited for transfers), and the transfer workers' achieved read and write
#      GB/s against the raw figures; speed as a share of the probed fp32 product peak.
#
#   bench/offload_gpt2xl.sh [DIR] [--seq 512] [--grad-accum 8] [--steps 2]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=/work/offload-bench seq=512 accum=8 steps=2
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then dir=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) seq=$2; shift 2 ;;
    --grad-accum) accum=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
memfit=${MEMFIT:-build/memfit}
out=$(mktemp -d)
mkdir -p "$dir"
run=(--model gpt2-xl --batch 1 --seq "$seq" --grad-accum "$accum" --attention flash --val-fraction 0 --steps "$steps")

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$memfit" plan --hardware cpu 2>&1 | grep 'peaks measured' > "$out/probe.txt" || true

# 1. Raw O_DIRECT bandwidth of the directory's disk.
dd if=/dev/zero of="$dir/raw.bin" bs=16M count=256 oflag=direct 2> "$out/dd-write.txt"
dd if="$dir/raw.bin" of=/dev/null bs=16M iflag=direct 2> "$out/dd-read.txt"
rm -f "$dir/raw.bin"

# 2. Without offload: refused before step 1, naming the fix.
set +e
"$memfit" train "${run[@]}" > "$out/refused.log" 2>&1
refused_status=$?
set -e

# 3. With the optimizer on disk.
/usr/bin/time -v "$memfit" train "${run[@]}" --offload-optimizer disk --offload-dir "$dir" \
  --report-json "$out/offload.json" > "$out/offload.log" 2> "$out/time.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$out" "$refused_status" <<'PY'
import json, re, sys
from pathlib import Path
out, refused_status = Path(sys.argv[1]), int(sys.argv[2])
def dd_rate(name):
    m = re.search(r"copied, ([\d.]+) s, ([\d.]+) ([GM])B/s", (out / name).read_text())
    return float(m.group(2)) * (1 if m.group(3) == "G" else 1e-3)
raw_w, raw_r = dd_rate("dd-write.txt"), dd_rate("dd-read.txt")
probe = (out / "probe.txt").read_text().strip()
peak = float(re.search(r"fp32 products ([\d.]+) GFLOP/s", probe).group(1)) if probe else float("nan")
refusal = [l for l in (out / "refused.log").read_text().splitlines() if l.startswith("memfit: error")]
print(f"raw O_DIRECT (dd, 4 GiB, 16 MiB blocks): write {raw_w:.2f} GB/s, read {raw_r:.2f} GB/s")
print(f"without offload: exit {refused_status}: {refusal[0] if refusal else '(no error line)'}")
j = json.loads((out / "offload.json").read_text())
mem = j["memory"]
for t in ("device", "host", "disk"):
    p, m = mem["planned_peak_bytes"][t], mem["measured_peak_bytes"][t]
    print(f"{t:>6}: planned {p} bytes ({p / 2**30:.2f} GiB), measured {m} ({'equal' if p == m else 'DIFFERENT'})")
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", (out / "time.txt").read_text()).group(1)) * 1024
print(f"peak RSS {rss / 2**30:.2f} GiB (memfit's own figure {mem['max_rss_bytes'] / 2**30:.2f} GiB)")
phases = j["ms_per_step_by_phase"]
step = j["ms_per_step"]
waited = phases.get("transfer", 0.0)
compute = step - waited
print(f"step {step / 1e3:.1f} s = compute {compute / 1e3:.1f} s + waiting for transfers {waited / 1e3:.1f} s: "
      f"step / compute = {step / compute:.3f} (phases, ms: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()) + ")")
gflops = j["gflops_per_second"]
print(f"speed {j['tokens_per_second']:.1f} tokens/s, {gflops:.0f} GFLOP/s = {100 * gflops / peak:.0f}% of the probed "
      f"fp32 peak ({probe})")
for q, raw, verb in (("transfer.in", raw_r, "read"), ("transfer.out", raw_w, "write")):
    t = j["transfers"][q]
    print(f"{verb}: {t['bytes_per_step'] / 2**30:.2f} GiB per step in {t['busy_ms_per_step'] / 1e3:.1f} s of the "
          f"worker's time: {t['gigabytes_per_second']:.2f} GB/s = {100 * t['gigabytes_per_second'] / raw:.0f}% of raw")
PY
echo "logs: $out" >&2
