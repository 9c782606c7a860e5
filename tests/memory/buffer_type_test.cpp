// The two buffer types against independent oracles: bytes written come back unchanged (a
// byte pattern generated in the test), the measured high-water mark is the highest byte the
// test itself wrote (known in closed form), a disk file really holds the planned bytes
// (stat's blocks, not just the length) and is removed afterwards, and bad places fail with a
// [memory] error rather than falling back.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "memory/arena.hpp"
#include "memory/buffer_type.hpp"
#include "memory/disk_file.hpp"

namespace memfit {
namespace {

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed * 7 + 1) & 0xFF);
  return v;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "memfit-buffer-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(BufferType, HostArenaStatesItsPropertiesAndMeasuresBySentinel) {
  const BufferType& type = host_arena_buffer_type();
  EXPECT_EQ(type.alignment(), 64u);
  EXPECT_TRUE(type.host_readable());
  EXPECT_EQ(type.high_water_method(), HighWaterMethod::sentinel_scan);
  auto buf = type.allocate(Tier::host, 10000);
  ASSERT_NE(buf->host_data(), nullptr);
  EXPECT_EQ(buf->tier(), Tier::host);
  EXPECT_EQ(buf->measured_high_water(), 0u);
  const auto bytes = pattern(300, 1);
  buf->write(5000, bytes);
  std::vector<std::byte> back(300);
  buf->read(5000, back);
  EXPECT_EQ(back, bytes);
  // The pattern's last byte is not the sentinel (0xA5), so the top is exactly 5300.
  ASSERT_NE(bytes.back(), std::byte(Arena::kSentinel));
  EXPECT_EQ(buf->measured_high_water(), 5300u);
  EXPECT_THROW(buf->write(9900, bytes), Error);
  EXPECT_THROW(buf->read(10001, std::span<std::byte>(back.data(), 0)), Error);
}

TEST(BufferType, DiskFileIsPreallocatedAlignedAndMeasuresHighestWrite) {
  TempDir dir;
  const BufferType& type = disk_file_buffer_type();
  EXPECT_EQ(type.alignment(), 4096u);
  EXPECT_FALSE(type.host_readable());
  EXPECT_EQ(type.high_water_method(), HighWaterMethod::highest_write);
  const uint64_t size = 5 * 4096 + 100;
  std::string path;
  {
    auto buf = type.allocate(Tier::disk, size, BufferSite{dir.path.string(), 3});
    EXPECT_EQ(buf->host_data(), nullptr);
    path = static_cast<DiskFile&>(*buf).path();
    EXPECT_EQ(std::filesystem::path(path).filename(), "memfit-rank3.tier");
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(uint64_t(st.st_size), size);
    EXPECT_GE(uint64_t(st.st_blocks) * 512, size);  // reserved, not a sparse hole
    EXPECT_EQ(buf->measured_high_water(), 0u);
    const auto a = pattern(4096, 2), b = pattern(1000, 3);
    buf->write(2 * 4096, a);
    buf->write(0, b);
    EXPECT_EQ(buf->measured_high_water(), 3 * 4096u);  // the highest write, not the last
    std::vector<std::byte> back_a(4096), back_b(1000);
    buf->read(2 * 4096, back_a);
    buf->read(0, back_b);
    EXPECT_EQ(back_a, a);
    EXPECT_EQ(back_b, b);
    EXPECT_THROW(buf->write(size - 10, b), Error);
    EXPECT_EQ(buf->measured_high_water(), 3 * 4096u);  // a refused write moves nothing
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // the file goes with the buffer
}

TEST(BufferType, DiskFileRefusesAMissingOrUnwritableDirectory) {
  EXPECT_THROW(disk_file_buffer_type().allocate(Tier::disk, 4096, BufferSite{"/nonexistent/memfit", 0}), Error);
  EXPECT_THROW(disk_file_buffer_type().allocate(Tier::disk, 4096, BufferSite{}), Error);
  try {
    disk_file_buffer_type().allocate(Tier::disk, 4096, BufferSite{"/nonexistent/memfit", 0});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[memory]"), std::string::npos) << e.what();
  }
}

TEST(BufferType, BackendsServeTiersWithTheDefaultTypesUnlessTheySayOtherwise) {
  auto backend = make_cpu_backend();
  EXPECT_EQ(&backend->buffer_type(Tier::device), &host_arena_buffer_type());
  EXPECT_EQ(&backend->buffer_type(Tier::host), &host_staging_buffer_type());
  EXPECT_EQ(host_staging_buffer_type().alignment(), 4096u);  // O_DIRECT transfers to and from disk
  EXPECT_EQ(&backend->buffer_type(Tier::disk), &disk_file_buffer_type());
}

}  // namespace
}  // namespace memfit
