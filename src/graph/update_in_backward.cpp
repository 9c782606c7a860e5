#include "graph/update_in_backward.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"

namespace memfit {

std::string update_in_backward_refusal(const Policy& p) {
  if (p.grad_accum != 1) return fmt::format("one micro-step per optimizer step (got --grad-accum {})", p.grad_accum);
  if (p.grad_clip > 0) return "no gradient clipping: the global norm is known only after the last gradient";
  if (p.precision == Precision::fp16)
    return "bf16 or fp32: fp16's loss scaling must skip a whole step on overflow, after every gradient";
  return "";
}

void check_update_in_backward(const Policy& p) {
  if (!p.update_in_backward) return;
  const std::string why = update_in_backward_refusal(p);
  if (!why.empty()) throw Error("policy", "the optimizer in backward (--optimizer-in-backward) needs " + why);
}

namespace {

// A grouped update op without its per-parameter lists (inputs, outputs, modes, weight decays):
// the template every single-parameter copy starts from. Copying the whole group once per
// parameter made this pass quadratic in the layer count (3,000 layers took over 24 GB).
Op update_template(const Op& group) {
  Op t = group;
  t.inputs.clear();
  t.outputs.clear();
  t.modes.clear();
  std::get<AdamWAttrs>(t.attrs).weight_decay.clear();
  return t;
}

// One single-parameter copy of a grouped update op: [grad] -> [target, state roles...];
// group_elements: the elements of all its gradients (its FLOPs are shared in proportion).
Op single_update(const Program& p, const Op& group, const Op& templ, size_t i, double group_elements) {
  const size_t n = group.outputs.size() / (group.kind == OpKind::adamw8bit ? 5 : 3);
  const size_t roles = group.outputs.size() / n;
  Op op = templ;
  op.inputs = {group.inputs[i]};
  for (size_t r = 0; r < roles; ++r) {
    op.outputs.push_back(group.outputs[i + r * n]);
    op.modes.push_back(group.modes[i + r * n]);
  }
  const AdamWAttrs& g = std::get<AdamWAttrs>(group.attrs);
  MEMFIT_ASSERT(g.max_grad_norm <= 0, "update op '{}' clips", group.name);
  std::get<AdamWAttrs>(op.attrs).weight_decay = {g.weight_decay.empty() ? 0.0f : g.weight_decay[i]};
  op.name = group.name + "." + p.tensor(group.outputs[i]).name;
  op.flops = group.flops * double(p.tensor(group.inputs[i]).numel()) / std::max(1.0, group_elements);
  return op;
}

}  // namespace

void apply_update_in_backward(Program& p) {
  const Section* micro = p.find_section(SectionKind::micro);
  const Section* opt = p.find_section(SectionKind::optimizer);
  MEMFIT_ASSERT(micro && opt && micro->repeat == 1, "optimizer in backward needs one micro-step and an optimizer section");
  const int micro_index = int(micro - p.sections().data()), opt_index = int(opt - p.sections().data());

  // The ops to place, by the tensors whose last use they must follow.
  struct Placed {
    Op op;
    std::vector<TensorId> after;  // roots
  };
  std::vector<Placed> moved;
  std::map<TensorId, size_t> update_of_target;  // root of the update's target -> index in moved
  std::map<TensorId, TensorId> value_of_grad;    // roots: gradient -> parameter value
  for (const ParamEntry& e : p.params())
    if (e.grad != kNoTensor) value_of_grad[p.root_of(e.grad)] = p.root_of(e.value);
  for (int i = opt->begin; i < opt->end; ++i) {
    const Op& op = p.op(i);
    if (op.kind == OpKind::adamw || op.kind == OpKind::adamw8bit) {
      double elements = 0;
      for (TensorId g : op.inputs) elements += double(p.tensor(g).numel());
      const Op templ = update_template(op);
      for (size_t g = 0; g < op.inputs.size(); ++g) {
        Op single = single_update(p, op, templ, g, elements);
        const TensorId grad = p.root_of(single.inputs[0]), target = p.root_of(single.outputs[0]);
        std::vector<TensorId> after{grad, target};
        if (auto v = value_of_grad.find(grad); v != value_of_grad.end()) after.push_back(v->second);
        update_of_target[target] = moved.size();
        moved.push_back({std::move(single), std::move(after)});
      }
    } else if (op.kind == OpKind::cast) {
      // The narrowing of an updated master into its parameter: right after that update.
      const auto it = update_of_target.find(p.root_of(op.inputs[0]));
      MEMFIT_ASSERT(it != update_of_target.end(), "cast '{}' in the optimizer section follows no update", op.name);
      moved.push_back({op, moved[it->second].after});
    } else {
      throw Error("policy", fmt::format("the optimizer in backward cannot move optimizer op '{}' ({})", op.name,
                                        op_kind_name(op.kind)));
    }
  }

  // Last op of the micro-step touching each root.
  std::map<TensorId, int> last_use;
  for (int i = micro->begin; i < micro->end; ++i) {
    const Op& op = p.op(i);
    for (const auto* list : {&op.inputs, &op.outputs, &op.workspace})
      for (TensorId id : *list)
        if (id != kNoTensor) last_use[p.root_of(id)] = i;
  }
  std::vector<std::vector<Op>> after_op(size_t(micro->end - micro->begin));
  for (Placed& m : moved) {
    int at = micro->begin;
    for (TensorId t : m.after)
      if (auto it = last_use.find(t); it != last_use.end()) at = std::max(at, it->second);
    m.op.phase = Phase::optimizer;
    after_op[size_t(at - micro->begin)].push_back(std::move(m.op));
  }

  std::vector<Op> ops;
  std::vector<int> section_of, new_index(p.ops().size(), -1);
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const int s = p.section_of_op(i);
    if (s == opt_index) continue;
    new_index[size_t(i)] = int(ops.size());
    ops.push_back(p.op(i));
    section_of.push_back(s);
    if (s == micro_index)
      for (Op& m : after_op[size_t(i - micro->begin)]) {
        ops.push_back(std::move(m));
        section_of.push_back(micro_index);
      }
  }
  for (Op& op : ops)
    if (op.replays >= 0) op.replays = new_index[size_t(op.replays)];
  p.replace_ops(std::move(ops), section_of);
}

}  // namespace memfit
