// The disk file's transfers, through io_uring and through the pread/pwrite fallback, against
// an independent reference: a copy of the file's expected bytes kept in memory by the test
// (every write applied to it), compared with what DiskFile reads back and with the file read
// through a plain std::ifstream (not DiskFile). Covers aligned and unaligned offsets, lengths
// and addresses, lengths around the 4 KiB alignment and the block size, transfers of many
// blocks, the highest-write mark (known from the writes in closed form), a file truncated
// under the buffer, a descriptor that refuses writes, bad settings, and several threads
// reading and writing different ranges at once.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "memory/disk_file.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "memfit-disk-io-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// Sets MEMFIT_DISK_IO for the life of the guard.
struct DiskIoEnv {
  explicit DiskIoEnv(const char* value) {
    if (value) {
      setenv("MEMFIT_DISK_IO", value, 1);
    } else {
      unsetenv("MEMFIT_DISK_IO");
    }
  }
  ~DiskIoEnv() { unsetenv("MEMFIT_DISK_IO"); }
};

// 4 KiB aligned memory with room to start a span at any shift from an aligned address.
struct AlignedBytes {
  std::byte* base;
  explicit AlignedBytes(size_t bytes) : base(static_cast<std::byte*>(std::aligned_alloc(4096, bytes + 8192))) {}
  ~AlignedBytes() { std::free(base); }
  std::byte* at(size_t shift) const { return base + shift; }
};

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xFF);
  return v;
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::transform(chars.begin(), chars.end(), out.begin(), [](char c) { return std::byte(c); });
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Mode {
  const char* name;
  const char* env;  // MEMFIT_DISK_IO
  DiskIo io;
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

class DiskIoTest : public ::testing::TestWithParam<Mode> {
 protected:
  std::unique_ptr<DiskFile> make(uint64_t bytes) {
    DiskIoEnv env(GetParam().env);
    auto f = std::make_unique<DiskFile>(Tier::disk, bytes, BufferSite{dir.path.string(), 0, GetParam().io});
    const std::string how = f->describe();
    if (GetParam().env) {
      EXPECT_FALSE(f->uses_io_uring());
      EXPECT_NE(how.find("pread/pwrite: MEMFIT_DISK_IO=pread"), std::string::npos) << how;
    } else if (f->uses_io_uring()) {
      EXPECT_NE(how.find(fmt::format("io_uring queue depth {} x ", GetParam().io.queue_depth)), std::string::npos)
          << how;
    } else {
      EXPECT_NE(how.find("pread/pwrite: io_uring unavailable: "), std::string::npos) << how;
      ADD_FAILURE() << "this kernel refuses io_uring, its path is untested: " << how;
    }
    // O_DIRECT is the path under test; a filesystem refusing it would hide that.
    EXPECT_TRUE(f->direct()) << how;
    EXPECT_NE(how.find(", O_DIRECT)"), std::string::npos) << how;
    return f;
  }
  TempDir dir;
};

struct Range {
  uint64_t offset;
  size_t bytes;
  size_t shift;  // the memory address's distance from a 4 KiB boundary
};

TEST_P(DiskIoTest, BytesComeBackAtAnyOffsetLengthAndAddress) {
  const uint64_t B = GetParam().io.block_size;
  const uint64_t size = 24 * B + 3 * 4096 + 123;  // the file's end is not aligned
  auto file = make(size);
  const std::vector<Range> ranges = {
      {0, 0, 0},                            // nothing
      {17 * B, 0, 7},                       // nothing, above every write: no high-water mark
      {4096, 1, 0},                         // one byte, through the page cache
      {2 * 4096, 4095, 0},                  // one short of a block of O_DIRECT
      {4 * 4096, 4096, 0},                  // exactly one
      {B, size_t(B - 1), 0},                // around the block size
      {2 * B, size_t(B), 0},                //
      {3 * B + 4096, size_t(B + 1), 0},     //
      {5 * B, size_t(9 * B + 3 * 4096), 0},  // many blocks, more than the queue depth
      {15 * B + 100, size_t(2 * B + 5), 0},  // unaligned offset: all through the page cache
      {18 * B, size_t(2 * B), 1},            // unaligned address
      {20 * B + 4096, size_t(B + 4096), 512},
      {21 * B, size_t(size - 21 * B), 0},  // aligned start up to the unaligned end of the file
      {size - 1, 1, 0},                    // the last byte
  };
  std::vector<std::byte> expected(size, std::byte(0));  // fallocate reserves zeroed blocks
  AlignedBytes staging(size);
  uint64_t high = 0;
  uint64_t seed = 1;
  for (const Range& r : ranges) {
    const auto bytes = random_bytes(r.bytes, seed++);
    std::copy(bytes.begin(), bytes.end(), staging.at(r.shift));
    file->write(r.offset, std::span<const std::byte>(staging.at(r.shift), r.bytes));
    std::copy(bytes.begin(), bytes.end(), expected.begin() + ptrdiff_t(r.offset));
    if (r.bytes > 0) high = std::max(high, r.offset + r.bytes);
    EXPECT_EQ(file->measured_high_water(), high) << "after writing " << r.bytes << " bytes at " << r.offset;
  }
  EXPECT_EQ(file->measured_high_water(), size);
  for (const Range& r : ranges) {
    // Read back into a different address alignment than the write used.
    const size_t shift = r.shift == 0 ? 0 : 4096 - r.shift;
    std::fill(staging.at(0), staging.at(r.bytes + 4096), std::byte(0xEE));
    file->read(r.offset, std::span<std::byte>(staging.at(shift), r.bytes));
    const std::vector<std::byte> back(staging.at(shift), staging.at(shift + r.bytes));
    EXPECT_TRUE(std::equal(back.begin(), back.end(), expected.begin() + ptrdiff_t(r.offset)))
        << r.bytes << " bytes at " << r.offset << ", address shift " << shift;
  }
  // The whole file, O_DIRECT and unaligned reads alike, against the reference.
  std::fill(staging.at(0), staging.at(size), std::byte(0xEE));
  file->read(0, std::span<std::byte>(staging.at(0), size));
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), staging.at(0)));
  EXPECT_EQ(file_bytes(file->path()), expected);  // not through DiskFile
}

