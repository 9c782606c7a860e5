#include "graph/training_program.hpp"

#include <algorithm>
#include <cmath>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "graph/autodiff.hpp"
#include "graph/eval_program.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/inference_program.hpp"
#include "graph/model_forward.hpp"
#include "graph/offload.hpp"
#include "graph/optimizer.hpp"
#include "graph/precision.hpp"
#include "graph/recompute.hpp"
#include "graph/zero.hpp"
#include "graph/schedule_async.hpp"
#include "graph/zero_hpz.hpp"
#include "graph/update_in_backward.hpp"

namespace memfit {

namespace {

// Sizes derived from the batch shape, checked before any tensor is made: the rows of every
// product (batch x sequence) within what the matmul kernels index, and plain attention's
// probabilities (B x NH x T x T per layer, the one tensor with three large factors) within
// one tier. Every other tensor has two factors of at most kMaxKernelDim each, so its element
// count fits int64_t; Program::add_tensor bounds its bytes.
void check_step_sizes(const ModelSpec& spec, const Policy& p) {
  const int64_t rows = checked_mul(p.batch, p.seq, "batch x sequence length", "policy");
  MEMFIT_CHECK(rows <= kMaxKernelDim, "policy",
               "batch x sequence length = {} x {} = {} rows, above {}, the most rows oneDNN's matmul kernels index "
               "(32-bit); use a smaller --batch with --grad-accum", p.batch, p.seq, rows, kMaxKernelDim);
  MEMFIT_CHECK(p.classifier_chunk_rows >= 0, "policy", "classifier chunk rows must be >= 0 (got {}; 0: automatic)",
               p.classifier_chunk_rows);
  if (p.attention != AttentionKind::plain) return;
  const std::string what = "attention probabilities per layer (batch x heads x sequence x sequence)";
  const int64_t probs = checked_mul(checked_mul(rows, spec.n_head, what, "policy"), p.seq, what, "policy");
  MEMFIT_CHECK(uint64_t(probs) <= kMaxTierBytes / 4, "policy",
               "plain attention keeps {} x {} x {} x {} = {} probabilities per layer, more than one memory tier "
               "may hold ({}); use --attention flash", p.batch, spec.n_head, p.seq, p.seq, probs,
               format_bytes(kMaxTierBytes));
}

// ZeRO++ qgZ (graph/zero_qgz.cpp): the sharded gradient reduce-scatter, quantised.
void check_quantized_gradients(const Policy& p, const Topology& topo) {
  if (!p.zero_quantized_gradients) return;
  MEMFIT_CHECK(p.zero_stage >= 2, "policy",
               "zero_quantized_gradients (ZeRO++ qgZ) quantises the gradient reduce-scatter of ZeRO stages 2 and 3 "
               "(got stage {})", p.zero_stage);
  MEMFIT_CHECK(topo.data > 1, "policy",
               "zero_quantized_gradients (ZeRO++ qgZ) needs a data-parallel degree above 1 (got {})", topo.data);
  MEMFIT_CHECK(p.zero_quantized_gradient_bits == 4 || p.zero_quantized_gradient_bits == 8, "policy",
               "zero_quantized_gradient_bits must be 4 or 8 (got {})", p.zero_quantized_gradient_bits);
  const int h = topo.data_per_node();
  MEMFIT_CHECK(h <= 1 || h >= topo.data || topo.data % h == 0, "policy",
               "zero_quantized_gradients: {} data-parallel ranks per node do not divide the data degree {} (qgZ's "
               "second hop pairs each rank with one on every node)", h, topo.data);
  MEMFIT_CHECK(p.offload_optimizer == Tier::device && p.offload_params == Tier::device, "policy",
               "zero_quantized_gradients with offloaded optimizer state or parameters is not supported yet");
}

Program build_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                      const OpCapabilities& backend, const ForwardRewrites& extra_rewrites, bool split_layers);

// What tensor parallelism does not combine with yet, refused before anything is built.
void check_tensor_parallel_policy(const Policy& p) {
  auto refuse = [](std::string_view what) {
    throw Error("policy", fmt::format("{} with tensor parallelism is not supported by this build yet", what));
  };
  if (p.sample_prompt > 0) refuse("sampling during training");
  if (p.offload_optimizer != Tier::device || p.offload_params != Tier::device) refuse("offload");
  if (p.zero_quantized_gradients || p.zero_hpz_partition_size > 1) refuse("ZeRO++ qgZ or hpZ");
  if (p.update_in_backward) refuse("updating in the backward pass");
}

void check_supported(const ModelSpec& spec, const Policy& p, const Topology& topo) {
  auto unsupported = [](std::string_view what) {
    throw Error("policy", fmt::format("{} is not supported by this build yet", what));
  };
  MEMFIT_CHECK(p.batch >= 1, "policy", "batch must be at least 1 (got {})", p.batch);
  MEMFIT_CHECK(p.seq >= 1, "policy", "sequence length must be at least 1 (got {})", p.seq);
  MEMFIT_CHECK(p.grad_accum >= 1, "policy", "gradient accumulation must be at least 1 (got {})", p.grad_accum);
  MEMFIT_CHECK(p.seq <= spec.max_seq, "policy", "sequence length {} exceeds the context of model '{}' ({} positions)",
               p.seq, spec.name, spec.max_seq);
  check_step_sizes(spec, p);
  check_precision_policy(p);
  check_update_in_backward(p);
  MEMFIT_CHECK(std::isfinite(p.grad_clip) && p.grad_clip >= 0, "policy",
               "gradient clipping needs a norm >= 0 (got {}; 0 turns it off)", p.grad_clip);
  MEMFIT_CHECK(p.zero_stage >= 0 && p.zero_stage <= 3, "policy", "ZeRO stage must be 0..3 (got {})", p.zero_stage);
  // Checked here too: at stage 0 on one rank the ZeRO pass (and its own check) never runs.
  MEMFIT_CHECK(!p.zero_quantized_weights || p.zero_stage == 3, "policy",
               "zero_quantized_weights (ZeRO++ qwZ) quantises stage 3's parameter gathers: it needs ZeRO stage 3 "
               "(got stage {})", p.zero_stage);
  check_hpz(p, topo);  // ZeRO++ hpZ (graph/zero_hpz.hpp)
  MEMFIT_CHECK(topo.data >= 1 && topo.tensor >= 1 && topo.rank >= 0 && topo.rank < topo.world(), "policy",
               "rank {} of a world of {} x {} ranks (data x tensor)", topo.rank, topo.data, topo.tensor);
  check_quantized_gradients(p, topo);
  if (p.update_in_backward && (p.zero_stage > 0 || topo.world() > 1))
    unsupported("updating in the backward pass with data parallelism (ZeRO)");
  if (const std::string why = offload_refusal(p); !why.empty()) throw Error("policy", why);
}

// The classifier, fused: logits chunk by chunk, the loss of each row and its gradient in one
// op. Under tensor parallelism each rank holds a slice of the vocabulary (Megatron's
// vocabulary-parallel cross-entropy, no rank holding all the logits): the slices' row
// statistics (max, sum of exponentials, target logit) are gathered over the tensor group and
// combined into each row's loss and log-sum-exp, from which each rank's backward computes
// its slice's gradient. Returns the per-row losses.
TensorId emit_classifier(GraphBuilder& b, Autodiff& ad, const ModelSpec& spec, const Policy& policy, TensorId weight,
                         TensorId hidden, TensorId targets) {
  Program& p = b.program();
  const int64_t N = policy.batch * policy.seq, k = policy.grad_accum;
  const TensorParallel& tp = b.tensor_parallel();
  const int64_t V = p.tensor(weight).shape[0], C = spec.n_embd;
  ClassifierAttrs c;
  c.rows = N;
  c.vocab = spec.vocab_size;
  c.chunk_rows = classifier_chunk_rows(spec, policy);
  c.grad_scale = 1.0f / float(N * k);
  c.vocab_begin = int64_t(tp.index) * V;
  c.parts = tp.parts;
  // Frozen parameters: no gradient flows where nothing trainable waits for it, and the
  // kernel skips the products of absent outputs.
  auto contribute_if_needed = [&](TensorId x) {
    return p.tensor(x).requires_grad ? ad.contribute(x) : std::pair{kNoTensor, WriteMode::overwrite};
  };
  const double products = double(N) * double(V) * double(C);
  if (!tp.on()) {
    const TensorId losses = b.transient("losses", Shape{N}, Category::activations);
    const TensorId chunk = b.transient("classifier.logits_chunk", Shape{c.chunk_rows, V}, Category::temporaries);
    auto [dhidden, mode_hidden] = contribute_if_needed(hidden);
    auto [dw, mode_w] = contribute_if_needed(weight);
    b.emit({OpKind::classifier, "classifier", {hidden, weight, targets}, {losses, dhidden, dw}, c,
            6.0 * products + 5.0 * double(N) * double(spec.vocab_size), {WriteMode::overwrite, mode_hidden, mode_w},
            {chunk}});
    return losses;
  }
  const auto [tp_losses, lse] = b.vocab_parallel_losses("classifier.", hidden, weight, targets, c);
  auto [dhidden, mode_hidden] = contribute_if_needed(hidden);
  auto [dw, mode_w] = contribute_if_needed(weight);
  const TensorId back_chunk = b.transient("classifier.bwd.logits_chunk", Shape{c.chunk_rows, V}, Category::temporaries);
  b.emit({OpKind::classifier_parallel_backward, "classifier.bwd", {hidden, weight, targets, lse}, {dhidden, dw}, c,
          6.0 * products + 4.0 * double(N) * double(V), {mode_hidden, mode_w}, {back_chunk}});
  return tp_losses;
}

}  // namespace

