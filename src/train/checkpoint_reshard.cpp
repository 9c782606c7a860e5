// Range reads of resharded checkpoints (see checkpoint_reshard.hpp). The subtle point is the
// chunking: a rank file's chunks are cut from its first byte, so a tensor's bytes need not
// start on a chunk boundary (the header has any length); a read touches every chunk that
// overlaps it, and each chunk is read, hashed and used at most once per file because the
// reads are sorted by offset and walked together with the chunks.
#include "train/checkpoint_reshard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/half.hpp"
#include "train/checkpoint_files.hpp"
#include "train/checkpoint_layout.hpp"

namespace memfit {

namespace {

namespace fs = std::filesystem;

// The global tensor names a program holds, from its parameters alone (on every rank the same,
// whatever pieces the rank holds).
std::set<std::string> global_names(const Program& p) {
  std::set<std::string> names;
  for (const ParamEntry& e : p.params()) {
    for (const StoredTensor& s : e.storage) names.insert(p.tensor(s.id).name);
    if (e.master != kNoTensor) names.insert(p.tensor(e.master).name);
    for (TensorId id : e.state) names.insert(p.tensor(id).name);
  }
  return names;
}

void check_same_tensors(const CheckpointManifest& m, const Program& p) {
  const std::set<std::string> ours = global_names(p);
  std::set<std::string> saved;
  for (const SavedTensor& t : m.tensors) {
    saved.insert(t.name);
    MEMFIT_CHECK(ours.count(t.name), "checkpoint", "holds '{}' ({} of '{}'), which this run does not have (another "
                 "--freeze, LoRA or quantisation setting?)", t.name, t.role, t.param);
  }
  for (const std::string& name : ours)
    MEMFIT_CHECK(saved.count(name), "checkpoint", "holds no tensor '{}', which this run needs", name);
}

// The reads of global elements [first, first + count) of `t`, placed from byte `to` on.
void plan_piece(const SavedTensor& t, int64_t first, int64_t count, TensorId root, uint64_t to,
                std::vector<std::vector<RangeRead>>& out) {
  const int64_t end = first + count;
  auto it = std::upper_bound(t.shards.begin(), t.shards.end(), first,
                             [](int64_t e, const TensorShard& s) { return e < s.first; });
  if (it != t.shards.begin()) --it;
  for (; it != t.shards.end() && it->first < end; ++it) {
    const int64_t lo = std::max(first, it->first), hi = std::min(end, it->first + it->count);
    if (lo >= hi) continue;
    out[size_t(it->file)].push_back(RangeRead{it->offset + dtype_bytes(t.dtype, lo - it->first),
                                              dtype_bytes(t.dtype, hi - lo), root,
                                              to + dtype_bytes(t.dtype, lo - first)});
  }
}

void sort_reads(std::vector<std::vector<RangeRead>>& plan) {
  for (auto& reads : plan)
    std::sort(reads.begin(), reads.end(), [](const RangeRead& a, const RangeRead& b) { return a.offset < b.offset; });
}

class RankFileReader {
 public:
  RankFileReader(const fs::path& path, const RankFileEntry& entry) : where_(path.string()), entry_(entry) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MEMFIT_CHECK(fd_ >= 0, "checkpoint", "{}: cannot open: {}", where_, std::strerror(errno));
    struct stat st {};
    MEMFIT_CHECK(::fstat(fd_, &st) == 0, "checkpoint", "{}: cannot stat: {}", where_, std::strerror(errno));
    size_ = uint64_t(st.st_size);
  }
  ~RankFileReader() { ::close(fd_); }
  RankFileReader(const RankFileReader&) = delete;
  RankFileReader& operator=(const RankFileReader&) = delete;

  void check_size(uint64_t reach) const {
    MEMFIT_CHECK(size_ >= reach, "checkpoint", "{}: is {} bytes, shorter than its ranges, which reach byte {} "
                 "(truncated)", where_, size_, reach);
    MEMFIT_CHECK(size_ == entry_.bytes, "checkpoint", "{}: is {} bytes; the manifest lists {}", where_, size_,
                 entry_.bytes);
  }

  // Calls use(read, offset inside the read, bytes) for every byte of `reads` (sorted by
  // offset), a verified chunk at a time.
  void read(const std::vector<RangeRead>& reads, std::span<std::byte> raw,
            const std::function<void(const RangeRead&, uint64_t, std::span<const std::byte>)>& use) {
    const uint64_t chunk = entry_.chunk_bytes, data = entry_.bytes - 8;
    MEMFIT_ASSERT(chunk > 0 && chunk <= raw.size(), "chunk of {} bytes for a staging of {}", chunk, raw.size());
    size_t first_open = 0;  // reads before it end before the current chunk
    int64_t last_chunk = -1;
    for (const RangeRead& r : reads) {
      for (uint64_t k = std::max<int64_t>(int64_t(r.offset / chunk), last_chunk + 1); k * chunk < r.offset + r.bytes;
           ++k) {
        const uint64_t lo = k * chunk, hi = std::min(lo + chunk, data);
        load_chunk(k, lo, hi, raw);
        while (first_open < reads.size() && reads[first_open].offset + reads[first_open].bytes <= lo) ++first_open;
        for (size_t j = first_open; j < reads.size() && reads[j].offset < hi; ++j) {
          const RangeRead& q = reads[j];
          const uint64_t a = std::max(lo, q.offset), b = std::min(hi, q.offset + q.bytes);
          if (a < b) use(q, a - q.offset, std::span<const std::byte>(raw.data() + (a - lo), size_t(b - a)));
        }
        last_chunk = int64_t(k);
      }
    }
  }