TEST_P(DiskIoTest, ATruncatedFileSaysSoRatherThanAnAlignmentError) {
  const uint64_t B = GetParam().io.block_size;
  for (const uint64_t cut : {uint64_t(0), uint64_t(5 * 4096 + 100), B + 4096}) {
    auto file = make(4 * B);
    AlignedBytes staging(4 * B);
    const auto bytes = random_bytes(4 * B, cut);
    std::copy(bytes.begin(), bytes.end(), staging.at(0));
    file->write(0, std::span<const std::byte>(staging.at(0), 4 * B));
    ASSERT_EQ(::truncate(file->path().c_str(), off_t(cut)), 0);
    // Aligned, so O_DIRECT: a read cut short at an unaligned end must not turn into EINVAL.
    const std::string what = error_of([&] { file->read(0, std::span<std::byte>(staging.at(0), 3 * B)); });
    EXPECT_NE(what.find("[memory] cannot read " + file->path() + ": the file was truncated"), std::string::npos)
        << "cut at " << cut << ": " << what;
    // What lies before the cut is still there.
    std::fill(staging.at(0), staging.at(cut), std::byte(0));
    file->read(0, std::span<std::byte>(staging.at(0), cut));
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + ptrdiff_t(cut), staging.at(0))) << "cut at " << cut;
  }
}

TEST_P(DiskIoTest, ADescriptorThatRefusesWritesFailsTheWriteNamingTheFile) {
  auto file = make(1 << 20);
  const int read_only = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(read_only, 0);
  ASSERT_EQ(::dup2(read_only, file->fd()), file->fd());
  ASSERT_EQ(::dup2(read_only, file->direct_fd()), file->direct_fd());
  ::close(read_only);
  AlignedBytes staging(1 << 20);
  const std::string what = error_of([&] { file->write(0, std::span<const std::byte>(staging.at(0), 1 << 20)); });
  EXPECT_NE(what.find("[memory] cannot write " + file->path() + ": Bad file descriptor"), std::string::npos) << what;
  EXPECT_EQ(file->measured_high_water(), 0u);  // a failed write moves nothing
}

