// What PyTorch's CUDA caching allocator reserves for an HF training run
// (torch.cuda.max_memory_reserved): the run's allocation sequence, generated for the plan's
// shapes, replayed through the allocator's model (fit/caching_allocator.hpp).
//
// The run is the one tools/record_cuda_allocator_traces.py records: the model copied to the GPU
// (each parameter and buffer in Module._apply's order), then two training steps (token ids,
// forward with labels, backward, AdamW(foreach=True).step(), zero_grad(set_to_none=True)). The
// forward's and backward's allocations come from fit/framework_pytorch_order.hpp; around them
// this adds what the CUDA run allocates beyond the recorded CPU run (tools/cuda_allocation_rules.py):
// each thread's cuBLAS workspace at its first product (the forward's, autograd's) and 1 MiB at
// its first cuBLASLt call, the staging buffer of a sum over rows that CUDA reduces across thread
// blocks (Reduce.cuh's configuration for 132 SMs of 2048 threads: H100 SXM, H200), softmax
// backward's second buffer, embedding backward's sort with more than 3072 indices; and the
// optimizer: AdamW's exp_avg and exp_avg_sq in step 1, the square roots of exp_avg_sq (one
// tensor a parameter, freed in reverse order) in each step, then the gradients, the loss and the
// ids freed. The second step's peak is the steady state's; the first's reserve stays.
#pragma once

#include <cstdint>
#include <vector>

#include "fit/framework_pytorch.hpp"
#include "graph/model_spec.hpp"

namespace memfit {

struct TorchReserve {
  uint64_t max_memory_reserved = 0;
  uint64_t max_memory_allocated = 0;  // the sequence's own: a cross-check of TorchPeak's closed form
  int64_t segments = 0;               // cudaMalloc calls
  int64_t allocations = 0;
};

// The run's requests in tests/fixtures/cuda_allocator's encoding: n > 0 allocates n bytes (the
// k-th positive entry is block k), n <= 0 frees block -n. Throws [framework] for what the
// order tables do not cover (a step not on CUDA, an untraced variant).
std::vector<int64_t> pytorch_cuda_allocation_events(const ModelSpec& spec, const TorchStep& step);

TorchReserve predict_pytorch_reserved(const ModelSpec& spec, const TorchStep& step);

}  // namespace memfit
