// Generation as a planned program: section "generate" holds two runs of the model's forward
// over a KV cache, a prefill over the P prompt tokens and a decode over one token, one after
// the other in program order. Both read the same parameters and write the same persistent
// caches (category kv_cache: per layer a k and a v tensor of (1, KV, S, HS)) and logits, so one
// memory plan places the shared tensors once and lets the two runs' transients reuse the same
// bytes; the caller runs the prefill ops once and the decode ops once per new token
// (Executor::run_ops), with StepContext::position saying where the run's tokens sit.
// Only the last position's logits are computed: the last row of the residual stream is
// sliced out before the final norm and the product with the (tied) embedding.
#pragma once

#include "graph/forward_rewrite.hpp"

#include <cstdint>

#include "graph/builder.hpp"
#include "graph/capabilities.hpp"
#include "graph/model_forward.hpp"
#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

struct GenerateShape {
  int64_t prompt = 1;    // P: tokens of the prefill
  int64_t capacity = 1;  // S: positions the cache holds (prompt + new tokens)
};

inline constexpr const char* kGenPromptTokens = "generate.prompt_tokens";  // (1, P) i32, written by the host
inline constexpr const char* kGenToken = "generate.token";                 // (1, 1) i32, the decode's input
inline constexpr const char* kGenLogits = "generate.logits";               // (1, Vp): the last position's

// Throws [policy] when the shape cannot run: P or S below 1, P above S, S above the model's
// positions (naming them).
void check_generate_shape(const ModelSpec& spec, const GenerateShape& shape);

// Appends section "generate" (prefill ops named "prefill.*", then decode ops "decode.*") over
// `params`. Its tensors get fp32, except the caches: the policy's compute dtype (the precision
// pass leaves kv_cache tensors as declared).
// `rewrites` (LoRA, a quantised base) replace the products as in training, so a model
// generates with its adapter on its quantised weights.
void emit_generate_section(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, const Policy& policy,
                           const GenerateShape& shape, const ForwardRewrites& rewrites = {});

// A program of one section, "generate", over every parameter frozen and held in the policy's
// precision (as graph/eval_program.hpp holds them).
Program build_inference_program(const ModelSpec& spec, const Policy& policy, const OpCapabilities& backend,
                                const GenerateShape& shape);

// Where a built (and compiled) program's generation lives: op ranges [begin, end) and tensors.
struct GenerateOps {
  int prefill_begin = 0, prefill_end = 0, decode_begin = 0, decode_end = 0;
  TensorId prompt_tokens = kNoTensor, token = kNoTensor, logits = kNoTensor;
  int64_t prompt = 0, capacity = 0;
};
// Throws [graph] when the program has no generate section.
GenerateOps find_generate_ops(const Program& program);

}  // namespace memfit
