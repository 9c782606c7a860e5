// qgZ's gradient wire (grad_codec.hpp) and the CPU backend's grad_quantize / grad_dequantize_sum.
#include "kernels/cpu/grad_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/comm_codec.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit::cpu {

namespace {

constexpr int64_t kBlockGrain = 64;  // blocks per thread below which forking costs more than it saves

using Valid = ValidRanges;

// for_valid, where no ranges at all means every element is valid (the second hop's fp32
// partial has no padding).
template <class Fn>
void for_valid_or_all(Valid valid, int64_t lo, int64_t hi, Fn&& fn) {
  if (valid.empty()) return fn(lo, hi);
  for_valid(valid, lo, hi, fn);
}

// Calls fn(i, s, count) for each run of part d's elements [lo, hi) that is contiguous in x:
// part elements i.. map to x elements s.. (chunk k of the part is chunk k * parts + d of x).
template <class Fn>
void for_runs(const GradWire& w, int d, int64_t lo, int64_t hi, Fn&& fn) {
  for (int64_t i = lo; i < hi;) {
    const int64_t k = i / w.chunk, in_chunk = i % w.chunk;
    const int64_t count = std::min(hi - i, w.chunk - in_chunk);
    fn(i, (k * w.parts + d) * w.chunk + in_chunk, count);
    i += count;
  }
}

int code_range(int bits) { return bits == 4 ? 7 : 127; }

void check_wire(int64_t n, int64_t block, int bits) {
  MEMFIT_CHECK(block > 0 && (bits == 8 || (bits == 4 && block % 2 == 0)) && n >= 0, "kernels",
               "qgZ wire of {} elements in blocks of {} at {} bits", n, block, bits);
}

}  // namespace

template <class T>
void grad_quantize(const T* x, const GradWire& w, Valid valid, uint8_t* wire) {
  check_wire(w.n, w.block, w.bits);
  MEMFIT_CHECK(w.parts > 0 && w.chunk > 0 && w.n % (int64_t(w.parts) * w.chunk) == 0, "kernels",
               "qgZ wire: {} elements are not {} parts of whole {}-element chunks", w.n, w.parts, w.chunk);
  const int64_t m = w.part_elements(), blocks = (m + w.block - 1) / w.block;
  const uint64_t part_bytes = qgz_wire_bytes(m, w.block, w.bits);
  const uint64_t code_bytes = part_bytes - 4 * uint64_t(blocks);
  const float q = float(code_range(w.bits));
  parallel_for(int64_t(w.parts) * blocks, kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t g = b0; g < b1; ++g) {
      const int d = int(g / blocks);
      const int64_t b = g % blocks, lo = b * w.block, hi = std::min(m, lo + w.block);
      uint8_t* part = wire + uint64_t(d) * part_bytes;
      float absmax = 0;
      bool finite = true;
      for_runs(w, d, lo, hi, [&](int64_t, int64_t s, int64_t count) {
        for_valid_or_all(valid, s, s + count, [&](int64_t a, int64_t e) {
          for (int64_t j = a; j < e; ++j) {
            const float v = widen(x[j]);
            finite &= std::isfinite(v);
            absmax = std::max(absmax, std::fabs(v));
          }
        });
      });
      const float scale = finite ? absmax / q : std::numeric_limits<float>::quiet_NaN();
      std::memcpy(part + code_bytes + uint64_t(b) * 4, &scale, sizeof(float));
      // Codes start at 0 (int8) or 8 (int4's zero); valid elements of a finite block overwrite.
      if (w.bits == 8) std::memset(part + lo, 0, size_t(hi - lo));
      else std::memset(part + lo / 2, 0x88, size_t((hi - lo + 1) / 2));
      if (!finite || absmax == 0) continue;
      const float inv = q / absmax;
      for_runs(w, d, lo, hi, [&](int64_t i0, int64_t s, int64_t count) {
        for_valid_or_all(valid, s, s + count, [&](int64_t a, int64_t e) {
          for (int64_t j = a; j < e; ++j) {
            const int c = int(std::clamp(std::nearbyint(widen(x[j]) * inv), -q, q));
            const int64_t i = i0 + (j - s);
            if (w.bits == 8) {
              part[i] = uint8_t(int8_t(c));
            } else {
              uint8_t& byte = part[i / 2];
              byte = i % 2 == 0 ? uint8_t((byte & 0xF0) | uint8_t(c + 8)) : uint8_t((byte & 0x0F) | uint8_t((c + 8) << 4));
            }
          }
        });
      });
    }
  });
}

