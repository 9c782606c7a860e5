// Blockwise quantisation codecs, bit for bit bitsandbytes' (see blockwise.hpp for the rules).
// Every rounding step is the one bnb's code makes, in the same order: a reciprocal multiply
// in full 4-bit blocks and a division in the partial last one, fp32 midpoints, fp32 distances.
#include "kernels/quant/blockwise.hpp"

#if defined(__AVX512BW__)
#include "kernels/cpu/avx512_quiet.hpp"
#include <immintrin.h>
#endif
#include <cstring>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

constexpr float kMinAbsmax = 1e-38f;  // bnb clamps the 4-bit absmax to this before dividing

// A 4-bit table sorted ascending, as bnb's torch code quantises: `order` maps a position in
// the sorted table back to the code, `midpoints` are (sorted[i] + sorted[i+1]) / 2 in fp32.
struct SortedTable {
  std::array<uint8_t, 16> order{};
  std::array<float, 15> midpoints{};
  uint8_t encode(float s) const {  // number of midpoints strictly below s
    int position = 0;
    for (float m : midpoints) position += int(m < s);
    return order[size_t(position)];
  }
};

SortedTable make_sorted_table(QuantKind kind) {
  // torch.argsort of bnb's fp4 values on this build (it puts +0 before -0); nf4 is sorted.
  static constexpr std::array<uint8_t, 16> kFp4Order = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
  const auto& values = code_values(kind);
  SortedTable t;
  for (int i = 0; i < 16; ++i) t.order[size_t(i)] = kind == QuantKind::nf4 ? uint8_t(i) : kFp4Order[size_t(i)];
  for (int i = 0; i < 15; ++i)
    t.midpoints[size_t(i)] = (values[t.order[size_t(i)]] + values[t.order[size_t(i + 1)]]) / 2.0f;
  return t;
}

const SortedTable& sorted_table(QuantKind kind) {
  static const SortedTable nf4 = make_sorted_table(QuantKind::nf4), fp4 = make_sorted_table(QuantKind::fp4);
  return kind == QuantKind::nf4 ? nf4 : fp4;
}

template <class T>
T store_as(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_to_bf16(v);
  }
}

void check_sizes(uint64_t got, uint64_t want, const char* what) {
  MEMFIT_CHECK(got == want, "kernels", "quantisation: {} has {} elements, expected {}", what, got, want);
}

// bnb 0.50's CPU 8-bit quantiser does not search the map: it rounds the normalised value to
// one of 65536 points of [-1, 1] and looks the code up in a table built once per map (the
// entry whose midpoints bracket the point). This is that table for bnb's dynamic map.
constexpr int kLutSize = 65536;

const std::array<uint8_t, kLutSize>& dynamic_map_lut() {
  static const std::array<uint8_t, kLutSize> lut = [] {
    const QuantMap& map = bnb_dynamic_map_signed();
    std::array<float, kQuantMapSize - 1> midpoints{};
    for (int i = 0; i + 1 < kQuantMapSize; ++i) midpoints[size_t(i)] = 0.5f * (map[size_t(i)] + map[size_t(i + 1)]);
    std::array<uint8_t, kLutSize> table{};
    int code = 0;
    for (int i = 0; i < kLutSize; ++i) {
      const float point = -1.0f + (2.0f * float(i)) / float(kLutSize - 1);
      while (code < kQuantMapSize - 1 && midpoints[size_t(code)] < point) ++code;
      table[size_t(i)] = uint8_t(code);
    }
    return table;
  }();
  return lut;
}

uint8_t dynamic_code(float normalised) {
  const float x = std::clamp(normalised, -1.0f, 1.0f);
  const float point = (x + 1.0f) * 0.5f * float(kLutSize - 1) + 0.5f;  // truncated below
  return dynamic_map_lut()[size_t(uint16_t(point))];
}

// torch's fp32 sum (aten/src/ATen/native/cpu/SumKernel.cpp): rows of L lanes are summed by
// four interleaved accumulators, each a cascade of 4 levels that flushes every 2^power rows.
template <int L>
struct Lanes {
  std::array<float, L> v{};
  void add(const float* p) {
    for (int l = 0; l < L; ++l) v[size_t(l)] += p[l];
  }
  void add(const Lanes& o) { add(o.v.data()); }
};

int ceil_log2(int64_t x) { return x <= 2 ? 1 : int(std::bit_width(uint64_t(x - 1))); }