 private:
  void load_chunk(uint64_t k, uint64_t lo, uint64_t hi, std::span<std::byte> raw) {
    MEMFIT_CHECK(k < entry_.chunks.size() && hi <= size_, "checkpoint", "{}: bytes [{}, {}) lie past its end", where_,
                 lo, hi);
    for (uint64_t done = 0; done < hi - lo;) {
      const ssize_t n = ::pread(fd_, raw.data() + done, size_t(hi - lo - done), off_t(lo + done));
      if (n < 0 && errno == EINTR) continue;
      MEMFIT_CHECK(n > 0, "checkpoint", "{}: cannot read bytes [{}, {}){}", where_, lo, hi,
                   n < 0 ? std::string(": ") + std::strerror(errno) : std::string(" (truncated?)"));
      done += uint64_t(n);
    }
    const uint64_t actual = checksum_of(std::string_view(reinterpret_cast<const char*>(raw.data()), size_t(hi - lo)));
    MEMFIT_CHECK(actual == entry_.chunks[k], "checkpoint", "{}: checksum mismatch in bytes [{}, {}) (chunk {}): they "
                 "hash to {}, the manifest says {} (damaged)", where_, lo, hi, k, checksum_hex(actual),
                 checksum_hex(entry_.chunks[k]));
  }

  std::string where_;
  const RankFileEntry& entry_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

uint64_t reach(const std::vector<RangeRead>& reads) {
  uint64_t end = 0;
  for (const RangeRead& r : reads) end = std::max(end, r.offset + r.bytes);
  return end;
}

}  // namespace

std::vector<std::vector<RangeRead>> plan_range_reads(const CheckpointManifest& m, const Program& p, int rank) {
  check_same_tensors(m, p);
  std::map<std::string, const SavedTensor*> by_name;
  for (const SavedTensor& t : m.tensors) by_name[t.name] = &t;
  std::vector<std::vector<RangeRead>> plan(m.ranks.size());
  for (const LocalPiece& piece : local_pieces(p, rank)) {
    const SavedTensor& want = piece.tensor;
    const SavedTensor& t = *by_name.at(want.name);
    MEMFIT_CHECK(t.dtype == want.dtype && t.shape == want.shape, "checkpoint", "holds '{}' as {} {}; this run's is {} {}",
                 t.name, dtype_name(t.dtype), t.shape.to_string(), dtype_name(want.dtype), want.shape.to_string());
    plan_piece(t, piece.first, piece.count, piece.root, dtype_bytes(t.dtype, piece.at), plan);
  }
  sort_reads(plan);
  return plan;
}

void check_range_files(const fs::path& dir, const CheckpointManifest& m, const std::vector<std::vector<RangeRead>>& plan) {
  for (size_t f = 0; f < plan.size(); ++f)
    if (!plan[f].empty()) RankFileReader(dir / m.ranks[f].file, m.ranks[f]).check_size(reach(plan[f]));
}

void read_ranges(const fs::path& dir, const CheckpointManifest& m, const std::vector<std::vector<RangeRead>>& plan,
                 Executor& ex, TensorStaging& staging) {
  for (size_t f = 0; f < plan.size(); ++f) {
    if (plan[f].empty()) continue;
    RankFileReader file(dir / m.ranks[f].file, m.ranks[f]);
    file.check_size(reach(plan[f]));
    file.read(plan[f], staging.raw(), [&](const RangeRead& r, uint64_t at, std::span<const std::byte> bytes) {
      ex.write(r.root, r.root_offset + at, bytes);
    });
  }
}

void read_saved_f32(const fs::path& dir, const CheckpointManifest& m, const SavedTensor& t, int64_t first,
                    std::span<float> out, std::span<std::byte> raw) {
  MEMFIT_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, "checkpoint",
               "'{}' is {}, not a float tensor", t.name, dtype_name(t.dtype));
  const int64_t n = int64_t(out.size());
  std::vector<std::vector<RangeRead>> plan(m.ranks.size());
  plan_piece(t, first, n, kNoTensor, 0, plan);
  sort_reads(plan);
  // The stored bytes go to the front of `out`, then widen in place from the last element
  // back (element i's fp32 bytes start at 4i >= 2i + 2 for i >= 1, past what is still unread).
  const std::span<std::byte> bytes = std::as_writable_bytes(out).first(size_t(dtype_bytes(t.dtype, n)));
  for (size_t f = 0; f < plan.size(); ++f) {
    if (plan[f].empty()) continue;
    RankFileReader file(dir / m.ranks[f].file, m.ranks[f]);
    file.check_size(reach(plan[f]));
    file.read(plan[f], raw, [&](const RangeRead& r, uint64_t at, std::span<const std::byte> b) {
      std::memcpy(bytes.data() + r.root_offset + at, b.data(), b.size());
    });
  }
  if (t.dtype == DType::f32) return;
  for (int64_t i = n - 1; i >= 0; --i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    out[size_t(i)] = t.dtype == DType::bf16 ? widen(bf16_t{bits}) : widen(fp16_t{bits});
  }
}

}  // namespace memfit
