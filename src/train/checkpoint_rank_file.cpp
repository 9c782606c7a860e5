// Writing and strictly reading rank files (see checkpoint_rank_file.hpp).
#include "train/checkpoint_rank_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "train/checkpoint_fields.hpp"
#include "train/checkpoint_files.hpp"

namespace memfit {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'M', 'E', 'M', 'F', 'I', 'T', 'C', 'K'};
constexpr const char* kRankFormat = "memfit-rank-file-2";
constexpr uint64_t kMaxHeaderBytes = 64u << 20;
constexpr uint64_t kFraming = sizeof kMagic + 8 + 8;  // magic, header length, trailing checksum
constexpr size_t kChunk = 4u << 20;

bool checkpointed(const TensorDesc& t) {
  return !t.is_view() && t.lifetime == Lifetime::persistent && t.bytes() > 0 &&
         (t.category == Category::parameters || t.category == Category::master_weights ||
          t.category == Category::optimizer_state);
}

uint64_t get_u64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | b[i];
  return v;
}

// A file opened for reading whose every failure throws [checkpoint] naming it.
class InputFile {
 public:
  explicit InputFile(const fs::path& path) : where_(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MEMFIT_CHECK(fd_ >= 0, "checkpoint", "{}: cannot open: {}", where_, std::strerror(errno));
    struct stat st {};
    MEMFIT_CHECK(::fstat(fd_, &st) == 0, "checkpoint", "{}: cannot stat: {}", where_, std::strerror(errno));
    size_ = uint64_t(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  uint64_t size() const { return size_; }
  const std::string& where() const { return where_; }
  int fd() const { return fd_; }
  void read(void* data, uint64_t bytes) {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::read(fd_, p, size_t(std::min<uint64_t>(bytes, 1u << 30)));
      if (n < 0 && errno == EINTR) continue;
      MEMFIT_CHECK(n > 0, "checkpoint", "{}: ends early or cannot be read{}", where_,
                   n < 0 ? std::string(": ") + std::strerror(errno) : std::string(" (truncated?)"));
      p += n;
      bytes -= uint64_t(n);
    }
  }
  uint64_t read_u64() {
    unsigned char b[8];
    read(b, 8);
    return get_u64(b);
  }
  uint64_t read_u64_at(uint64_t offset) const {
    unsigned char b[8];
    MEMFIT_CHECK(::pread(fd_, b, 8, off_t(offset)) == 8, "checkpoint", "{}: cannot read 8 bytes at {}", where_, offset);
    return get_u64(b);
  }

 private:
  std::string where_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

void put_u64(unsigned char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

[[noreturn]] void refuse_file(const InputFile& f, const std::string& why) {
  throw Error("checkpoint", fmt::format("{}: {}", f.where(), why));
}

// The header's tensor list against the program's: unique names, the program's order,
// dtypes and sizes. Returns the data bytes the header describes.
uint64_t check_tensor_list(const nlohmann::json& list, const Program& p, const std::vector<TensorId>& ids) {
  if (!list.is_array()) refuse_field("header.tensors", "must be an array");
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    JsonFields f(list[i], fmt::format("header.tensors[{}]", i));
    const std::string name = f.string("name");
    if (!names.insert(name).second) refuse_field(f.name("name"), fmt::format("names '{}' a second time", name));
  }
  if (list.size() != ids.size())
    refuse_field("header.tensors", fmt::format("lists {} tensors; this program checkpoints {}", list.size(), ids.size()));
  uint64_t total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    JsonFields f(list[i], fmt::format("header.tensors[{}]", i));
    const TensorDesc& t = p.tensor(ids[i]);
    const std::string name = f.string("name");
    if (name != t.name)
      refuse_field(f.name("name"), fmt::format("is '{}' where this program's tensor {} is '{}'{}", name, i, t.name,
                                               names.count(t.name) ? " (entries out of order)" : ""));
    const std::string dtype = f.string("dtype");
    if (dtype != dtype_name(t.dtype))
      refuse_field(f.name("dtype"), fmt::format("is '{}'; '{}' is {} in this program", dtype, name, dtype_name(t.dtype)));
    const int64_t bytes = f.integer("bytes", 0, std::numeric_limits<int64_t>::max());
    if (uint64_t(bytes) != t.bytes())
      refuse_field(f.name("bytes"), fmt::format("is {}; '{}' holds {} bytes in this program", bytes, name, t.bytes()));
    f.done();
    total += t.bytes();
  }
  return total;
}

// Reads magic, length and header (feeding them to `sum`) and checks them; returns the tensor
// ids in file order. Afterwards the file is positioned at the first tensor byte.
std::vector<TensorId> read_layout(InputFile& f, const Program& p, const RankFileIdentity& who, Checksum& sum) {
  if (f.size() < kFraming) refuse_file(f, fmt::format("is {} bytes, shorter than any rank file (truncated)", f.size()));
  char magic[sizeof kMagic];
  f.read(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) refuse_file(f, "is not a memfit rank file (its first bytes differ)");
  const uint64_t header_bytes = f.read_u64();
  if (header_bytes > kMaxHeaderBytes || header_bytes > f.size() - kFraming)
    refuse_file(f, fmt::format("its header length {} runs past the end of the {}-byte file (truncated or damaged)",
                               header_bytes, f.size()));
  std::string text(header_bytes, '\0');
  f.read(text.data(), header_bytes);
  unsigned char len[8];
  put_u64(len, header_bytes);
  sum.update(magic, sizeof magic);
  sum.update(len, sizeof len);
  sum.update(text.data(), text.size());
  const std::vector<TensorId> ids = checkpointed_tensors(p);
  uint64_t data_bytes = 0;
  try {
    const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
    if (header.is_discarded()) refuse_field("header", "is not valid JSON");
    JsonFields h(header, "header");
    const std::string format = h.string("format");
    if (format != kRankFormat) refuse_field("header.format", fmt::format("is '{}', not '{}'", format, kRankFormat));
    const int64_t rank = h.integer("rank", 0, std::numeric_limits<int>::max());
    const int64_t world = h.integer("world_size", 1, std::numeric_limits<int>::max());
    if (rank != who.rank || world != who.world_size)
      refuse_field("header.rank", fmt::format("says rank {} of {}; this file is rank {} of {}'s", rank, world, who.rank,
                                              who.world_size));
    const int64_t step = h.integer("step", 1, std::numeric_limits<int64_t>::max());
    if (step != who.step)
      refuse_field("header.step", fmt::format("is {}; the manifest is of step {} (a file from another save)", step, who.step));
    data_bytes = check_tensor_list(h.at("tensors"), p, ids);
    h.done();
  } catch (const Error& e) {
    refuse_file(f, std::string(e.what()).substr(e.piece().size() + 3));
  }
  const uint64_t expected = kFraming + header_bytes + data_bytes;
  if (f.size() > expected)
    refuse_file(f, fmt::format("holds {} bytes after the {} its header describes (trailing bytes)", f.size() - expected,
                               expected));
  if (f.size() < expected)
    refuse_file(f, fmt::format("is {} bytes; its header describes {} (truncated)", f.size(), expected));
  return ids;
}

void check_checksums(InputFile& f, const Checksum& sum, const RankFileEntry& entry) {
  const uint64_t actual = sum.digest(), trailer = f.read_u64();
  if (actual != trailer)
    refuse_file(f, fmt::format("checksum mismatch: its contents hash to {}, its trailer says {} (damaged)",
                               checksum_hex(actual), checksum_hex(trailer)));
  if (f.size() != entry.bytes || actual != entry.xxh3)
    refuse_file(f, fmt::format("is {} bytes with checksum {}; the manifest lists {} bytes with checksum {} (a file "
                               "from another save?)", f.size(), checksum_hex(actual), entry.bytes,
                               checksum_hex(entry.xxh3)));
}

}  // namespace