template <int L>
std::array<Lanes<L>, 4> multi_row_sum(const float* data, int64_t size) {
  constexpr int kLevels = 4, kRows = 4;
  const int level_power = std::max(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power, level_mask = level_step - 1;
  std::array<std::array<Lanes<L>, kRows>, kLevels> acc{};
  auto load = [&](int64_t i, int k) { return data + (i * kRows + k) * L; };
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < kRows; ++k) acc[0][size_t(k)].add(load(i, k));
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kRows; ++k) {
        acc[size_t(j)][size_t(k)].add(acc[size_t(j - 1)][size_t(k)]);
        acc[size_t(j - 1)][size_t(k)] = Lanes<L>{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < kRows; ++k) acc[0][size_t(k)].add(load(i, k));
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kRows; ++k) acc[0][size_t(k)].add(acc[size_t(j)][size_t(k)]);
  return acc[0];
}

template <int L>
Lanes<L> row_sum(const float* data, int64_t rows) {
  const int64_t size_ilp = rows / 4;
  auto partial = multi_row_sum<L>(data, size_ilp);
  for (int64_t i = size_ilp * 4; i < rows; ++i) partial[0].add(data + i * L);
  for (int k = 1; k < 4; ++k) partial[0].add(partial[size_t(k)]);
  return partial[0];
}

float torch_float_sum(std::span<const float> x) {
  constexpr int kVector = 8;  // floats per Vectorized<float> in torch's reduction kernels here
  const int64_t n = int64_t(x.size());
  if (n < kVector) return row_sum<1>(x.data(), n).v[0];
  const int64_t vectors = n / kVector;
  const Lanes<kVector> lanes = row_sum<kVector>(x.data(), vectors);
  float acc = 0.0f;
  for (int64_t k = vectors * kVector; k < n; ++k) acc += x[size_t(k)];
  for (float lane : lanes.v) acc += lane;
  return acc;
}

}  // namespace

float torch_float_mean(std::span<const float> values, int torch_threads) {
  MEMFIT_CHECK(!values.empty(), "kernels", "the mean of no absmax values");
  MEMFIT_CHECK(torch_threads >= 1, "kernels", "torch's sum on {} threads", torch_threads);
  // at::parallel_reduce: below GRAIN_SIZE one serial sum; above, min(threads, ceil(n / grain))
  // chunks of ceil(n / chunks) values, each summed as above into its thread's slot (0 + sum),
  // then the slots (one per thread, unused ones 0) summed the same way.
  constexpr int64_t kTorchGrain = 32768;
  const int64_t n = int64_t(values.size());
  if (n < kTorchGrain || torch_threads == 1) return torch_float_sum(values) / float(n);
  const int64_t chunks = std::min<int64_t>(torch_threads, (n + kTorchGrain - 1) / kTorchGrain);
  const int64_t chunk = (n + chunks - 1) / chunks;
  constexpr int kMaxThreads = 1024;
  MEMFIT_CHECK(torch_threads <= kMaxThreads, "kernels", "torch's sum on {} threads (at most {})", torch_threads,
               kMaxThreads);
  std::array<float, kMaxThreads> slots{};
  for (int64_t c = 0; c * chunk < n; ++c)
    slots[size_t(c)] = 0.0f + torch_float_sum(values.subspan(size_t(c * chunk), size_t(std::min(chunk, n - c * chunk))));
  return torch_float_sum(std::span<const float>(slots.data(), size_t(torch_threads))) / float(n);
}

template <class T>
void quantize_4bit(std::span<const T> in, const QuantSpec& spec, std::span<uint8_t> codes, std::span<float> absmax) {
  check_quant_spec(spec);
  MEMFIT_CHECK(spec.kind != QuantKind::int8, "kernels", "quantize_4bit takes nf4 or fp4, not int8");
  const int64_t n = int64_t(in.size()), block = spec.block;
  check_sizes(codes.size(), uint64_t(n + 1) / 2, "the 4-bit code array");
  check_sizes(absmax.size(), uint64_t(quant_blocks(n, block)), "the absmax array");
  const SortedTable& table = sorted_table(spec.kind);
  std::fill(codes.begin(), codes.end(), uint8_t(0));
  // Blocks are independent and start on even elements (the block is even), so threads that
  // take whole blocks never share a code byte.
  parallel_for(quant_blocks(n, block), std::max<int64_t>(1, kParallelGrain / block), [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t begin = b * block, end = std::min(n, begin + block);
      float am = 0.0f;
      for (int64_t i = begin; i < end; ++i) am = std::max(am, std::fabs(widen(in[size_t(i)])));
      const bool partial = end - begin < block;
      const float clamped = std::max(am, kMinAbsmax), reciprocal = 1.0f / clamped;
      absmax[size_t(b)] = partial ? clamped : am;  // bnb stores the clamped value of a partial block
      for (int64_t i = begin; i < end; ++i) {
        const float x = widen(in[size_t(i)]);
        const float s = std::clamp(partial ? x / clamped : x * reciprocal, -1.0f, 1.0f);
        codes[size_t(i / 2)] |= uint8_t(table.encode(s) << (i % 2 == 0 ? 4 : 0));
      }
    }
  });
  if (n % 2 == 1) codes[size_t(n / 2)] |= table.encode(0.0f);
}

