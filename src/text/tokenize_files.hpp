// `memfit tokenize`: text files -> llm.c token files, streamed in bounded memory on all cores.
// Each input is mapped read-only and cut into chunks of about chunk_bytes at line starts
// (Tokenizer::is_line_start); a batch of chunks is encoded in parallel (OpenMP), written in
// order, and its pages are given back before the next batch, so memory stays about
// threads x 4 x chunk_bytes of text plus its tokens, whatever the input size.
// The last val_fraction of the input bytes (cut at a line start) goes to the validation file.
// Tokens are uint16 (llm.c GPT-2 files) when the vocabulary fits, else uint32 (llm.c Llama 3
// files); io/token_file reads both.
//
// Invariant: the train file followed by the validation file holds exactly the ids the
// tokenizer gives for each input as a whole (files are encoded one after the other, each as its
// own text), and a file is written atomically (path.tmp, then renamed) or not at all.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace memfit::text {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out;             // the training tokens
  double val_fraction = 0.1;   // 0: no validation file
  uint64_t chunk_bytes = uint64_t(1) << 20;
  uint64_t max_chunk_bytes = uint64_t(256) << 20;  // a chunk with no line start in this many bytes is refused
  std::ostream* progress = nullptr;  // a progress line, rewritten in place; nullptr: quiet
};

struct TokenizeResult {
  std::string train_path, val_path;  // val_path empty without a validation split
  int64_t train_tokens = 0, val_tokens = 0;
  uint64_t input_bytes = 0;
  int token_bytes = 2;  // 2: uint16 file, 4: uint32 file
};

// "dir/x_train.bin" -> "dir/x_val.bin"; "dir/x.bin" -> "dir/x_val.bin".
std::string validation_path(const std::string& out);

// Throws [text] naming the file for an unreadable input, a line longer than max_chunk_bytes,
// a tokenizer whose tokens span line starts, or more tokens than llm.c's int32 count holds.
TokenizeResult tokenize_files(const Tokenizer& tokenizer, const TokenizeOptions& options);

}  // namespace memfit::text
