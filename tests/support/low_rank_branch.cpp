#include "support/low_rank_branch.hpp"

#include "core/error.hpp"

namespace memfit::test {

namespace {

std::string with_infix(const std::string& weight, const char* infix) {
  const std::string suffix = ".weight";
  MEMFIT_ASSERT(weight.size() > suffix.size() && weight.ends_with(suffix), "{} is not a weight", weight);
  return weight.substr(0, weight.size() - suffix.size()) + infix + suffix;
}

}  // namespace

std::string LowRankBranch::a_name(const std::string& weight) { return with_infix(weight, ".lora_A"); }
std::string LowRankBranch::b_name(const std::string& weight) { return with_infix(weight, ".lora_B"); }

void LowRankBranch::declare(GraphBuilder& b) {
  adapters_.clear();
  Program& p = b.program();
  std::vector<size_t> targets;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    for (const std::string& pattern : patterns_)
      if (parameter_name_matches(pattern, e.name) && p.tensor(e.value).shape.rank() == 2) {
        targets.push_back(i);
        break;
      }
  }
  MEMFIT_CHECK(!targets.empty(), "test", "no weight matches the low-rank targets");
  for (size_t i : targets) {
    // Copies: declaring parameters grows params() and the tensor table.
    const std::string name = p.params()[i].name;
    const TensorId w = p.params()[i].value;
    const Shape ws = p.tensor(w).shape;  // [out, in]
    if (p.params()[i].trainable) freeze_parameter(p, p.params()[i]);
    const std::string bias_name = name.substr(0, name.size() - 6) + "bias";
    for (ParamEntry& e : p.params())
      if (e.name == bias_name && e.trainable) freeze_parameter(p, e);
    b.set_layer(p.tensor(w).layer);
    Adapter ad;
    ad.a = b.parameter(a_name(name), Shape{rank_, ws[1]}, ParamInit::normal, 0.02f, true);
    ad.b = b.parameter(b_name(name), Shape{ws[0], rank_}, ParamInit::zeros, 0.0f, true);
    adapters_[w] = ad;
  }
}

bool LowRankBranch::rewrite(const Op& op, GraphBuilder& b) {
  if (op.kind != OpKind::matmul || op.inputs.size() < 2) return false;
  const auto it = adapters_.find(op.inputs[1]);
  if (it == adapters_.end()) return false;
  Program& p = b.program();
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  MEMFIT_ASSERT(a.trans_b && !a.trans_a, "linear {} is not x @ W^T", op.name);
  const TensorId x = op.inputs[0], y = op.outputs[0];
  const Shape ys = p.tensor(y).shape;
  std::vector<int64_t> mid = ys.dims();
  mid.back() = rank_;
  // y = base + branch; the base product keeps the op's name (so --fp32-ops and recompute
  // selections by name still find it).
  const TensorId base = b.transient(op.name + ".base.y", ys, Category::activations);
  b.emit({OpKind::matmul, op.name, op.inputs, {base}, op.attrs, op.flops});
  const TensorId xa = b.transient(op.name + ".lora_A.y", Shape(mid), Category::activations);
  b.emit({OpKind::matmul, op.name + ".lora_A", {x, it->second.a}, {xa}, MatmulAttrs{a.m, rank_, a.k, false, true, 1.0f},
          2.0 * double(a.m) * double(rank_) * double(a.k)});
  const TensorId branch = b.transient(op.name + ".lora_B.y", ys, Category::activations);
  b.emit({OpKind::matmul, op.name + ".lora_B", {xa, it->second.b}, {branch},
          MatmulAttrs{a.m, a.n, rank_, false, true, scale_}, 2.0 * double(a.m) * double(a.n) * double(rank_)});
  b.emit({OpKind::add, op.name + ".lora_add", {base, branch}, {y}, NoAttrs{}, double(ys.numel()), {}, {},
          {{0, 0}, {0, 1}}});
  return true;
}

}  // namespace memfit::test
