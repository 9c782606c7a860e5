// The built-in default data: English-like text generated from a fixed seed, so the main job
// needs no download and every machine trains on the same bytes. A lexicon of pseudo-words
// is drawn from syllables, and sentences follow a word-level Markov chain with skewed
// successor probabilities: byte-level structure (spelling, spacing, punctuation) and
// word-level structure (likely successors) that a small model learns within a few hundred
// steps, so the loss visibly falls.
#pragma once

#include <cstdint>
#include <string>

namespace memfit {

std::string synthetic_corpus(uint64_t seed, size_t bytes);

}  // namespace memfit