int64_t classifier_chunk_rows(const ModelSpec& spec, const Policy& policy) {
  const int64_t rows = policy.batch * policy.seq;
  if (policy.classifier_chunk_rows > 0) return std::min(rows, policy.classifier_chunk_rows);
  // At most 128 MiB of fp32 logits at once, in multiples of 64 rows (GPT-2: 640 of B*T rows);
  // small vocabularies do all rows. Fewer rows save memory but make the three GEMMs less
  // efficient: on this CPU the classifier ran at 220 GFLOP/s with 128 rows, 263 with 512.
  // Chunks are equal (up to a multiple of 16) so the last one is not a small, slow product.
  const int64_t budget_rows = std::max<int64_t>(64, int64_t(128 * MiB) / (spec.padded_vocab * 4) / 64 * 64);
  const int64_t chunks = (rows + budget_rows - 1) / budget_rows;
  return std::min(rows, ((rows + chunks - 1) / chunks + 15) / 16 * 16);
}

Program build_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                               const OpCapabilities& backend, const ForwardRewrites& extra_rewrites) {
  return build_program(spec, policy, topology, backend, extra_rewrites, /*split_layers=*/true);
}

Program build_unsplit_training_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                                       const OpCapabilities& backend, const ForwardRewrites& extra_rewrites) {
  return build_program(spec, policy, topology, backend, extra_rewrites, /*split_layers=*/false);
}

