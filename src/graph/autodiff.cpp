#include "graph/autodiff.hpp"

#include "core/error.hpp"

namespace memfit {

Autodiff::Autodiff(GraphBuilder& builder, bool persistent_param_grads)
    : b_(builder), p_(builder.program()), persistent_param_grads_(persistent_param_grads) {
  for (size_t i = 0; i < p_.params().size(); ++i) {
    const ParamEntry& e = p_.params()[i];
    if (e.value == kNoTensor) continue;  // stored only quantised: frozen, never differentiated
    MEMFIT_ASSERT(param_index_.emplace(e.value, i).second, "two parameters share the tensor of {}", e.name);
    if (e.grad != kNoTensor) grads_[e.value] = e.grad;
  }
}

TensorId Autodiff::grad(TensorId x) const {
  auto it = grads_.find(x);
  return it == grads_.end() ? kNoTensor : it->second;
}

std::pair<TensorId, WriteMode> Autodiff::contribute(TensorId x) {
  const TensorDesc& t = p_.tensor(x);
  MEMFIT_ASSERT(t.requires_grad, "gradient contributed to {}, which does not require one", t.name);
  const bool is_param = t.category == Category::parameters;
  if (is_param && t.grad_summed_over_tensor_group) {
    // Sequence parallelism: this rank's rows give a partial gradient, collected in a transient
    // of the micro-step and summed over the tensor group at the end of the backward.
    auto it = partial_grads_.find(x);
    if (it != partial_grads_.end()) return {it->second, WriteMode::accumulate};
    const int saved_layer = b_.layer();
    b_.set_layer(t.layer);
    const TensorId g = b_.transient("d." + t.name + ".rows", t.shape, Category::gradients);
    b_.set_layer(saved_layer);
    partial_grads_.emplace(x, g);
    partial_order_.push_back(x);
    return {g, WriteMode::overwrite};
  }
  return contribute_whole(x);
}

std::pair<TensorId, WriteMode> Autodiff::contribute_whole(TensorId x) {
  const TensorDesc& t = p_.tensor(x);
  const bool is_param = t.category == Category::parameters;
  auto it = grads_.find(x);
  if (it != grads_.end()) {
    // A persistent parameter gradient registered up front: its first write in a micro-step
    // overwrites in the first micro-step and accumulates in later ones.
    const bool first_write = is_param && persistent_param_grads_ && written_.insert(x).second;
    return {it->second, first_write ? WriteMode::accumulate_after_first_micro : WriteMode::accumulate};
  }
  MEMFIT_ASSERT(!(is_param && persistent_param_grads_), "parameter {} has no persistent gradient", t.name);
  const int saved_layer = b_.layer();
  b_.set_layer(t.layer);
  const TensorId g = b_.transient("d." + t.name, t.shape, is_param ? Category::gradients : Category::temporaries);
  b_.set_layer(saved_layer);
  grads_[x] = g;
  if (is_param) {
    // A map, not a scan of every parameter: the scan made building a program quadratic in layers.
    const auto entry = param_index_.find(x);
    MEMFIT_ASSERT(entry != param_index_.end(), "parameter {} is not registered", t.name);
    p_.params()[entry->second].grad = g;
  }
  return {g, WriteMode::overwrite};
}

void Autodiff::backward(int begin, int end) {
  const Phase saved = b_.phase();
  b_.set_phase(Phase::backward);
  for (int i = end - 1; i >= begin; --i) {
    const Op fwd = p_.op(i);  // copy: emitting ops may reallocate the op vector
    if (fwd.phase != Phase::forward) continue;
    b_.set_layer(fwd.layer);
    sum_grads_over_tensor_group(fwd);
    backward_of(fwd);
  }
  sum_partial_param_grads();
  b_.set_layer(-1);
  b_.set_phase(saved);
}

// Each partial gradient once summed over the tensor group, then added to the parameter's
// gradient as any contribution is (a persistent one accumulates over micro-steps after it).
void Autodiff::sum_partial_param_grads() {
  const TensorParallel& tp = b_.tensor_parallel();
  for (TensorId x : partial_order_) {
    const TensorId g = partial_grads_.at(x);
    const TensorDesc& t = p_.tensor(x);
    b_.set_layer(t.layer);
    b_.emit({OpKind::all_reduce, "d." + t.name + ".tensor_all_reduce", {}, {g},
             CollectiveAttrs{CommGroup::tensor, tp.parts, false}, 0, {WriteMode::update}, {}, {},
             ring_bytes(double(p_.tensor(g).bytes()), tp.parts, 2.0)});
    auto [dx, mode] = contribute_whole(x);
    b_.emit({OpKind::accumulate, "d." + t.name + ".add_rows", {g}, {dx}, NoAttrs{}, double(t.numel()), {mode}});
  }
  partial_order_.clear();
  partial_grads_.clear();
}

// The producer's backward comes after every consumer's (this walk is in reverse), so the
// gradients of its outputs are complete here: each rank's partial sum becomes the group's sum.
void Autodiff::sum_grads_over_tensor_group(const Op& fwd) {
  const TensorParallel& tp = b_.tensor_parallel();
  for (TensorId y : fwd.outputs) {
    if (y == kNoTensor || !p_.tensor(y).grad_summed_over_tensor_group) continue;
    const TensorId dy = grad(y);
    if (dy == kNoTensor) continue;
    MEMFIT_ASSERT(tp.on(), "{} is summed over a tensor group of one rank", p_.tensor(y).name);
    const double bytes = ring_bytes(double(p_.tensor(dy).bytes()), tp.parts, 2.0);
    b_.emit({OpKind::all_reduce, fwd.name + ".bwd_tensor_all_reduce", {}, {dy},
             CollectiveAttrs{CommGroup::tensor, tp.parts, false}, 0, {WriteMode::update}, {}, {}, bytes});
  }
}

// Passes dy on to x as its gradient: x takes dy's buffer when it has no gradient yet (see
// add_backward), else dy is added to it.
void Autodiff::pass_through(const std::string& name, TensorId x, TensorId dy) {
  if (!p_.tensor(x).requires_grad) return;
  if (grad(x) == kNoTensor && p_.tensor(x).category != Category::parameters) {
    grads_[x] = dy;
    return;
  }
  auto [dx, mode] = contribute(x);
  b_.emit({OpKind::accumulate, name, {dy}, {dx}, NoAttrs{}, double(p_.tensor(dy).numel()), {mode}});
}

void Autodiff::collective_backward(const Op& fwd, TensorId dy) {
  const TensorId x = fwd.inputs[0];
  if (!p_.tensor(x).requires_grad) return;
  const auto& a = std::get<CollectiveAttrs>(fwd.attrs);
  auto [dx, mode] = contribute(x);
  // A collective overwrites its output: a gradient that accumulates takes it through a temporary.
  const TensorId into = mode == WriteMode::overwrite
                            ? dx
                            : b_.transient(fwd.name + ".bwd.partial", p_.tensor(x).shape, Category::temporaries);
  const bool gather = fwd.kind == OpKind::reduce_scatter;  // the backward of a scatter gathers
  const TensorId full = gather ? into : dy;
  const double bytes = ring_bytes(double(p_.tensor(full).bytes()), a.size, 1.0);
  b_.emit({gather ? OpKind::all_gather : OpKind::reduce_scatter, fwd.name + ".bwd", {dy}, {into}, a, 0,
           {WriteMode::overwrite}, {}, {}, bytes});
  if (into != dx)
    b_.emit({OpKind::accumulate, fwd.name + ".bwd_add", {into}, {dx}, NoAttrs{}, double(p_.tensor(dx).numel()), {mode}});
}

void Autodiff::backward_of(const Op& fwd) {
  auto needs = [&](TensorId t) { return t != kNoTensor && p_.tensor(t).requires_grad; };
  // Ops whose outputs received no gradient contribute nothing.
  const TensorId dy = grad(fwd.outputs[0]);
  if (dy == kNoTensor) return;
  const std::string bname = fwd.name + ".bwd";
  switch (fwd.kind) {
    case OpKind::matmul: return matmul_backward(fwd, dy);
    case OpKind::quant_linear: return quant_linear_backward(fwd, dy);
    case OpKind::add: return add_backward(fwd, dy);
    case OpKind::add_columns: return add_backward(fwd, dy);
    case OpKind::all_reduce:  // tensor parallelism's forward sum: the identity backward (Megatron's g)
      MEMFIT_ASSERT(fwd.inputs.size() == 1, "forward all_reduce {} is not out of place", fwd.name);
      return pass_through(bname, fwd.inputs[0], dy);
    case OpKind::all_gather:      // sequence parallelism: the gradient of gathered rows is scattered
    case OpKind::reduce_scatter:  // back (summed), and that of scattered sums is gathered
      return collective_backward(fwd, dy);
    case OpKind::add_bias: {
      const TensorId bias = fwd.inputs[1];
      if (needs(bias)) {
        auto [db, mode] = contribute(bias);
        const Shape& s = p_.tensor(dy).shape;
        b_.emit({OpKind::bias_grad, fwd.name + ".bwd_bias", {dy}, {db}, NoAttrs{}, double(s.numel()), {mode}});
      }
      return pass_through(bname, fwd.inputs[0], dy);
    }
    case OpKind::dropout_forward: {
      // The same keep mask, drawn again from the same key: nothing is saved for the backward.
      const TensorId x = fwd.inputs[0];
      if (!needs(x)) return;
      auto [dx, mode] = contribute(x);
      std::vector<std::pair<int, int>> inplace;
      if (mode == WriteMode::overwrite) inplace.push_back({0, 0});
      b_.emit({OpKind::dropout_backward, bname, {dy}, {dx}, fwd.attrs, fwd.flops, {mode}, {}, inplace});
      return;
    }
    case OpKind::embedding_forward: return embedding_backward(fwd, dy);
    case OpKind::dora_norm: return;  // DoRA holds ||W + dW|| constant in the backward (its paper, 4.3)
    case OpKind::dora_scale: return dora_scale_backward(fwd, dy);
    case OpKind::dora_blend: return dora_blend_backward(fwd, dy);
    case OpKind::rmsnorm_forward: {
      const TensorId x = fwd.inputs[0], w = fwd.inputs[1], rstd = fwd.outputs[1];
      std::vector<TensorId> outs{kNoTensor, kNoTensor};
      std::vector<WriteMode> modes(2, WriteMode::overwrite);
      if (needs(x)) std::tie(outs[0], modes[0]) = contribute(x);
      if (needs(w)) std::tie(outs[1], modes[1]) = contribute(w);
      b_.emit({OpKind::rmsnorm_backward, bname, {dy, x, w, rstd}, outs, fwd.attrs, 8.0 * double(p_.tensor(x).numel()),
               modes});
      return;
    }
    case OpKind::rope_forward: {
      const TensorId x = fwd.inputs[0];
      if (!needs(x)) return;
      auto [dx, mode] = contribute(x);
      std::vector<std::pair<int, int>> inplace;
      if (mode == WriteMode::overwrite) inplace.push_back({0, 0});
      b_.emit({OpKind::rope_backward, bname, {dy}, {dx}, fwd.attrs, fwd.flops, {mode}, {}, inplace});
      return;
    }
    case OpKind::swiglu_forward: {
      const TensorId gate = fwd.inputs[0], up = fwd.inputs[1];
      std::vector<TensorId> outs{kNoTensor, kNoTensor};
      std::vector<WriteMode> modes(2, WriteMode::overwrite);
      if (needs(gate)) std::tie(outs[0], modes[0]) = contribute(gate);
      if (needs(up)) std::tie(outs[1], modes[1]) = contribute(up);
      b_.emit({OpKind::swiglu_backward, bname, {dy, gate, up}, outs, NoAttrs{}, 10.0 * double(p_.tensor(gate).numel()),
               modes});
      return;
    }
    case OpKind::layernorm_forward: {
      const TensorId x = fwd.inputs[0], w = fwd.inputs[1], bias = fwd.inputs[2];
      const TensorId mean = fwd.outputs[1], rstd = fwd.outputs[2];
      std::vector<TensorId> outs{kNoTensor, kNoTensor, kNoTensor};
      std::vector<WriteMode> modes(3, WriteMode::overwrite);
      if (needs(x)) std::tie(outs[0], modes[0]) = contribute(x);
      if (needs(w)) std::tie(outs[1], modes[1]) = contribute(w);
      if (needs(bias)) std::tie(outs[2], modes[2]) = contribute(bias);
      b_.emit({OpKind::layernorm_backward, bname, {dy, x, w, mean, rstd}, outs, fwd.attrs,
               12.0 * double(p_.tensor(x).numel()), modes});
      return;
    }
    case OpKind::gelu_forward: {
      const TensorId x = fwd.inputs[0];
      if (!needs(x)) return;
      auto [dx, mode] = contribute(x);
      // dx may reuse dy's bytes when dy dies here and dx is fresh.
      std::vector<std::pair<int, int>> inplace;
      if (mode == WriteMode::overwrite) inplace.push_back({0, 0});
      b_.emit({OpKind::gelu_backward, bname, {dy, x}, {dx}, NoAttrs{}, 16.0 * double(p_.tensor(x).numel()), {mode}, {},
               inplace});
      return;
    }
    case OpKind::attention_forward: {
      const TensorId qkv = fwd.inputs[0], probs = fwd.outputs[1];
      if (!needs(qkv)) return;
      const auto& a = std::get<AttentionAttrs>(fwd.attrs);
      auto [dqkv, mode] = contribute(qkv);
      const TensorId dprobs = b_.transient(fwd.name + ".dprobs", p_.tensor(probs).shape, Category::temporaries);
      const double flops = 8.0 * double(a.batch * a.heads) * double(a.seq * a.seq) * double(a.head_dim) +
                           6.0 * double(a.batch * a.heads * a.seq * a.seq);
      b_.emit({OpKind::attention_backward, bname, {dy, qkv, probs}, {dqkv}, fwd.attrs, flops, {mode}, {dprobs}});
      return;
    }
    case OpKind::flash_attention_forward: {
      // Saves only y and lse: the backward rebuilds each tile of probabilities from q, k and
      // lse, and uses D = rowsum(dy * y) (computed inside the kernel, per head) for the
      // softmax's row sums.
      const TensorId qkv = fwd.inputs[0], y = fwd.outputs[0], lse = fwd.outputs[1];
      if (!needs(qkv)) return;
      const auto& a = std::get<AttentionAttrs>(fwd.attrs);
      auto [dqkv, mode] = contribute(qkv);
      const double pairs = double(a.batch * a.heads) * double(a.seq) * double(a.seq + 1) / 2;
      b_.emit({OpKind::flash_attention_backward, bname, {dy, qkv, y, lse}, {dqkv}, fwd.attrs,
               10.0 * pairs * double(a.head_dim) + 8.0 * pairs, {mode}});
      return;
    }
    default:
      MEMFIT_CHECK(false, "graph", "no backward rule for forward op '{}' of kind {}", fwd.name, op_kind_name(fwd.kind));
  }
}

// The token embedding: dwte (rows of this rank's vocabulary slice under tensor parallelism)
// and, for GPT-2, dwpe, both from dy.
void Autodiff::embedding_backward(const Op& fwd, TensorId dy) {
  auto needs = [&](TensorId t) { return t != kNoTensor && p_.tensor(t).requires_grad; };
  const std::string bname = fwd.name + ".bwd";
  const TensorId tokens = fwd.inputs[0], wte = fwd.inputs[1];
  const TensorId wpe = fwd.inputs.size() > 2 ? fwd.inputs[2] : kNoTensor;  // llama: no position table
  std::vector<TensorId> outs{kNoTensor, kNoTensor};
  std::vector<WriteMode> modes{WriteMode::overwrite, WriteMode::overwrite};
  if (needs(wte)) std::tie(outs[0], modes[0]) = contribute(wte);
  if (needs(wpe)) std::tie(outs[1], modes[1]) = contribute(wpe);
  if (wpe == kNoTensor) {
    outs.pop_back();
    modes.pop_back();
  }
  b_.emit({OpKind::embedding_backward, bname, {dy, tokens}, outs, fwd.attrs, double(p_.tensor(dy).numel()), modes});
}

void Autodiff::matmul_backward(const Op& fwd, TensorId dy) {
  const auto& a = std::get<MatmulAttrs>(fwd.attrs);
  MEMFIT_ASSERT(!a.trans_a, "matmul backward of {} with a transposed A is not emitted by any builder", fwd.name);
  const TensorId A = fwd.inputs[0], B = fwd.inputs[1];
  const TensorId bias = fwd.inputs.size() > 2 ? fwd.inputs[2] : kNoTensor;
  const double flops = 2.0 * double(a.m) * double(a.n) * double(a.k);
  auto needs = [&](TensorId t) { return t != kNoTensor && p_.tensor(t).requires_grad; };
  if (needs(A)) {
    // dA[M,K] = dC[M,N] @ op(B)^T
    auto [dA, mode] = contribute(A);
    MatmulAttrs g{a.m, a.k, a.n, false, !a.trans_b, a.alpha, a.b_offset, a.b_window};  // the same window of B
    b_.emit({OpKind::matmul, fwd.name + ".bwd_input", {dy, B}, {dA}, g, flops, {mode}});
  }
  if (needs(B)) {
    MEMFIT_ASSERT(!a.b_window, "matmul {} trains a window of its B's rows", fwd.name);
    auto [dB, mode] = contribute(B);
    if (a.trans_b) {
      // B stored [N,K]: dB[N,K] = dC^T[N,M] @ A[M,K]
      MatmulAttrs g{a.n, a.k, a.m, true, false, a.alpha};
      b_.emit({OpKind::matmul, fwd.name + ".bwd_weight", {dy, A}, {dB}, g, flops, {mode}});
    } else {
      // B stored [K,N]: dB[K,N] = A^T[K,M] @ dC[M,N]
      MatmulAttrs g{a.k, a.n, a.m, true, false, a.alpha};
      b_.emit({OpKind::matmul, fwd.name + ".bwd_weight", {A, dy}, {dB}, g, flops, {mode}});
    }
  }
  if (needs(bias)) {
    auto [db, mode] = contribute(bias);
    b_.emit({OpKind::bias_grad, fwd.name + ".bwd_bias", {dy}, {db}, NoAttrs{}, double(a.m) * double(a.n), {mode}});
  }
}

void Autodiff::quant_linear_backward(const Op& fwd, TensorId dy) {
  // The weight is frozen: only dx = dy dequant(W), and the bias gradient when the bias trains.
  const auto& a = std::get<QuantLinearAttrs>(fwd.attrs);
  const TensorId x = fwd.inputs[0];
  const TensorId bias = a.has_bias ? fwd.inputs.back() : kNoTensor;
  if (p_.tensor(x).requires_grad) {
    auto [dx, mode] = contribute(x);
    std::vector<TensorId> in{dy};
    in.insert(in.end(), fwd.inputs.begin() + 1, fwd.inputs.end() - (a.has_bias ? 1 : 0));
    std::vector<TensorId> ws{b_.transient(fwd.name + ".bwd.tile", p_.tensor(fwd.workspace[0]).shape,
                                          Category::temporaries)};
    // A 16-bit dx is summed over the tiles in fp32 first, then rounded once.
    if (a.compute != DType::f32)
      ws.push_back(b_.transient(fwd.name + ".bwd.dx_fp32", p_.tensor(x).shape, Category::temporaries));
    b_.emit({OpKind::quant_linear_backward, fwd.name + ".bwd_input", std::move(in), {dx}, fwd.attrs,
             2.0 * double(a.m) * double(a.n) * double(a.k) + 4.0 * double(a.n) * double(a.k), {mode}, std::move(ws)});
  }
  if (bias != kNoTensor && p_.tensor(bias).requires_grad) {
    auto [db, mode] = contribute(bias);
    b_.emit({OpKind::bias_grad, fwd.name + ".bwd_bias", {dy}, {db}, NoAttrs{}, double(a.m) * double(a.n), {mode}});
  }
}

// DoRA's rescaling, inputs [z, (m, norm) per block, (bias)]: gradients for z, the magnitudes
// and a trained bias's direct part. y = (z - b) m / norm + b with z = x W^T + b + ..., so the
// bias's gradient is dy: m / norm of it through z (the base product's bias gradient, from dz)
// and the rest, dy (1 - m / norm) in the blocks, here.
void Autodiff::dora_scale_backward(const Op& fwd, TensorId dy) {
  auto needs = [&](TensorId t) { return t != kNoTensor && p_.tensor(t).requires_grad; };
  const std::string bname = fwd.name + ".bwd";
  const auto& a = std::get<DoraScaleAttrs>(fwd.attrs);
  const TensorId z = fwd.inputs[0];
  const bool bias_trains = a.has_bias && needs(fwd.inputs.back());
  std::vector<TensorId> outs(1 + a.begins.size() + (bias_trains ? 1 : 0), kNoTensor);
  std::vector<WriteMode> modes(outs.size(), WriteMode::overwrite);
  if (needs(z)) std::tie(outs[0], modes[0]) = contribute(z);
  for (size_t i = 0; i < a.begins.size(); ++i)
    if (needs(fwd.inputs[1 + 2 * i])) std::tie(outs[1 + i], modes[1 + i]) = contribute(fwd.inputs[1 + 2 * i]);
  if (bias_trains) std::tie(outs.back(), modes.back()) = contribute(fwd.inputs.back());
  std::vector<TensorId> ins{dy};
  ins.insert(ins.end(), fwd.inputs.begin(), fwd.inputs.end());
  std::vector<std::pair<int, int>> inplace;
  if (modes[0] == WriteMode::overwrite) inplace.push_back({0, 0});
  b_.emit({OpKind::dora_scale_backward, bname, std::move(ins), std::move(outs), fwd.attrs, 4.0 * double(a.m * a.n),
           std::move(modes), {}, inplace});
}

// DoRA with dropout, inputs [y0, (m, norm, p, q) per block], outputs [y, z per block]: the
// blocks' gradients first, reading dy and z, then dy passes on as y0's gradient. p needs none
// where the layer's input needs none (the first layer's, below the frozen embedding).
void Autodiff::dora_blend_backward(const Op& fwd, TensorId dy) {
  const auto& a = std::get<DoraScaleAttrs>(fwd.attrs);
  std::vector<TensorId> outs, ins{dy};
  std::vector<WriteMode> modes;
  for (size_t i = 0; i < a.begins.size(); ++i) {
    const TensorId* block = &fwd.inputs[1 + 4 * i];  // m, norm, p, q
    for (TensorId t : {block[2], block[3], block[0]}) {
      auto [g, mode] = p_.tensor(t).requires_grad ? contribute(t) : std::pair{kNoTensor, WriteMode::overwrite};
      outs.push_back(g);
      modes.push_back(mode);
    }
    ins.insert(ins.end(), {block[0], block[1], fwd.outputs[1 + i]});
  }
  double columns = 0;
  for (int64_t w : a.widths) columns += double(w);
  b_.emit({OpKind::dora_blend_backward, fwd.name + ".bwd", std::move(ins), std::move(outs), fwd.attrs,
           5.0 * double(a.m) * columns, std::move(modes)});
  pass_through(fwd.name + ".bwd_y0", fwd.inputs[0], dy);
}

void Autodiff::add_backward(const Op& fwd, TensorId dy) {
  // add_columns (y = a, y[:, block] += d) is the same for a; d's gradient is dy's column block.
  const TensorId a = fwd.inputs[0], b = fwd.inputs[1];
  const bool columns = fwd.kind == OpKind::add_columns;
  // d(a + b)/da = d(a + b)/db = dy. The first input takes dy's buffer as its gradient when it
  // has none yet: every contribution to dy has already been made (its consumers come later
  // in forward order, so earlier in this reverse walk), and later contributions to a's
  // gradient then accumulate straight into it. The second input gets a copy, because a's
  // later contributions would otherwise change it while it is still being read.
  for (int which = 0; which < 2; ++which) {
    const TensorId x = which == 0 ? a : b;
    if (!p_.tensor(x).requires_grad) continue;
    if (which == 0 && grad(x) == kNoTensor && p_.tensor(x).category != Category::parameters) {
      grads_[x] = dy;
      continue;
    }
    auto [dx, mode] = contribute(x);
    if (columns && which == 1) {
      b_.emit({OpKind::slice_columns, fwd.name + ".bwd_d", {dy}, {dx}, fwd.attrs, double(p_.tensor(x).numel()),
               {mode}});
      continue;
    }
    b_.emit({OpKind::accumulate, fwd.name + (which == 0 ? ".bwd_a" : ".bwd_b"), {dy}, {dx}, NoAttrs{},
             double(p_.tensor(dy).numel()), {mode}});
  }
}

}  // namespace memfit
