#include "graph/recompute.hpp"

#include <algorithm>
#include <map>
#include <cmath>

#include "core/error.hpp"

namespace memfit {

int every_sqrt(int64_t n_layer) { return std::max(1, int(std::lround(std::sqrt(double(n_layer))))); }

std::vector<BlockRecompute> resolve_recompute(const RecomputePolicy& r, int64_t n_layer) {
  std::vector<BlockRecompute> blocks(static_cast<size_t>(n_layer));
  switch (r.mode) {
    case RecomputeMode::none: break;
    case RecomputeMode::full:
      for (BlockRecompute& b : blocks) b.whole = true;
      break;
    case RecomputeMode::every: {
      const int k = r.every > 0 ? r.every : every_sqrt(n_layer);
      for (size_t l = 0; l < blocks.size(); ++l) {
        blocks[l].whole = true;
        blocks[l].keep_input = l % size_t(k) == 0;
      }
      break;
    }
    case RecomputeMode::selective: {
      MEMFIT_CHECK(!r.ops.empty(), "policy", "selective recomputation names no op");
      BlockRecompute b;
      for (const std::string& op : r.ops) {
        if (op == "attention") b.attention = true;
        else if (op == "mlp_activation" || op == "gelu") b.mlp_activation = true;
        else if (op == "norms" || op == "layernorm") b.norms = true;
        else
          throw Error("policy", fmt::format("unknown op '{}' for selective recomputation (expected attention, "
                                            "mlp_activation (gelu) or norms)", op));
      }
      std::fill(blocks.begin(), blocks.end(), b);
      break;
    }
    case RecomputeMode::automatic:
      MEMFIT_CHECK(r.blocks.size() == blocks.size(), "policy",
                   "recompute auto is chosen against a memory budget before the program is built (memfit train and "
                   "memfit plan do it, with --memory-budget); this policy carries no choice for its {} blocks",
                   n_layer);
      return r.blocks;
  }
  return blocks;
}

namespace {

constexpr int kNotBoundary = -2;

class Recomputer {
 public:
  Recomputer(const Program& p, const std::vector<BlockRecompute>& blocks)
      : p_(p), blocks_(blocks), producer_(p.tensors().size(), -1), boundary_(p.tensors().size(), kNotBoundary),
        replayed_(p.tensors().size(), kNoTensor) {}

  Program run() {
    for (const TensorDesc& t : p_.tensors()) {
      if (!t.is_view()) {
        q_.add_tensor(t);
        continue;
      }
      const TensorId id = q_.add_view(t.view_of, t.name, t.shape, t.dtype, t.view_offset);
      q_.tensor(id) = t;
    }
    q_.params() = p_.params();
    const Section* micro = p_.find_section(SectionKind::micro);
    std::vector<int> first_backward(blocks_.size(), -1);
    if (micro) {
      index_forward(*micro);
      for (int i = micro->begin; i < micro->end; ++i) {
        const Op& op = p_.op(i);
        if (op.phase == Phase::backward && op.layer >= 0 && first_backward[size_t(op.layer)] < 0)
          first_backward[size_t(op.layer)] = i;
      }
    }
    for (const Section& s : p_.sections()) {
      q_.begin_section(s.kind, s.repeat);
      const bool is_micro = micro && s.begin == micro->begin && s.end == micro->end;
      for (int i = s.begin; i < s.end; ++i) {
        Op op = p_.op(i);
        if (is_micro && op.phase == Phase::backward) {
          // A block recomputed whole is re-run before its first backward op, while its input
          // gradient is the only large gradient alive; selected ops just before their consumer.
          if (op.layer >= 0 && blocks_[size_t(op.layer)].whole && i == first_backward[size_t(op.layer)])
            for (int j = i; j < micro->end && p_.op(j).layer == op.layer; ++j)
              for (TensorId in : p_.op(j).inputs) ensure(in);
          for (TensorId& in : op.inputs) in = ensure(in);
        }
        q_.add_op(std::move(op));
      }
      q_.end_section();
    }
    return std::move(q_);
  }

 private:
  void index_forward(const Section& micro) {
    for (int i = micro.begin; i < micro.end; ++i) {
      const Op& op = p_.op(i);
      if (op.phase != Phase::forward) continue;
      for (size_t j = 0; j < op.outputs.size(); ++j) {
        const TensorId t = op.outputs[j];
        if (t == kNoTensor) continue;
        if (producer_[size_t(t)] >= 0 && op.modes.size() > j && op.modes[j] == WriteMode::update)
          updates_[t].push_back(i);
        else
          producer_[size_t(t)] = i;
      }
    }
    // The residual stream leaving a block is read by the forward ops of the next block (or
    // by ln_f, outside every block: layer -1).
    for (int i = micro.begin; i < micro.end; ++i) {
      const Op& op = p_.op(i);
      if (op.phase != Phase::forward) continue;
      for (TensorId t : op.inputs) {
        const int prod = producer_[size_t(t)];
        if (prod >= 0 && p_.op(prod).layer >= 0 && p_.op(prod).layer != op.layer) boundary_[size_t(t)] = op.layer;
      }
    }
  }

