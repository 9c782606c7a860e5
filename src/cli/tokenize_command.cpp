#include "cli/tokenize_command.hpp"

#include <iostream>

#include <fmt/format.h>

#include "text/tokenize_files.hpp"
#include "text/tokenizer.hpp"

namespace memfit::cli {

TokenizeCommand::TokenizeCommand(CLI::App& app) {
  app.add_option("--tokenizer", tokenizer_, "an HF tokenizer.json, or a directory holding one")->required();
  app.add_option("--input", inputs_, "text files, each tokenized as one text, in this order")->required();
  app.add_option("--out", out_, "the llm.c token file to write (uint16 tokens, or uint32 for vocabularies over 65536)")
      ->required();
  app.add_option("--val-fraction", val_fraction_,
                 "the last fraction of the input bytes, cut at a line start, goes to OUT's _val file (default 0.1; "
                 "0: none)");
  app.add_option("--chunk-bytes", chunk_bytes_, "bytes of text one thread encodes at a time (default 1 MiB)");
  app.add_flag("--quiet", quiet_, "no progress line on stderr");
}

int TokenizeCommand::run(std::ostream& out) const {
  const text::Tokenizer tokenizer = text::Tokenizer::load(tokenizer_);
  text::TokenizeOptions options;
  options.inputs = inputs_;
  options.out = out_;
  options.val_fraction = val_fraction_;
  options.chunk_bytes = chunk_bytes_;
  options.progress = quiet_ ? nullptr : &std::cerr;
  const text::TokenizeResult r = text::tokenize_files(tokenizer, options);
  out << fmt::format("tokenize: {} bytes -> {} tokens ({}-bit, vocabulary {}) in {}", r.input_bytes,
                     r.train_tokens + r.val_tokens, 8 * r.token_bytes, tokenizer.vocab_size(), r.train_path);
  if (!r.val_path.empty()) out << fmt::format(", {} of them in {}", r.val_tokens, r.val_path);
  out << "\n";
  return 0;
}

}  // namespace memfit::cli