std::vector<TensorId> checkpointed_tensors(const Program& p) {
  std::vector<TensorId> ids;
  for (size_t id = 0; id < p.tensors().size(); ++id)
    if (checkpointed(p.tensors()[id])) ids.push_back(TensorId(id));
  return ids;
}

bool rank_file_lists_program_tensors(const fs::path& path, const Program& program, const RankFileEntry& entry) {
  try {
    InputFile f(path);
    if (f.size() < kFraming || entry.chunk_bytes == 0) return true;
    char magic[sizeof kMagic];
    f.read(magic, sizeof magic);
    const uint64_t header_bytes = f.read_u64();
    if (std::memcmp(magic, kMagic, sizeof magic) != 0 || header_bytes > kMaxHeaderBytes ||
        header_bytes > f.size() - kFraming)
      return true;
    // Only a header the manifest's chunk checksums vouch for says "another layout"; an edited
    // one is damage, which validate_rank_file names field by field.
    const uint64_t covered = std::min(f.size() - 8, (sizeof kMagic + 8 + header_bytes + entry.chunk_bytes - 1) /
                                                        entry.chunk_bytes * entry.chunk_bytes);
    std::string head(covered, '\0');
    ::lseek(f.fd(), 0, SEEK_SET);
    f.read(head.data(), covered);
    for (uint64_t at = 0, k = 0; at < covered; at += entry.chunk_bytes, ++k) {
      Checksum chunk;
      chunk.update(head.data() + at, size_t(std::min(entry.chunk_bytes, covered - at)));
      if (k >= entry.chunks.size() || chunk.digest() != entry.chunks[k]) return true;
    }
    const nlohmann::json header = nlohmann::json::parse(head.substr(sizeof kMagic + 8, header_bytes), nullptr, false);
    if (header.is_discarded() || !header.is_object() || !header.contains("tensors") || !header["tensors"].is_array())
      return true;
    const nlohmann::json& list = header["tensors"];
    const std::vector<TensorId> ids = checkpointed_tensors(program);
    if (list.size() != ids.size()) return false;
    for (size_t i = 0; i < ids.size(); ++i) {
      const TensorDesc& t = program.tensor(ids[i]);
      const nlohmann::json& e = list[i];
      if (!e.is_object() || e.value("name", std::string()) != t.name || !e.contains("bytes") ||
          !e["bytes"].is_number_unsigned() || e["bytes"].get<uint64_t>() != t.bytes())
        return false;
    }
    return true;
  } catch (const Error&) {
    return true;  // unreadable: validate_rank_file says why
  }
}