  bool keep(TensorId t) const {
    const int prod = producer_[size_t(t)];
    if (prod < 0) return true;  // parameters, gradients, inputs: not forward activations
    const Op& f = p_.op(prod);
    if (f.layer < 0) return true;  // outside the blocks: embedding, ln_f
    const int next = boundary_[size_t(t)];
    if (next != kNotBoundary) return next < 0 || blocks_[size_t(next)].keep_input;
    const BlockRecompute& b = blocks_[size_t(f.layer)];
    if (b.whole) return false;
    const size_t out = size_t(std::find(f.outputs.begin(), f.outputs.end(), t) - f.outputs.begin());
    switch (f.kind) {
      case OpKind::attention_forward: return !(b.attention && out == 1);  // probs; y feeds the projection
      case OpKind::gelu_forward:
      case OpKind::swiglu_forward: return !b.mlp_activation;
      case OpKind::layernorm_forward:
      case OpKind::rmsnorm_forward: return !(b.norms && out == 0);  // y; mean and rstd are N floats
      // Sequence parallelism's gathered rows (the only gathers inside a forward block): the
      // backward gathers them again from the kept row shard, as Megatron-LM does.
      case OpKind::all_gather: return false;
      default: return true;
    }
  }

  // The tensor the backward reads in place of `t`: itself when kept, else its re-emission.
  TensorId ensure(TensorId t) {
    if (t == kNoTensor || keep(t)) return t;
    if (replayed_[size_t(t)] == kNoTensor) replay(producer_[size_t(t)]);
    MEMFIT_ASSERT(replayed_[size_t(t)] != kNoTensor, "replaying op {} did not produce {}", producer_[size_t(t)],
                  p_.tensor(t).name);
    return replayed_[size_t(t)];
  }

  void replay(int index) {
    Op r = p_.op(index);
    r.phase = Phase::recompute;
    r.name += ".rec";
    r.replays = index;
    for (TensorId& in : r.inputs) in = ensure(in);  // emits the producers of non-kept inputs first
    for (size_t j = 0; j < r.outputs.size(); ++j) {
      TensorId& out = r.outputs[j];
      if (out == kNoTensor) continue;
      if (r.modes.size() > j && r.modes[j] == WriteMode::update && replayed_[size_t(out)] != kNoTensor) {
        out = replayed_[size_t(out)];  // a later writer (LoRA's adapter adding into y) updates the copy
        continue;
      }
      if (keep(out) && skippable(r, j)) {
        out = kNoTensor;
        continue;
      }
      const TensorId copy = fresh_copy(out);
      if (!keep(out)) replayed_[size_t(out)] = copy;
      out = copy;  // a kept sibling output is written to a copy that nothing reads
    }
    for (TensorId& w : r.workspace)
      if (p_.tensor(w).lifetime == Lifetime::transient) w = fresh_copy(w);
    const std::vector<TensorId> written = p_.op(index).outputs;
    q_.add_op(std::move(r));
    // The ops that update a re-emitted output in place follow it, in their forward order.
    for (TensorId t : written)
      if (t != kNoTensor && producer_[size_t(t)] == index && replayed_[size_t(t)] != kNoTensor)
        if (const auto u = updates_.find(t); u != updates_.end())
          for (int later : u->second) replay(later);
  }

  // A kept sibling output the kernel can leave out: the plain attention's y when only its
  // probabilities are recomputed (saves the probs x V product and a B*T*C buffer).
  static bool skippable(Op& r, size_t output) {
    if (r.kind != OpKind::attention_forward || output != 0) return false;
    const auto& a = std::get<AttentionAttrs>(r.attrs);
    r.flops -= 2.0 * double(a.batch * a.heads) * double(a.seq * a.seq) * double(a.head_dim);
    return true;
  }

  TensorId fresh_copy(TensorId t) {
    TensorDesc d = p_.tensor(t);
    MEMFIT_ASSERT(!d.is_view(), "recomputing into a view ({}) is not supported", d.name);
    d.name += ".rec";
    d.category = Category::temporaries;
    d.lifetime = Lifetime::transient;
    return q_.add_tensor(std::move(d));
  }

  const Program& p_;
  const std::vector<BlockRecompute>& blocks_;
  Program q_;
  std::vector<int> producer_;         // forward op of the micro section writing each tensor (first)
  std::map<TensorId, std::vector<int>> updates_;  // forward ops updating it in place after that, in order
  std::vector<int> boundary_;         // residual stream: layer of the block reading it (-1: none)
  std::vector<TensorId> replayed_;    // non-kept tensor -> its re-emitted copy
};

}  // namespace

Program apply_recompute(const Program& program, const std::vector<BlockRecompute>& blocks) {
  for (const Op& op : program.ops())
    MEMFIT_ASSERT(op.layer < int(blocks.size()), "op {} of layer {} but {} blocks to recompute", op.name, op.layer,
                  blocks.size());
  return Recomputer(program, blocks).run();
}

double recompute_flops(const Program& program) {
  double flops = 0;
  for (const Op& op : program.ops())
    if (op.phase == Phase::recompute) flops += op.flops;
  return flops;
}

}  // namespace memfit