template <class T>
void grad_dequantize_sum(const uint8_t* wire, int64_t n, int ranks, int64_t block, int bits, T* out) {
  check_wire(n, block, bits);
  MEMFIT_CHECK(ranks > 0, "kernels", "qgZ sum of {} parts", ranks);
  const int64_t blocks = (n + block - 1) / block;
  const uint64_t part_bytes = qgz_wire_bytes(n, block, bits);
  const uint64_t code_bytes = part_bytes - 4 * uint64_t(blocks);
  parallel_for(blocks, kBlockGrain, [&](int64_t b0, int64_t b1) {
    float sum[512];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * block, hi = std::min(n, lo + block);
      for (int64_t i0 = lo; i0 < hi; i0 += 512) {  // in pieces of the stack buffer
        const int64_t i1 = std::min(hi, i0 + 512);
        std::fill(sum, sum + (i1 - i0), 0.0f);
        for (int r = 0; r < ranks; ++r) {
          const uint8_t* part = wire + uint64_t(r) * part_bytes;
          float scale;
          std::memcpy(&scale, part + code_bytes + uint64_t(b) * 4, sizeof(float));
          for (int64_t i = i0; i < i1; ++i) {
            const int c = bits == 8 ? int(int8_t(part[i])) : int((part[i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xF) - 8;
            const float v = float(c) * scale;
            sum[i - i0] += v;
          }
        }
        for (int64_t i = i0; i < i1; ++i) out[i] = narrow<T>(sum[i - i0]);
      }
    }
  });
}

#define MEMFIT_GRAD_CODEC(T)                                                         \
  template void grad_quantize<T>(const T*, const GradWire&, Valid, uint8_t*);        \
  template void grad_dequantize_sum<T>(const uint8_t*, int64_t, int, int64_t, int, T*);
MEMFIT_GRAD_CODEC(float)
MEMFIT_GRAD_CODEC(bf16_t)
MEMFIT_GRAD_CODEC(fp16_t)
#undef MEMFIT_GRAD_CODEC

std::unique_ptr<PreparedOp> prepare_grad_codec(const Program& p, const Op& op, const OpBinding& b) {
  const CommQuantAttrs a = attrs_of<CommQuantAttrs>(op);
  std::unique_ptr<PreparedOp> out;
  if (op.kind == OpKind::grad_quantize) {
    const TensorDesc& x = p.tensor(op.inputs[0]);
    const GradWire w{x.numel(), a.ranks, a.chunk, a.block, a.bits};
    dispatch_t(op, x.dtype, [&](auto tt) {
      using T = decltype(tt);
      out = make_op([x = in_t<T>(b, 0), w, a, wire = out_t<uint8_t>(b, 0)](const StepContext&) {
        grad_quantize<T>(x, w, a.valid, wire);
      });
    });
  } else {
    const TensorDesc& y = p.tensor(op.outputs[0]);
    dispatch_t(op, y.dtype, [&](auto tt) {
      using T = decltype(tt);
      out = make_op([wire = in_t<uint8_t>(b, 0), n = y.numel(), a, y = out_t<T>(b, 0)](const StepContext&) {
        grad_dequantize_sum<T>(wire, n, a.ranks, a.block, a.bits, y);
      });
    });
  }
  return out;
}

}  // namespace memfit::cpu