void quantize_dynamic_blockwise(std::span<const float> values, float offset, int64_t block, std::span<uint8_t> codes,
                                std::span<float> absmax) {
  MEMFIT_CHECK(block >= 1, "kernels", "dynamic blockwise quantisation with block {}", block);
  const int64_t n = int64_t(values.size());
  check_sizes(codes.size(), values.size(), "the 8-bit code array");
  check_sizes(absmax.size(), uint64_t(quant_blocks(n, block)), "the 8-bit absmax array");
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float am = 0.0f;
    for (int64_t i = begin; i < end; ++i) am = std::max(am, std::fabs(values[size_t(i)] - offset));
    absmax[size_t(b)] = am;
    const float reciprocal = 1.0f / am;
    for (int64_t i = begin; i < end; ++i)
      codes[size_t(i)] = am == 0.0f ? uint8_t(0) : dynamic_code((values[size_t(i)] - offset) * reciprocal);
  }
}

float double_quantize_absmax(std::span<const float> absmax, std::span<uint8_t> codes, std::span<float> absmax2,
                             int torch_threads) {
  const float offset = torch_float_mean(absmax, torch_threads);
  quantize_dynamic_blockwise(absmax, offset, kDoubleQuantBlock, codes, absmax2);
  return offset;
}

template <class T>
void quantize_int8(std::span<const T> in, const QuantSpec& spec, std::span<uint8_t> codes, std::span<float> absmax) {
  check_quant_spec(spec);
  MEMFIT_CHECK(spec.kind == QuantKind::int8, "kernels", "quantize_int8 takes the int8 kind, not {}",
               quant_kind_name(spec.kind));
  const int64_t n = int64_t(in.size()), block = spec.block;
  check_sizes(codes.size(), uint64_t(n), "the int8 code array");
  check_sizes(absmax.size(), uint64_t(quant_blocks(n, block)), "the absmax array");
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float am = 0.0f;
    for (int64_t i = begin; i < end; ++i) am = std::max(am, std::fabs(widen(in[size_t(i)])));
    absmax[size_t(b)] = am;
    // torch's 127.0 / t is reciprocal(t) * 127.
    const float scale = am > 0.0f ? (1.0f / am) * 127.0f : 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float q = std::nearbyint(widen(in[size_t(i)]) * scale);  // default rounding: to even
      codes[size_t(i)] = std::bit_cast<uint8_t>(int8_t(std::clamp(q, -127.0f, 127.0f)));
    }
  }
}

#if defined(__AVX512BW__)
// The lookup of a block's 16 scaled bf16 levels (the low 16 words of `table`) for 32 elements
// at a time (one vpermw): the same values as the scalar loop below, which finishes what is
// left. i is even.
static int64_t lookup_bf16_x32(__m512i table, const uint8_t* codes, int64_t i, int64_t stop, bf16_t* out) {
  const __m512i low_nibble = _mm512_set1_epi32(0x0f);
  for (; i + 32 <= stop; i += 32) {
    // 16 code bytes, one per 32-bit lane: the high nibble (the even element) in the lane's
    // low half, the low nibble in its high half, i.e. the 32 indices in element order.
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const __m512i idx = _mm512_or_si512(_mm512_srli_epi32(v, 4), _mm512_slli_epi32(_mm512_and_si512(v, low_nibble), 16));
    _mm512_storeu_si512(out + i, _mm512_permutexvar_epi16(idx, table));
  }
  return i;
}

static __m512i table_of(const std::array<bf16_t, 16>& scaled) {
  return _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scaled.data())));
}
#endif

