#include "text/tokenize_files.hpp"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.hpp"
#include "io/mapped_file.hpp"

namespace memfit::text {

namespace {

constexpr std::string_view kPiece = "text";
// llm.c's header: 256 int32 (magic, version, token count, then zeros); see io/token_file.cpp.
constexpr int32_t kMagicUint16 = 20240520, kVersionUint16 = 1;
constexpr int32_t kMagicUint32 = 20240801, kVersionUint32 = 7;

// Appends tokens to path.tmp; finish() writes the header's count and renames it to path.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, int token_bytes)
      : path_(std::move(path)), tmp_(path_ + ".tmp"), width_(token_bytes) {
    file_ = std::fopen(tmp_.c_str(), "wb");
    MEMFIT_CHECK(file_ != nullptr, kPiece, "{}: cannot create: {}", tmp_, std::strerror(errno));
    write_header();
  }
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  ~TokenFileWriter() {
    if (file_ == nullptr) return;
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }

  void append(const std::vector<uint32_t>& ids) {
    if (width_ == 4) {
      write(ids.data(), ids.size() * 4);
    } else {
      narrow_.assign(ids.begin(), ids.end());  // the caller checked every id < 65536
      write(narrow_.data(), narrow_.size() * 2);
    }
    count_ += int64_t(ids.size());
  }

  int64_t count() const { return count_; }
  int64_t finish() {
    MEMFIT_CHECK(count_ <= std::numeric_limits<int32_t>::max(), kPiece,
                 "{}: {} tokens do not fit the llm.c header's int32 count; split the input", path_, count_);
    MEMFIT_CHECK(std::fseek(file_, 0, SEEK_SET) == 0, kPiece, "{}: cannot seek: {}", tmp_, std::strerror(errno));
    write_header();
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    MEMFIT_CHECK(closed, kPiece, "{}: cannot write: {}", tmp_, std::strerror(errno));
    std::error_code error;
    std::filesystem::rename(tmp_, path_, error);
    MEMFIT_CHECK(!error, kPiece, "{}: cannot rename to {}: {}", tmp_, path_, error.message());
    return count_;
  }

 private:
  void write_header() {
    int32_t header[256] = {};
    header[0] = width_ == 4 ? kMagicUint32 : kMagicUint16;
    header[1] = width_ == 4 ? kVersionUint32 : kVersionUint16;
    header[2] = int32_t(std::min<int64_t>(count_, std::numeric_limits<int32_t>::max()));
    write(header, sizeof(header));
  }
  void write(const void* data, size_t bytes) {
    MEMFIT_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, kPiece, "{}: cannot write: {}", tmp_,
                 std::strerror(errno));
  }

  std::string path_, tmp_;
  int width_;
  std::FILE* file_ = nullptr;
  int64_t count_ = 0;
  std::vector<uint16_t> narrow_;
};

struct Chunk {
  uint64_t begin, end;  // bytes of one input
  bool validation;
};

// The first line start at or after target (before end), or end when there is none before it.
uint64_t line_start_at_or_after(std::string_view text, uint64_t target, uint64_t end) {
  for (uint64_t p = std::max<uint64_t>(target, 1); p < end; ++p)
    if (Tokenizer::is_line_start(text, p)) return p;
  return end;
}

