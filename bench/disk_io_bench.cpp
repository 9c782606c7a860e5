// Bandwidth of the disk tier's file as the transfer engine drives it: DiskFile::write and
// DiskFile::read called with chunks (64 MiB, a staging chunk) from a 4 KiB aligned host
// buffer, one call at a time, over a file of --gib GiB. Writes run twice: the first pass
// meets the blocks posix_fallocate reserved but never wrote (the filesystem converts them
// as it goes), the second is what every later training step sees. Then the file is read,
// and finally read and written at once from two threads on the two halves of the file, as
// the engine's two workers do. MEMFIT_DISK_IO=pread measures the pread/pwrite path.
// bench/disk_io_bench.sh puts these next to dd and fio on the same directory.
//
//   build/bench/disk_io_bench [--dir /work/offload-bench] [--gib 4] [--chunk-mib 64]
//                             [--block-kib 1024] [--depth 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "memory/disk_file.hpp"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/work/offload-bench";
  double gib = 4;
  uint64_t chunk = uint64_t(64) << 20;
  DiskIo io;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    MEMFIT_CHECK(i + 1 < argc, "bench", "{} needs a value", a);
    const char* v = argv[++i];
    if (a == "--dir") {
      o.dir = v;
    } else if (a == "--gib") {
      o.gib = std::atof(v);
    } else if (a == "--chunk-mib") {
      o.chunk = uint64_t(std::atoll(v)) << 20;
    } else if (a == "--block-kib") {
      o.io.block_size = uint64_t(std::atoll(v)) << 10;
    } else if (a == "--depth") {
      o.io.queue_depth = std::atoi(v);
    } else {
      throw Error("bench", "unknown option " + a);
    }
  }
  MEMFIT_CHECK(o.gib > 0 && o.chunk > 0 && o.chunk % kDiskAlignment == 0, "bench",
               "--gib must be positive and --chunk-mib a positive number of MiB");
  return o;
}

// Moves [begin, end) of the file chunk by chunk through `staging`; returns seconds.
double pass(DiskFile& file, std::byte* staging, uint64_t chunk, uint64_t begin, uint64_t end, bool writing) {
  const auto t0 = Clock::now();
  for (uint64_t at = begin; at < end; at += chunk) {
    const size_t n = size_t(std::min(chunk, end - at));
    if (writing) {
      file.write(at, std::span<const std::byte>(staging, n));
    } else {
      file.read(at, std::span<std::byte>(staging, n));
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct AlignedChunk {
  std::byte* data;
  explicit AlignedChunk(uint64_t bytes) : data(static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, bytes))) {
    MEMFIT_CHECK(data != nullptr, "bench", "cannot allocate {} bytes", bytes);
    for (uint64_t i = 0; i < bytes; ++i) data[i] = std::byte((i * 2654435761u) >> 24);
  }
  ~AlignedChunk() { std::free(data); }
};

int run(const Options& o) {
  const uint64_t size = uint64_t(o.gib * double(uint64_t(1) << 30)) / o.chunk * o.chunk;
  MEMFIT_CHECK(size >= 2 * o.chunk, "bench", "--gib must hold at least two chunks");
  DiskFile file(Tier::disk, size, BufferSite{o.dir, 0, o.io});
  std::printf("file %s\n", file.describe().c_str());
  AlignedChunk a(o.chunk), b(o.chunk);
  const double gb = double(size) / 1e9;
  const double w1 = pass(file, a.data, o.chunk, 0, size, true);
  std::printf("memfit write (first pass) %.3f GB/s\n", gb / w1);
  const double w2 = pass(file, a.data, o.chunk, 0, size, true);
  std::printf("memfit write %.3f GB/s\n", gb / w2);
  const double r = pass(file, a.data, o.chunk, 0, size, false);
  std::printf("memfit read %.3f GB/s\n", gb / r);
  const uint64_t half = size / 2 / o.chunk * o.chunk;
  double tw = 0;
  const auto t0 = Clock::now();
  std::thread writer([&] { tw = pass(file, a.data, o.chunk, 0, half, true); });
  const double tr = pass(file, b.data, o.chunk, half, size, false);
  writer.join();
  const double both = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("memfit read+write at once %.3f GB/s (write %.3f, read %.3f)\n", gb / both, double(half) / 1e9 / tw,
              double(size - half) / 1e9 / tr);
  return 0;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  try {
    return memfit::run(memfit::parse(argc, argv));
  } catch (const memfit::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