#if defined(__AVX512BF16__)
// A block's 16 levels times its absmax, narrowed as narrow<bf16_t> narrows (vcvtneps2bf16:
// to nearest even, subnormals to signed zero, which is what bnb's AVX-512 kernel does), in
// three instructions instead of sixteen scalar products and roundings: the per-block setup was
// most of a 64-element block's cost.
static void scale_levels_bf16(__m512 levels, float absmax, std::array<bf16_t, 16>& scaled) {
  const __m256bh narrowed = _mm512_cvtneps_pbh(_mm512_mul_ps(levels, _mm512_set1_ps(absmax)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(scaled.data()), reinterpret_cast<const __m256i&>(narrowed));
}
#endif

template <class T>
void dequantize_range(const QuantizedWeight& w, int64_t begin, int64_t end, std::span<T> out) {
  check_quantized_weight(w);
  MEMFIT_CHECK(0 <= begin && begin <= end && end <= w.numel(), "kernels",
               "dequantise elements [{}, {}) of a weight of {}", begin, end, w.numel());
  check_sizes(out.size(), uint64_t(end - begin), "the dequantisation output");
  const int64_t block = w.spec.block;
  if (w.spec.kind == QuantKind::int8) {
    constexpr float kInverse127 = 7.874015718698502e-3f;  // bnb multiplies by this, not / 127
    for (int64_t i = begin; i < end;) {
      const int64_t b = i / block, stop = std::min(end, (b + 1) * block);
      const float am = w.block_absmax(b);
      for (; i < stop; ++i)
        out[size_t(i - begin)] = store_as<T>(float(std::bit_cast<int8_t>(w.codes[size_t(i)])) * am * kInverse127);
    }
    return;
  }
  // bnb 0.50 (x86 with AVX-512) dequantises in one of three ways, and they differ in two bits:
  // torch (an odd last dimension, or blocks of 2048 or more) and its AVX-512 kernel (a last
  // dimension that is a multiple of 16) decode fp4 code 8 as +0 where its scalar kernel has -0;
  // the AVX-512 kernel narrows to bf16 flushing subnormals, the others keep them.
  const bool torch_path = w.cols % 2 == 1 || block >= 2048;
  const bool avx512_path = !torch_path && w.cols % 16 == 0;
  std::array<float, 16> values = code_values(w.spec.kind);
  if (w.spec.kind == QuantKind::fp4 && (torch_path || avx512_path)) values[8] = 0.0f;
  // Per block, the 16 levels times its absmax, rounded once (the same value and rounding as
  // level * absmax element by element); then one byte gives two outputs by lookup.
  std::array<T, 16> scaled{};
  const uint8_t* codes = w.codes.data();
  T* dst = out.data();  // dst[i - begin] is element i
#if defined(__AVX512BF16__)
  const __m512 levels = _mm512_loadu_ps(values.data());
#endif
  for (int64_t i = begin; i < end;) {
    const int64_t b = i / block, stop = std::min(end, (b + 1) * block);
    const float am = w.block_absmax(b);
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (avx512_path) scale_levels_bf16(levels, am, scaled);
    }
    const bool scaled_already = std::is_same_v<T, bf16_t> && avx512_path;
#else
    const bool scaled_already = false;
#endif
    if (!scaled_already)
      for (int c = 0; c < 16; ++c) {
        const float v = values[size_t(c)] * am;
        if constexpr (std::is_same_v<T, bf16_t>) {
          scaled[size_t(c)] = avx512_path ? narrow<bf16_t>(v) : round_to_bf16(v);
        } else {
          scaled[size_t(c)] = v;
        }
      }
    if (i % 2 == 1) {  // a low nibble first
      dst[i - begin] = scaled[codes[i / 2] & 0x0f];
      ++i;
    }
#if defined(__AVX512BW__)
    if constexpr (std::is_same_v<T, bf16_t>) i = lookup_bf16_x32(table_of(scaled), codes, i, stop, dst - begin);
#endif
    for (; i + 1 < stop; i += 2) {
      const uint8_t byte = codes[i / 2];
      dst[i - begin] = scaled[byte >> 4];
      dst[i + 1 - begin] = scaled[byte & 0x0f];
    }
    if (i < stop) {  // a high nibble last
      dst[i - begin] = scaled[codes[i / 2] >> 4];
      ++i;
    }
  }
}

void dequantize_as_weight(const QuantizedWeight& w, int64_t begin, int64_t end, DType weights,
                          std::span<bf16_t> scratch, std::span<float> out) {
  check_sizes(out.size(), uint64_t(end - begin), "the dequantisation output");
  if (weights != DType::bf16) {
    dequantize_range<float>(w, begin, end, out);
    return round_to_weight_dtype(weights, out);
  }
  const std::span<bf16_t> narrowed = scratch.first(out.size());
  dequantize_range<bf16_t>(w, begin, end, narrowed);
  for (size_t i = 0; i < out.size(); ++i) out[i] = widen(narrowed[i]);
}

template void quantize_4bit<float>(std::span<const float>, const QuantSpec&, std::span<uint8_t>, std::span<float>);
template void quantize_4bit<bf16_t>(std::span<const bf16_t>, const QuantSpec&, std::span<uint8_t>, std::span<float>);
template void quantize_int8<float>(std::span<const float>, const QuantSpec&, std::span<uint8_t>, std::span<float>);
template void quantize_int8<bf16_t>(std::span<const bf16_t>, const QuantSpec&, std::span<uint8_t>, std::span<float>);
template void dequantize_range<float>(const QuantizedWeight&, int64_t, int64_t, std::span<float>);
template void dequantize_range<bf16_t>(const QuantizedWeight&, int64_t, int64_t, std::span<bf16_t>);

}  // namespace memfit
