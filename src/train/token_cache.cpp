#include "train/token_cache.hpp"

#include <sys/stat.h>

#include <filesystem>

#include <xxhash.h>

#include "core/error.hpp"
#include "io/mapped_file.hpp"
#include "text/tokenize_files.hpp"

namespace memfit {

namespace fs = std::filesystem;

std::string tokenized_data(const std::string& data, const std::string& tokenizer, int ranks, std::ostream& log) {
  const std::string json =
      fs::is_directory(tokenizer) ? (fs::path(tokenizer) / "tokenizer.json").string() : tokenizer;
  const MappedFile tokenizer_file = MappedFile::open(json, "text");
  struct stat st {};
  MEMFIT_CHECK(::stat(data.c_str(), &st) == 0, "data", "cannot read '{}'", data);
  // What the cache depends on: the tokenizer's bytes and the text's identity (size and time).
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, tokenizer_file.data(), tokenizer_file.size());
  const int64_t identity[3] = {int64_t(st.st_size), int64_t(st.st_mtim.tv_sec), int64_t(st.st_mtim.tv_nsec)};
  XXH3_64bits_update(h, identity, sizeof(identity));
  const uint64_t key = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  const std::string cache = fmt::format("{}.{:016x}.tokens.bin", data, key);
  if (fs::exists(cache)) {
    log << fmt::format("data: {} tokenised before, reading {}\n", data, cache);
    return cache;
  }
  MEMFIT_CHECK(ranks == 1, "data",
               "{} has no token cache for this tokenizer yet; write it on one rank first (memfit tokenize "
               "--tokenizer {} --input {} --out {} --val-fraction 0) or run once without mpirun",
               data, tokenizer, data, cache);
  const text::Tokenizer t = text::Tokenizer::load(tokenizer);
  text::TokenizeOptions options;
  options.inputs = {data};
  options.out = cache;
  options.val_fraction = 0;  // the trainer takes its own validation split from the end
  const text::TokenizeResult r = text::tokenize_files(t, options);
  log << fmt::format("data: tokenised {} ({} bytes) into {} tokens, cached in {}\n", data, r.input_bytes,
                     r.train_tokens, cache);
  return cache;
}

}  // namespace memfit