WrittenRankFile write_rank_file(const fs::path& path, const Executor& ex, TensorStaging& staging,
                                const RankFileIdentity& who) {
  const Program& p = ex.program();
  const std::vector<TensorId> ids = checkpointed_tensors(p);
  nlohmann::json tensors = nlohmann::json::array();
  for (TensorId id : ids) {
    const TensorDesc& t = p.tensor(id);
    tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes()}});
  }
  const std::string header = nlohmann::json{{"format", kRankFormat},
                                            {"rank", who.rank},
                                            {"world_size", who.world_size},
                                            {"step", who.step},
                                            {"tensors", tensors}}
                                 .dump();
  WrittenRankFile written;
  RankFileEntry& entry = written.entry;
  entry.chunk_bytes = kRankFileChunkBytes;
  Checksum sum, chunk;
  uint64_t in_chunk = 0;
  DurableFile out(path);
  uint64_t bytes = 0;
  auto emit = [&](const void* data, size_t n) {
    out.write(data, n);
    sum.update(data, n);
    bytes += n;
    // The chunk checksums cut the same stream at every kRankFileChunkBytes.
    for (const char* at = static_cast<const char*>(data); n > 0;) {
      const size_t take = size_t(std::min<uint64_t>(n, kRankFileChunkBytes - in_chunk));
      chunk.update(at, take);
      at += take, n -= take, in_chunk += take;
      if (in_chunk == kRankFileChunkBytes) {
        entry.chunks.push_back(chunk.digest());
        chunk.reset();
        in_chunk = 0;
      }
    }
  };
  unsigned char len[8];
  put_u64(len, header.size());
  emit(kMagic, sizeof kMagic);
  emit(len, sizeof len);
  emit(header.data(), header.size());
  for (TensorId id : ids) {
    written.root_offsets.push_back(bytes);
    for_each_chunk(ex, id, p.tensor(id).bytes(), staging.raw(),
                   [&](uint64_t, std::span<const std::byte> piece) { emit(piece.data(), piece.size()); });
  }
  if (in_chunk > 0) entry.chunks.push_back(chunk.digest());
  entry.file = path.filename().string();
  entry.bytes = bytes + 8;
  entry.xxh3 = sum.digest();
  unsigned char trailer[8];
  put_u64(trailer, entry.xxh3);
  out.write(trailer, sizeof trailer);
  out.commit();
  return written;
}

void validate_rank_file(const fs::path& path, const Program& p, const RankFileIdentity& who, const RankFileEntry& entry) {
  InputFile f(path);
  Checksum sum;
  const std::vector<TensorId> ids = read_layout(f, p, who, sum);
  std::vector<char> chunk(kChunk);
  uint64_t left = 0;
  for (TensorId id : ids) left += p.tensor(id).bytes();
  while (left > 0) {
    const uint64_t n = std::min<uint64_t>(left, chunk.size());
    f.read(chunk.data(), n);
    sum.update(chunk.data(), n);
    left -= n;
  }
  check_checksums(f, sum, entry);
}

void read_rank_file(const fs::path& path, Executor& ex, TensorStaging& staging, const RankFileIdentity& who,
                    const RankFileEntry& entry) {
  const Program& p = ex.program();
  InputFile f(path);
  Checksum sum;
  const std::span<std::byte> raw = staging.raw();
  for (TensorId id : read_layout(f, p, who, sum))
    for (uint64_t at = 0, size = p.tensor(id).bytes(); at < size; at += raw.size()) {
      const std::span<std::byte> chunk = raw.first(size_t(std::min<uint64_t>(raw.size(), size - at)));
      f.read(chunk.data(), chunk.size());
      sum.update(chunk.data(), chunk.size());
      ex.write(id, at, std::span<const std::byte>(chunk));
    }
  check_checksums(f, sum, entry);
}

RankFileEntry rank_file_trailer(const fs::path& path) {
  InputFile f(path);
  if (f.size() < kFraming) refuse_file(f, fmt::format("is {} bytes, shorter than any rank file", f.size()));
  return RankFileEntry{path.filename().string(), f.size(), f.read_u64_at(f.size() - 8), 0, {}};
}

}  // namespace memfit
