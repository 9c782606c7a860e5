// Dropout's keep mask as a pure function of (run seed, step, micro-step, site salt, element):
// no mask tensor is stored, the backward and a recomputed forward draw the same mask, and
// every backend (and thread count) draws the same one. SplitMix64's finaliser mixes the key;
// the top 24 bits give a uniform u in [0, 1), and an element is kept when u >= p, so
// P(keep) = 1 - p up to 2^-24, as torch.nn.functional.dropout's Bernoulli(1 - p).
#pragma once

#include <cstdint>

namespace memfit {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The per-call key of a dropout site: everything but the element index.
inline uint64_t dropout_key(uint64_t seed, int64_t step, int micro, uint64_t salt) {
  uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
  k = mix64(k ^ uint64_t(step));
  k = mix64(k ^ (uint64_t(uint32_t(micro)) << 32));
  return mix64(k ^ salt);
}

// p given as a threshold in 2^-24 units: keep when the draw is >= threshold.
inline uint32_t dropout_threshold(float p) { return uint32_t(double(p) * double(1u << 24) + 0.5); }

inline bool dropout_keeps(uint64_t key, int64_t index, uint32_t threshold) {
  return uint32_t(mix64(key + 0x9e3779b97f4a7c15ULL * uint64_t(index + 1)) >> 40) >= threshold;
}

// Where a tensor's elements sit in the one-rank, whole-batch tensor the mask is drawn over, so
// that data- and tensor-parallel ranks draw the one-rank run's mask on their part: element i
// of a [rows, cols] tensor is element (row_offset + i / cols) * global_cols + col_offset +
// i % cols there (a data rank's rows start at row_offset; a row-parallel input holds columns
// [col_offset, col_offset + cols) of global_cols). cols = 0: the tensor is the whole one.
struct DropoutLayout {
  int64_t cols = 0, global_cols = 0, col_offset = 0, row_offset = 0;
  int64_t index(int64_t i) const {
    return cols == 0 ? i : (row_offset + i / cols) * global_cols + col_offset + i % cols;
  }
};

// FNV-1a of a site's name: a salt that stays the same when the program is rebuilt.
inline uint64_t dropout_salt(const char* name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *name; ++name) h = (h ^ uint8_t(*name)) * 0x100000001b3ULL;
  return h;
}

}  // namespace memfit
