#include "train/synthetic_corpus.hpp"

#include <array>
#include <vector>

#include "train/rng.hpp"

namespace memfit {

std::string synthetic_corpus(uint64_t seed, size_t bytes) {
  Rng rng(seed);
  static constexpr std::array<const char*, 16> onsets = {"b", "c", "d", "f", "g", "h", "l", "m",
                                                         "n", "p", "r", "s", "t", "v", "th", "st"};
  static constexpr std::array<const char*, 7> vowels = {"a", "e", "i", "o", "u", "ea", "ou"};
  static constexpr std::array<const char*, 6> codas = {"", "", "n", "r", "s", "nd"};
  const int n_words = 320, n_next = 5;
  std::vector<std::string> words(n_words);
  for (std::string& w : words) {
    const int syllables = 1 + int(rng.below(3));
    for (int s = 0; s < syllables; ++s)
      w += std::string(onsets[rng.below(onsets.size())]) + vowels[rng.below(vowels.size())] +
           codas[rng.below(codas.size())];
  }
  // Each word has a few successors; the first is much likelier than the rest.
  std::vector<std::array<int, n_next>> next(n_words);
  for (auto& succ : next)
    for (int& s : succ) s = int(rng.below(n_words));
  static constexpr std::array<double, n_next> weights = {0.5, 0.2, 0.15, 0.1, 0.05};

  std::string text;
  text.reserve(bytes + 64);
  int word = int(rng.below(n_words));
  int sentences = 0;
  while (text.size() < bytes) {
    const int length = 5 + int(rng.below(9));
    for (int i = 0; i < length; ++i) {
      std::string w = words[size_t(word)];
      if (i == 0) w[0] = char(w[0] - 'a' + 'A');
      text += w;
      if (i + 1 < length) text += (rng.uniform() < 0.08 ? ", " : " ");
      double u = rng.uniform(), acc = 0;
      int pick = n_next - 1;
      for (int j = 0; j < n_next; ++j)
        if ((acc += weights[size_t(j)]) > u) {
          pick = j;
          break;
        }
      word = next[size_t(word)][size_t(pick)];
    }
    text += (++sentences % 4 == 0) ? ".\n" : ". ";
  }
  text.resize(bytes);
  return text;
}

}  // namespace memfit