namespace {

Program build_program(const ModelSpec& spec, const Policy& policy, const Topology& topology,
                      const OpCapabilities& backend, const ForwardRewrites& extra_rewrites, bool split_layers) {
  spec.validate();
  check_supported(spec, policy, topology);
  const TensorParallel tp{split_layers ? topology.tensor : 1, split_layers ? topology.tensor_rank() : 0,
                          policy.sequence_parallel};
  MEMFIT_CHECK(!policy.sequence_parallel || topology.tensor > 1, "policy",
               "sequence parallelism splits the rows over the tensor group: it needs a tensor-parallel degree above 1");
  if (tp.on()) check_tensor_parallel_policy(policy);
  ForwardRewrites rewrites = forward_rewrites_for(policy, topology.data_rank());
  rewrites.insert(rewrites.end(), extra_rewrites.begin(), extra_rewrites.end());
  MEMFIT_CHECK(!tp.on() || (!policy.quantize_base.enabled() && extra_rewrites.empty()), "policy",
               "a quantised base with tensor parallelism is not supported by this build yet");
  if (!extra_rewrites.empty() && (policy.zero_stage > 0 || topology.world() > 1))
    throw Error("policy", "forward rewrites with data parallelism (ZeRO or more than one rank) are not supported by this build yet");
  const std::vector<BlockRecompute> recompute = resolve_recompute(policy.recompute, spec.n_layer);
  const int64_t B = policy.batch, T = policy.seq, N = B * T, k = policy.grad_accum;

  Program p;
  GraphBuilder b(p);
  b.set_tensor_parallel(tp);
  const ModelParams params = declare_model_parameters(b, spec);
  declare_forward_rewrites(b, rewrites);
  declare_master_weights(b, policy);
  declare_optimizer_state(b, policy);
  for (ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    const TensorDesc& t = p.tensor(e.value);
    b.set_layer(t.layer);
    // Accumulation across micro-steps needs gradients that outlive one micro-step.
    if (k > 1 && e.trainable) e.grad = b.persistent("grad." + e.name, t.shape, Category::gradients);
  }
  b.set_layer(-1);
  const TensorId loss = b.persistent(kLoss, Shape{1}, Category::activations);

  p.begin_section(SectionKind::micro, int(k));
  {
    const TensorId tokens = b.transient(kTokens, Shape{B, T}, Category::activations, DType::i32);
    const TensorId targets = b.transient(kTargets, Shape{B, T}, Category::activations, DType::i32);
    b.emit({OpKind::load_input, "load_batch", {}, {tokens, targets}});
    const int fwd_begin = int(p.ops().size());
    const TensorId hidden = model_forward(b, spec, params, tokens, "", policy.attention);
    rewrite_forward(b, fwd_begin, rewrites);
    const int fwd_end = int(p.ops().size());

    Autodiff ad(b, k > 1);
    b.set_phase(Phase::backward);
    const TensorId losses = emit_classifier(b, ad, spec, policy, params.classifier_weight, hidden, targets);
    b.emit({OpKind::loss_mean, "loss", {losses}, {loss}, ScaleAttrs{1.0f / float(N * k)}, double(N),
            {k > 1 ? WriteMode::accumulate_after_first_micro : WriteMode::overwrite}});
    ad.backward(fwd_begin, fwd_end);
    emit_overflow_check(b, policy);
  }
  p.end_section();
  // Data parallelism: the collectives that must run once per step whether or not the
  // optimizer does (the global loss, fp16's overflow flag); filled by graph/zero.cpp.
  if (policy.zero_stage > 0 || topology.world() > 1) {
    p.begin_section(SectionKind::sync);
    p.end_section();
  }

  p.begin_section(SectionKind::optimizer);
  emit_optimizer_step(b, policy);
  p.end_section();

  if (policy.with_eval) emit_eval_section(b, spec, params, policy, rewrites);
  if (policy.sample_prompt > 0)
    emit_generate_section(b, spec, params, policy, GenerateShape{policy.sample_prompt, policy.sample_capacity});
  // Sequence parallelism gathers a block's rows again for its backward (graph/recompute.cpp).
  if (policy.recompute.mode != RecomputeMode::none || tp.sequence_on()) p = apply_recompute(p, recompute);
  // After recompute: recomputed ops get the same dtypes and fp32 islands as the forward ops
  // they replay (so they compute the same bits), and their replays indices are remapped.
  apply_precision(p, policy, backend);
  // The updates follow the last use of each parameter, recomputed and cast ops included.
  if (policy.update_in_backward) apply_update_in_backward(p);
  // Last: ZeRO re-homes parameters and gradients with their final dtypes (frozen parameters:
  // see graph/zero.hpp).
  if (policy.zero_stage > 0 || topology.world() > 1) apply_zero(p, policy, topology);
  // After ZeRO, whose update ops name this rank's pieces: those pieces are what moves.
  apply_optimizer_offload(p, policy);
  // After optimizer offload, whose chunked updates may write pieces of the parameter shards.
  apply_param_offload(p, policy);
  schedule_async(p, AsyncOptions{.overlap_comm = policy.overlap_comm});
  p.validate();
  return p;
}

}  // namespace

}  // namespace memfit
