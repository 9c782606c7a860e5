// The qwZ wire codec (comm_codec.hpp) and the CPU backend's comm_quantize / comm_dequantize ops.
#include "kernels/cpu/comm_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit::cpu {

namespace {

// Blocks per thread below which forking costs more than it saves (a block is 256 elements).
constexpr int64_t kBlockGrain = 64;

}  // namespace

template <class T>
void comm_quantize_int8(const T* x, int64_t n, int64_t block, ValidRanges valid, uint8_t* wire) {
  MEMFIT_CHECK(block > 0 && n % block == 0, "kernels", "int8 wire of {} elements in blocks of {}", n, block);
  auto* codes = reinterpret_cast<int8_t*>(wire);
  float* scales = reinterpret_cast<float*>(wire + n);
  parallel_for(n / block, kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * block, hi = lo + block;
      float absmax = 0;
      bool finite = true;
      for_valid(valid, lo, hi, [&](int64_t a, int64_t e) {
        for (int64_t i = a; i < e; ++i) {
          const float v = widen(x[i]);
          finite &= std::isfinite(v);
          absmax = std::max(absmax, std::fabs(v));
        }
      });
      std::memset(codes + lo, 0, size_t(block));
      if (!finite) {
        scales[b] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      scales[b] = absmax / 127.0f;
      if (absmax == 0) continue;
      const float inv = 127.0f / absmax;
      for_valid(valid, lo, hi, [&](int64_t a, int64_t e) {
        for (int64_t i = a; i < e; ++i)
          codes[i] = int8_t(std::clamp(std::nearbyint(widen(x[i]) * inv), -127.0f, 127.0f));
      });
    }
  });
}

template <class T>
void comm_dequantize_int8(const uint8_t* wire, int64_t n, int64_t block, int ranks, T* out) {
  MEMFIT_CHECK(ranks > 0 && n % (int64_t(ranks) * block) == 0, "kernels",
               "int8 wire of {} elements from {} ranks in blocks of {}", n, ranks, block);
  const int64_t per_rank = n / ranks, blocks_per_rank = per_rank / block;
  const int64_t wire_per_rank = int64_t(comm_wire_bytes(per_rank, block));
  parallel_for(n / block, kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r = b / blocks_per_rank, local = b % blocks_per_rank;
      const uint8_t* w = wire + r * wire_per_rank;
      const auto* codes = reinterpret_cast<const int8_t*>(w) + local * block;
      float scale;
      std::memcpy(&scale, w + per_rank + local * int64_t(sizeof(float)), sizeof(float));
      T* y = out + b * block;
      for (int64_t i = 0; i < block; ++i) y[i] = narrow<T>(float(codes[i]) * scale);
    }
  });
}

#define MEMFIT_COMM_CODEC(T)                                                                         \
  template void comm_quantize_int8<T>(const T*, int64_t, int64_t, ValidRanges, uint8_t*);            \
  template void comm_dequantize_int8<T>(const uint8_t*, int64_t, int64_t, int, T*);
MEMFIT_COMM_CODEC(float)
MEMFIT_COMM_CODEC(bf16_t)
MEMFIT_COMM_CODEC(fp16_t)
#undef MEMFIT_COMM_CODEC

std::unique_ptr<PreparedOp> prepare_comm_codec(const Program& p, const Op& op, const OpBinding& b) {
  const CommQuantAttrs a = attrs_of<CommQuantAttrs>(op);
  std::unique_ptr<PreparedOp> out;
  if (op.kind == OpKind::comm_quantize) {
    const TensorDesc& x = p.tensor(op.inputs[0]);
    dispatch_t(op, x.dtype, [&](auto tt) {
      using T = decltype(tt);
      out = make_op([x = in_t<T>(b, 0), n = x.numel(), a, wire = out_t<uint8_t>(b, 0)](const StepContext&) {
        comm_quantize_int8<T>(x, n, a.block, a.valid, wire);
      });
    });
  } else {
    const TensorDesc& y = p.tensor(op.outputs[0]);
    dispatch_t(op, y.dtype, [&](auto tt) {
      using T = decltype(tt);
      out = make_op([wire = in_t<uint8_t>(b, 0), n = y.numel(), a, y = out_t<T>(b, 0)](const StepContext&) {
        comm_dequantize_int8<T>(wire, n, a.block, a.ranks, y);
      });
    });
  }
  return out;
}

}  // namespace memfit::cpu
