// What the same training step costs in HF transformers + PyTorch (`memfit plan --framework
// pytorch`): the peak of live tensor bytes of one steady-state step (forward with labels ->
// loss.backward() -> AdamW(foreach=True).step() -> zero_grad(set_to_none=True)), as torch's CPU
// allocator sees it, for the HF model memfit's spec describes.
//
// memfit plans its own program; a user who takes a plan to PyTorch gets a different peak: HF
// materialises the full logits and the loss's log-softmax, autograd keeps every saved tensor
// (dropout masks, GELU-tanh pieces, q/k/v copies) until its backward, autocast keeps bf16 copies
// of the weights, and checkpointing recomputes a block inside the backward.
//
// The prediction is the largest of a few closed-form expressions in the shapes (B, T, C, heads,
// MLP width, vocabulary, layers): the live bytes at the allocations that can be the step's peak
// (framework_pytorch_table.hpp), plus AdamW's peak. They are derived from the allocation sequence
// of HF's modeling code under torch's profiler (tools/derive_pytorch_memory_model.py) and checked
// against measured steps (tests/fixtures/pytorch_memory, tools/make_pytorch_memory_fixtures.py).
// On a GPU preset the prediction is torch.cuda.max_memory_allocated (TorchStep::cuda), checked
// against the CUDA runs of tests/fixtures/cuda_allocator, and torch.cuda.max_memory_reserved:
// the run's allocation order (fit/pytorch_allocation_order.hpp) replayed through the caching
// allocator's model (fit/caching_allocator.hpp).
// Coverage: GPT-2 (HF defaults: dropout 0.1, gelu_new) and Llama (no dropout, SiLU, RoPE, GQA,
// tied or untied embeddings), attention eager or sdpa, fp32 or bf16 autocast, gradient
// checkpointing or not, the torch and transformers versions the fixtures name.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"

namespace memfit {

enum class TorchAttention : uint8_t { eager, sdpa };
TorchAttention parse_torch_attention(std::string_view s);  // throws [framework]
std::string_view torch_attention_name(TorchAttention a);

struct TorchStep {
  int64_t batch = 1, seq = 1;
  TorchAttention attention = TorchAttention::sdpa;  // transformers' default
  bool checkpointing = false;  // model.gradient_checkpointing_enable(use_reentrant=False)
  bool autocast_bf16 = false;  // forward and loss under torch.autocast('cpu', bfloat16)
  // On a CUDA GPU (the hardware presets), what torch.cuda.max_memory_allocated counts: the same
  // tensors but for CUDA's kernels (sdpa's fused kernels keep no T x T tensor, where the CPU's
  // keep the probabilities), and one cuBLAS workspace per thread that runs products, taken
  // through the caching allocator and kept: the forward's and autograd's, of this many bytes.
  bool cuda = false;
  uint64_t cublas_workspace_bytes = 0;
  // An H100 or H200 (compute capability 9.0, 132 SMs): the device the allocation order's CUDA
  // rules were found on (cuDNN's attention for bf16, the reductions' configuration), so the one
  // max_memory_reserved is predicted for (fit/pytorch_allocation_order.hpp).
  bool hopper = false;
};

// Bytes live at the predicted peak, by what holds them.
struct TorchPeak {
  uint64_t parameters = 0;       // fp32 weights (and Llama's rotary buffers)
  uint64_t optimizer_state = 0;  // AdamW's exp_avg, exp_avg_sq and step tensors
  uint64_t inputs = 0;           // the token ids (also the labels)
  uint64_t gradients = 0;        // parameter-shaped tensors: gradients, autocast's bf16 weight copies
  uint64_t saved_activations = 0;  // what the forward left for the backward, still live
  uint64_t transient = 0;          // the rest: logits gradients, recomputed blocks, foreach temporaries
  uint64_t cublas_workspaces = 0;  // CUDA: the two threads' cuBLAS workspaces
  uint64_t peak = 0;
  std::string phase;  // where the peak falls: forward, backward or optimizer
  std::string where;  // which allocation of that phase (for the tests and the curious)
  // CUDA: torch.cuda.max_memory_reserved of the run (model to the GPU, two steps), the run's
  // allocation order replayed through the caching allocator's model
  // (fit/pytorch_allocation_order.hpp), and that sequence's own max_memory_allocated. 0 where the
  // order is not modelled; reserved_why says why.
  uint64_t max_memory_reserved = 0;
  uint64_t order_allocated = 0;
  std::string reserved_why;
};

// What a CUDA run needs of the device's memory beside the runtime's fixed bytes: the predicted
// reserve where there is one, else the tensors' peak.
inline uint64_t pytorch_device_bytes(const TorchPeak& p) {
  return p.max_memory_reserved ? std::max(p.max_memory_reserved, p.peak) : p.peak;
}

// HF's own parameter count (the real vocabulary, no padding) and its number of parameter
// tensors (AdamW keeps one step tensor per parameter tensor).
struct TorchParameters {
  int64_t elements = 0, tensors = 0;
};
TorchParameters torch_parameters(const ModelSpec& spec);

// The HF + PyTorch step a memfit policy is, on one process: the same micro-batch; memfit's full
// recomputation is HF's gradient checkpointing (every block recomputed from its input), bf16 is
// torch.autocast; `attention` given, else memfit's flash is sdpa and plain is eager. Empty, with
// `why` in a few words, for what the prediction does not model: fp16, selective recomputation,
// 8-bit AdamW, ZeRO or offload (DeepSpeed's), data parallelism (DDP's buckets), LoRA, frozen
// parameters, the update in backward.
std::optional<TorchStep> torch_step_for(const Policy& p, int world, std::optional<TorchAttention> attention,
                                        std::string& why);

// The step on a GPU preset's CUDA device (cuBLAS workspace from the preset), unchanged for the
// machine memfit runs on (the CPU, as the fixtures measured it).
struct Hardware;
struct Cluster;
TorchStep on_hardware(TorchStep step, const Hardware& hw);
// What a PyTorch run on the cluster holds beside its tensors: the runtime's fixed bytes, less
// the cuBLAS workspace when the CUDA prediction already counts both threads' workspaces.
uint64_t torch_runtime_bytes(const Cluster& cluster);

// Throws [framework] for shapes the prediction does not cover.
TorchPeak predict_pytorch_peak(const ModelSpec& spec, const TorchStep& step);

// The largest live bytes of the forward or backward that are not parameter-shaped (activations
// and their temporaries, without the token ids), over the prediction's table: what a framework
// that holds parameters, gradients and optimizer state its own way (DeepSpeed) adds to them.
// Throws [framework] like predict_pytorch_peak.
uint64_t pytorch_activation_peak(const ModelSpec& spec, const TorchStep& step);

std::string format_pytorch_peak(const ModelSpec& spec, const TorchStep& step, const TorchPeak& p);
nlohmann::json pytorch_peak_json(const TorchStep& step, const TorchPeak& p);

}  // namespace memfit
