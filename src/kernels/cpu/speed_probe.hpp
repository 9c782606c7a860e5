// speed_probe: how fast this machine runs memfit's CPU kernels, measured in a fraction of a
// second, for the step-time model of the "cpu" hardware (`memfit plan --hardware cpu`, --fit).
//
// Why measure instead of a table: the cores memfit runs on differ from run to run (a
// Sapphire Rapids Xeon with AMX multiplies bf16 ~4.5x faster than fp32, a Zen 5 EPYC with
// AVX512-BF16 ~1.7x), and a step-time model that assumes the wrong one ranks configurations
// wrongly. The products timed are the ones a GPT-2 step is made of: a linear layer's forward
// ([1024, 768] x [3072, 768]^T, oneDNN) and backward-input ([1024, 3072] x [3072, 768],
// memfit's sgemm), each through the same MatmulKernel the executor runs.
//
// The probe allocates its operands (outside any step) and runs on the calling thread's
// OpenMP team, so the numbers are those of the thread count the run will use.
#pragma once

namespace memfit {

struct CpuSpeed {
  double fp32_gemm_flops = 0;    // FLOP/s of fp32 products, the slower of the two shapes
  double bf16_gemm_flops = 0;    // FLOP/s of bf16 products (fp32 accumulation), the forward
                                 // shape; 0 when oneDNN has no bf16 product for this CPU
  double stream_bytes_per_s = 0; // bytes read + written per second by a streaming update
};

// Best of a few runs of each kernel after one warm-up run; about 0.1-0.3 s on 2 cores.
CpuSpeed probe_cpu_speed();

}  // namespace memfit
