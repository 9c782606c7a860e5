// `memfit tokenize --tokenizer DIR|FILE --input FILE... --out tokens.bin [--val-fraction F]`:
// text -> llm.c token files with an HF tokenizer.json (text/tokenize_files.hpp does the work).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace memfit::cli {

class TokenizeCommand {
 public:
  explicit TokenizeCommand(CLI::App& app);  // adds the subcommand's options to app
  // Tokenizes, prints the progress line on stderr and a summary on out. Throws memfit::Error.
  int run(std::ostream& out) const;

 private:
  std::string tokenizer_;
  std::vector<std::string> inputs_;
  std::string out_;
  double val_fraction_ = 0.1;
  uint64_t chunk_bytes_ = uint64_t(1) << 20;
  bool quiet_ = false;
};

}  // namespace memfit::cli