TEST_P(DiskIoTest, ThreadsReadAndWriteDifferentRangesAtOnce) {
  // More threads than the file has rings: some transfers find every ring held and take the
  // pread/pwrite path, at the same time as others use the rings.
  constexpr int kThreads = 6;
  constexpr int kRounds = 12;
  const uint64_t B = GetParam().io.block_size;
  const uint64_t region = 3 * B + 4096 + 77;  // a tail through the page cache in each
  const uint64_t stride = (region + 4095) / 4096 * 4096;
  auto file = make(stride * kThreads);
  std::vector<std::vector<std::byte>> last(kThreads);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      AlignedBytes out(region), in(region);
      for (int k = 0; k < kRounds; ++k) {
        const auto bytes = random_bytes(region, uint64_t(t * 1000 + k));
        std::copy(bytes.begin(), bytes.end(), out.at(0));
        try {
          file->write(stride * uint64_t(t), std::span<const std::byte>(out.at(0), region));
          file->read(stride * uint64_t(t), std::span<std::byte>(in.at(0), region));
        } catch (const Error& e) {
          failures[size_t(t)] = e.what();
          return;
        }
        if (!std::equal(bytes.begin(), bytes.end(), in.at(0))) {
          failures[size_t(t)] = fmt::format("round {} read back other bytes", k);
          return;
        }
        last[size_t(t)] = bytes;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[size_t(t)], "") << "thread " << t;
  EXPECT_EQ(file->measured_high_water(), stride * (kThreads - 1) + region);
  const auto on_disk = file_bytes(file->path());
  ASSERT_EQ(on_disk.size(), stride * kThreads);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(std::equal(last[size_t(t)].begin(), last[size_t(t)].end(), on_disk.begin() + ptrdiff_t(stride * t)))
        << "thread " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, DiskIoTest,
                         ::testing::Values(Mode{"io_uring", nullptr, DiskIo{}},
                                           Mode{"io_uring_small_blocks", nullptr, DiskIo{16384, 3}},
                                           Mode{"pread", "pread", DiskIo{}}),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

// Two runs given the same --offload-dir and rank: the second is refused, and the first's tier
// keeps its bytes (it used to be truncated under the first run, which then read zeros or failed).
TEST(DiskIo, ASecondRunOnTheSameFileIsRefusedAndTheFirstKeepsItsBytes) {
  TempDir dir;
  auto first = std::make_unique<DiskFile>(Tier::disk, 1 << 20, BufferSite{dir.path.string(), 0});
  AlignedBytes staging(1 << 20);
  const auto bytes = random_bytes(1 << 20, 7);
  std::copy(bytes.begin(), bytes.end(), staging.at(0));
  first->write(0, std::span<const std::byte>(staging.at(0), 1 << 20));
  const std::string what = error_of([&] { DiskFile second(Tier::disk, 1 << 20, BufferSite{dir.path.string(), 0}); });
  EXPECT_NE(what.find("[memory] " + first->path() + " is in use by another memfit run: give each run its own "
                      "--offload-dir"),
            std::string::npos)
      << what;
  EXPECT_EQ(fs::file_size(first->path()), uint64_t(1) << 20);
  std::fill(staging.at(0), staging.at(1 << 20), std::byte(0));
  first->read(0, std::span<std::byte>(staging.at(0), 1 << 20));
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), staging.at(0)));
  // Another rank's file in the same directory is its own.
  EXPECT_NO_THROW(DiskFile(Tier::disk, 4096, BufferSite{dir.path.string(), 1}));
  first.reset();
  EXPECT_TRUE(fs::is_empty(dir.path));
  EXPECT_NO_THROW(DiskFile(Tier::disk, 4096, BufferSite{dir.path.string(), 0}));  // free again
}

TEST(DiskIo, BadSettingsAreRefusedInOneLine) {
  TempDir dir;
  auto error = [&](DiskIo io) {
    return error_of([&] { DiskFile f(Tier::disk, 1 << 20, BufferSite{dir.path.string(), 0, io}); });
  };
  EXPECT_NE(error(DiskIo{1000, 8}).find("[memory] the disk block size must be a multiple of 4 KiB"),
            std::string::npos);
  EXPECT_NE(error(DiskIo{uint64_t(1) << 31, 8}).find("up to 1 GiB"), std::string::npos);
  EXPECT_NE(error(DiskIo{1 << 20, 0}).find("[memory] the disk queue depth must be 1 to 4096, not 0"),
            std::string::npos);
  DiskIoEnv env("aio");
  EXPECT_NE(error(DiskIo{}).find("MEMFIT_DISK_IO must be io_uring or pread, not 'aio'"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path));  // refused before any file was made
}

}  // namespace
}  // namespace memfit