class Progress {
 public:
  Progress(std::ostream* out, uint64_t total) : out_(out), total_(total), start_(Clock::now()), last_(start_) {}
  void update(uint64_t done, int64_t tokens, bool final) {
    if (out_ == nullptr) return;
    const auto now = Clock::now();
    if (!final && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    const double seconds = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double mb = 1e-6 * double(done);
    *out_ << fmt::format("\r[text] tokenize: {:.1f} / {:.1f} MB ({:.0f}%), {:.1f} MB/s, {} tokens", mb,
                         1e-6 * double(total_), total_ ? 100.0 * double(done) / double(total_) : 100.0,
                         mb / seconds, tokens)
          << (final ? "\n" : "") << std::flush;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream* out_;
  uint64_t total_;
  Clock::time_point start_, last_;
};

}  // namespace

std::string validation_path(const std::string& out) {
  const std::filesystem::path path(out);
  std::string stem = path.stem().string();
  constexpr std::string_view kTrain = "_train";
  if (stem.size() > kTrain.size() && stem.compare(stem.size() - kTrain.size(), kTrain.size(), kTrain) == 0)
    stem.resize(stem.size() - kTrain.size());
  return (path.parent_path() / (stem + "_val" + path.extension().string())).string();
}

TokenizeResult tokenize_files(const Tokenizer& tokenizer, const TokenizeOptions& options) {
  MEMFIT_CHECK(!options.inputs.empty(), kPiece, "tokenize: no input files");
  MEMFIT_CHECK(options.val_fraction >= 0 && options.val_fraction < 1, kPiece,
               "tokenize: --val-fraction {} is not in [0, 1)", options.val_fraction);
  MEMFIT_CHECK(options.chunk_bytes > 0, kPiece, "tokenize: the chunk size must be positive");
  MEMFIT_CHECK(tokenizer.splits_at_line_starts(), kPiece,
               "{}: a token of this tokenizer spans a line start, so memfit cannot cut the text into chunks",
               tokenizer.description());
  std::vector<MappedFile> files;
  TokenizeResult result;
  for (const auto& input : options.inputs) {
    files.push_back(MappedFile::open(input, kPiece));
    result.input_bytes += files.back().size();
  }
  result.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  result.train_path = options.out;
  const bool split = options.val_fraction > 0;
  if (split) result.val_path = validation_path(options.out);
  const auto val_start = uint64_t(double(result.input_bytes) * (1.0 - options.val_fraction));

  TokenFileWriter train(result.train_path, result.token_bytes);
  std::optional<TokenFileWriter> val;
  if (split) val.emplace(result.val_path, result.token_bytes);
  Progress progress(options.progress, result.input_bytes);
  const size_t batch_size = size_t(4 * omp_get_max_threads());
  std::vector<Chunk> batch;
  std::vector<std::vector<uint32_t>> ids(batch_size);
  uint64_t done = 0, file_base = 0;  // bytes of the inputs before this file
  int64_t tokens = 0;

  for (const MappedFile& file : files) {
    const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
    uint64_t begin = 0;
    while (begin < text.size()) {
      batch.clear();
      while (batch.size() < batch_size && begin < text.size()) {
        const bool validation = split && file_base + begin >= val_start;
        uint64_t target = begin + options.chunk_bytes;
        if (!validation && split && file_base + begin < val_start && file_base + target > val_start)
          target = val_start - file_base;  // end the training part where the validation part starts
        const uint64_t limit = std::min<uint64_t>(text.size(), target + options.max_chunk_bytes);
        uint64_t end = target >= text.size() ? text.size() : line_start_at_or_after(text, target, limit);
        MEMFIT_CHECK(end < limit || limit == text.size(), kPiece,
                     "{}: no line start in {} bytes from byte {}; memfit tokenize cuts text at line starts",
                     file.path(), options.max_chunk_bytes, target);
        batch.push_back({begin, end, validation});
        begin = end;
      }
#pragma omp parallel for schedule(dynamic, 1)
      for (size_t i = 0; i < batch.size(); ++i) {
        ids[i].clear();
        tokenizer.encode_into(text.substr(batch[i].begin, batch[i].end - batch[i].begin), batch[i].begin == 0, ids[i]);
      }
      for (size_t i = 0; i < batch.size(); ++i) {
        if (result.token_bytes == 2)
          for (uint32_t id : ids[i])
            MEMFIT_ASSERT(id < 65536, "id {} of a vocabulary of {}", id, tokenizer.vocab_size());
        (batch[i].validation ? *val : train).append(ids[i]);
        tokens += int64_t(ids[i].size());
      }
      file.drop_pages(batch.front().begin, batch.back().end - batch.front().begin);
      done = file_base + begin;
      progress.update(done, tokens, false);
    }
    file_base += text.size();
  }
  progress.update(result.input_bytes, tokens, true);
  MEMFIT_CHECK(train.count() >= 2 && (!val || val->count() >= 2), kPiece,
               "tokenize: {} training and {} validation tokens; a token file needs at least 2 (give more text, or "
               "--val-fraction 0 for no validation file)",
               train.count(), val ? val->count() : 0);
  result.train_tokens = train.finish();
  if (val) result.val_tokens = val->finish();
  return result;
}

}  // namespace memfit::text
