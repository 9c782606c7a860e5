// `train --data file.txt --tokenizer DIR`: the text is tokenised once, into a token file next to
// it whose name carries a hash of the tokenizer and of the text's size and time, so a changed
// tokenizer or text gets a new cache and an unchanged one is reused. Written atomically (by
// text/tokenize_files), so a stopped run never leaves half a cache behind.
#pragma once

#include <ostream>
#include <string>

namespace memfit {

// The cache's path for `data` under `tokenizer` (a tokenizer.json or a directory holding one),
// tokenising into it first when it does not exist yet. Throws [text] / [data] naming the file;
// with several ranks a missing cache is refused (one rank must write it: run memfit tokenize).
std::string tokenized_data(const std::string& data, const std::string& tokenizer, int ranks, std::ostream& log);

}  // namespace memfit
