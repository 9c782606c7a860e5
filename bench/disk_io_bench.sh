#!/usr/bin/env bash
# Disk tier bandwidth against the disk's own: on one directory, raw O_DIRECT sequential
# bandwidth with dd (bs=16M, one request at a time) and, when installed, fio (io_uring, 1 MiB
# blocks, queue depth 8: what DiskFile issues), then build/bench/disk_io_bench (DiskFile with
# 64 MiB chunks from a 4 KiB aligned buffer) through io_uring and through pread/pwrite
# (MEMFIT_DISK_IO=pread). Prints each memfit rate over the best raw rate of its direction.
# Usage: bench/disk_io_bench.sh [directory (default /work/offload-bench)] [GiB (default 4)]
#        [build dir (default build)]
set -euo pipefail
DIR=${1:-/work/offload-bench}
GIB=${2:-4}
BUILD=${3:-build}
BENCH=$BUILD/bench/disk_io_bench
[ -x "$BENCH" ] || { echo "disk_io_bench: build it first (cmake --build $BUILD --target disk_io_bench)" >&2; exit 1; }
mkdir -p "$DIR"
FILE="$DIR/disk-io-bench.raw"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT" "$FILE" "$DIR"/memfit-rank0.tier "$DIR"/fio-bench.*' EXIT
COUNT=$((GIB * 64))  # 16 MiB blocks
echo "load before: $(uptime)"
echo "directory $DIR on $(df -hT "$DIR" | awk 'NR==2 {print $1, $2}'), $GIB GiB per pass"

gbs() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]) / 1e9:.3f}')" "$1" "$2"; }
BYTES=$((GIB * 1024 * 1024 * 1024))
timed() {  # seconds a command takes
  local t0 t1
  t0=$(date +%s.%N)
  "$@" 2> /dev/null
  t1=$(date +%s.%N)
  python3 -c "print(float('$t1') - float('$t0'))"
}

# Writes twice, as memfit does: the first allocates the file's blocks, the second overwrites
# them (every training step after the first); memfit's steady write is set against the second.
rm -f "$FILE"
DD_W1=$(gbs "$BYTES" "$(timed dd if=/dev/zero of="$FILE" bs=16M count="$COUNT" oflag=direct conv=fsync)")
DD_W=$(gbs "$BYTES" "$(timed dd if=/dev/zero of="$FILE" bs=16M count="$COUNT" oflag=direct conv=notrunc,fsync)")
DD_R=$(gbs "$BYTES" "$(timed dd if="$FILE" of=/dev/null bs=16M count="$COUNT" iflag=direct)")
rm -f "$FILE"
echo "dd O_DIRECT bs=16M: write $DD_W1 GB/s (new file), overwrite $DD_W GB/s, read $DD_R GB/s"

RAW_W=$DD_W
RAW_R=$DD_R
if command -v fio > /dev/null; then
  fio_rate() {  # $1: write or read; GB/s. A second write overwrites the first's file.
    fio --name=fio-bench --directory="$DIR" --rw="$1" --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 \
      --size="${GIB}G" --numjobs=1 --end_fsync=1 --output-format=json > "$OUT/fio.json"
    python3 - "$OUT/fio.json" "$1" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
print(f"{job['bw_bytes'] / 1e9:.3f}")
PY
  }
  FIO_W1=$(fio_rate write)
  FIO_W=$(fio_rate write)
  FIO_R=$(fio_rate read)
  rm -f "$DIR"/fio-bench.*
  echo "fio io_uring O_DIRECT bs=1M iodepth=8: write $FIO_W1 GB/s (new file), overwrite $FIO_W GB/s, read $FIO_R GB/s"
  RAW_W=$(python3 -c "print(max($DD_W, $FIO_W))")
  RAW_R=$(python3 -c "print(max($DD_R, $FIO_R))")
else
  echo "fio not installed (apt-get install -y fio): raw is dd alone"
fi

for how in io_uring pread; do
  MEMFIT_DISK_IO=$how "$BENCH" --dir "$DIR" --gib "$GIB" --chunk-mib 64 > "$OUT/memfit.txt"
  sed "s/^/  [$how] /" "$OUT/memfit.txt"
  W=$(awk '/^memfit write [0-9]/ {print $3}' "$OUT/memfit.txt")
  R=$(awk '/^memfit read [0-9]/ {print $3}' "$OUT/memfit.txt")
  python3 -c "print(f'memfit {\"$how\":8s} write $W GB/s = {$W / $RAW_W:.0%} of raw $RAW_W, read $R GB/s = {$R / $RAW_R:.0%} of raw $RAW_R')"
done
echo "load after: $(uptime)"
