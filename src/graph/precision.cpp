// The precision pass (see precision.hpp). Dtypes are decided per tensor, from its category
// and from the op slots that op.hpp declares "fp32 always"; islands are then inserted op by
// op into a fresh op list, each cast in its op's section, phase and layer.
#include "graph/precision.hpp"

#include <map>
#include <set>

#include "core/error.hpp"

namespace memfit {

namespace {

// Slots whose tensors are fp32 under every policy: statistics, losses, flags, and every
// float workspace (softmax and logits buffers, which is where "softmax and the loss run in
// fp32" lives).
void mark_fp32_slots(const Op& op, std::vector<char>& fp32) {
  auto mark = [&](TensorId id) {
    if (id != kNoTensor) fp32[size_t(id)] = 1;
  };
  const bool quant = op.kind == OpKind::quant_linear || op.kind == OpKind::quant_linear_backward;
  // A quantised product's tile holds dequantised weights in the compute dtype.
  for (size_t j = quant ? 1 : 0; j < op.workspace.size(); ++j) mark(op.workspace[j]);
  switch (op.kind) {
    case OpKind::quant_linear:
    case OpKind::quant_linear_backward: {
      // The block scales, second-level scales and offsets (fp32 when they are floats).
      const auto& a = std::get<QuantLinearAttrs>(op.attrs);
      for (size_t j = 2; j < (a.spec.double_quant ? 5u : 3u); ++j) mark(op.inputs[j]);
      break;
    }
    case OpKind::layernorm_forward:
      mark(op.outputs[1]);
      mark(op.outputs[2]);
      break;
    case OpKind::rmsnorm_forward: mark(op.outputs[1]); break;
    case OpKind::dora_norm: {
      mark(op.outputs[0]);
      const auto& a = std::get<DoraNormAttrs>(op.attrs);  // a quantised W's scales, as quant_linear's
      if (a.quantized)
        for (size_t j = 1; j < (a.spec.double_quant ? 4u : 2u); ++j) mark(op.inputs[j]);
      break;
    }
    case OpKind::flash_attention_forward:
      if (op.outputs.size() > 1) mark(op.outputs[1]);
      break;
    case OpKind::classifier:
    case OpKind::classifier_eval:
    case OpKind::classifier_partial: mark(op.outputs[0]); break;  // losses; the partial's stats
    case OpKind::classifier_combine:
      mark(op.inputs[0]);
      for (TensorId id : op.outputs) mark(id);  // losses and lse
      break;
    case OpKind::classifier_parallel_backward: mark(op.inputs[3]); break;  // lse

    case OpKind::loss_mean:
      mark(op.inputs[0]);
      mark(op.outputs[0]);
      break;
    case OpKind::check_finite:
    case OpKind::grad_norm:
      for (TensorId id : op.outputs) mark(id);
      break;
    default: break;
  }
}

bool matches(const std::string& pattern, const Op& op) {
  if (pattern == op_kind_name(op.kind) || pattern == op.name) return true;
  return pattern.size() > 1 && pattern.back() == '*' && op.name.starts_with(pattern.substr(0, pattern.size() - 1));
}

// Kinds whose kernels take tensors of any float dtype as they are (their arithmetic is fp32
// either way): they never need an island.
bool dtype_agnostic(OpKind kind) {
  // Collectives: the communicator moves and sums 16-bit elements itself (tensor parallelism's
  // forward and backward sums run before this pass).
  return kind == OpKind::cast || kind == OpKind::check_finite || kind == OpKind::load_input || is_collective_kind(kind);
}

// A quantised product that becomes an island computes in fp32: its tile turns fp32. The weight
// keeps its dtype (the weight was rounded to it before quantising; the kernel rounds the
// dequantised tile to it too). A 16-bit input gradient's fp32 dx workspace becomes the island's
// fp32 dx; it is returned (kNoTensor for other ops).
TensorId quant_product_in_fp32(Program& p, Op& op) {
  if (op.kind != OpKind::quant_linear && op.kind != OpKind::quant_linear_backward) return kNoTensor;
  auto& a = std::get<QuantLinearAttrs>(op.attrs);
  TensorId dx32 = kNoTensor;
  if (op.kind == OpKind::quant_linear_backward && a.compute != DType::f32) {
    MEMFIT_ASSERT(op.workspace.size() >= 2, "op {}: a 16-bit input gradient without its fp32 dx", op.name);
    dx32 = op.workspace[1];
    op.workspace.erase(op.workspace.begin() + 1);
  }
  a.compute = DType::f32;
  p.tensor(op.workspace[0]).dtype = DType::f32;
  return dx32;
}

class IslandBuilder {
 public:
  IslandBuilder(Program& p) : p_(p) {}

  // Appends `op` (and its casts) to the new op list; an island's fp32 copy of output 0 is
  // `wide_out0` where one is given.
  void add(Op op, int section, bool island, TensorId wide_out0 = kNoTensor) {
    if (!island) return push(std::move(op), section);
    std::map<TensorId, TensorId> wide;  // 16-bit tensor -> its fp32 temporary
    auto widened = [&](TensorId id, const std::string& what) {
      auto it = wide.find(id);
      if (it != wide.end()) return it->second;
      const TensorDesc& t = p_.tensor(id);
      TensorDesc d;
      d.name = op.name + "." + what + ".fp32";
      d.shape = t.shape;
      d.dtype = DType::f32;
      d.category = Category::temporaries;
      d.layer = op.layer;
      const TensorId w = p_.add_tensor(std::move(d));
      wide[id] = w;
      return w;
    };
    auto is16 = [&](TensorId id) { return id != kNoTensor && dtype_bits(p_.tensor(id).dtype) == 16; };
    std::vector<Op> after;
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      const TensorId x = op.inputs[j];
      if (!is16(x) || wide.count(x)) {
        if (wide.count(x)) op.inputs[j] = wide[x];
        continue;
      }
      const TensorId w = widened(x, "in" + std::to_string(j));
      push(cast_op(op, op.name + ".cast_in" + std::to_string(j), x, w, WriteMode::overwrite), section);
      op.inputs[j] = w;
    }
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      const TensorId y = op.outputs[j];
      if (!is16(y)) continue;
      const WriteMode mode = op.modes[j];
      const bool seen = wide.count(y) > 0;
      const bool given = j == 0 && wide_out0 != kNoTensor && !seen;
      const TensorId w = given ? (wide[y] = wide_out0) : widened(y, "out" + std::to_string(j));
      if (mode == WriteMode::update && !seen)  // read-modify-write: the fp32 copy starts from y
        push(cast_op(op, op.name + ".cast_state" + std::to_string(j), y, w, WriteMode::overwrite), section);
      op.outputs[j] = w;
      // The op fills its fp32 output afresh; the narrowing cast applies the original mode.
      op.modes[j] = mode == WriteMode::update ? WriteMode::update : WriteMode::overwrite;
      const WriteMode store = mode == WriteMode::update ? WriteMode::overwrite : mode;
      after.push_back(cast_op(op, op.name + ".cast_out" + std::to_string(j), w, y, store));
    }
    push(std::move(op), section);
    for (Op& c : after) push(std::move(c), section);
  }

  std::vector<Op> ops;
  std::vector<int> section_of;
  std::vector<int> new_index;  // old op index -> new

 private:
  Op cast_op(const Op& around, std::string name, TensorId from, TensorId to, WriteMode mode) {
    Op c;
    c.kind = OpKind::cast;
    c.phase = around.phase;
    c.layer = around.layer;
    c.name = std::move(name);
    c.inputs = {from};
    c.outputs = {to};
    c.modes = {mode};
    c.flops = double(p_.tensor(to).numel());
    return c;
  }
  void push(Op op, int section) {
    ops.push_back(std::move(op));
    section_of.push_back(section);
  }
  Program& p_;
};

}  // namespace

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
  }
  return DType::f32;
}

void check_precision_policy(const Policy& p) {
  const DType cdt = compute_dtype(p.precision);
  MEMFIT_CHECK(p.grad_dtype == DType::f32 || p.grad_dtype == cdt, "policy",
               "gradient dtype {} with precision {}: gradients are fp32 or the compute dtype ({})",
               dtype_name(p.grad_dtype), precision_name(p.precision), dtype_name(cdt));
  MEMFIT_CHECK(p.fp32_ops.empty() || cdt != DType::f32, "policy",
               "fp32 ops ({}) need a 16-bit precision (bf16 or fp16)", fmt::join(p.fp32_ops, ","));
}

void declare_master_weights(GraphBuilder& b, const Policy& policy) {
  const DType cdt = compute_dtype(policy.precision);
  if (cdt == DType::f32) return;
  Program& p = b.program();
  for (ParamEntry& e : p.params()) {
    if (e.value == kNoTensor) continue;  // stored quantised: its storage keeps its own dtypes
    TensorDesc& t = p.tensor(e.value);
    t.dtype = cdt;
    if (!e.trainable) continue;
    b.set_layer(t.layer);
    e.master = b.persistent("master." + e.name, t.shape, Category::master_weights, DType::f32);
  }
  b.set_layer(-1);
}

void emit_overflow_check(GraphBuilder& b, const Policy& policy) {
  if (policy.precision != Precision::fp16) return;
  Program& p = b.program();
  std::vector<TensorId> grads;
  double elements = 0;
  for (const ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    MEMFIT_ASSERT(e.grad != kNoTensor, "parameter {} received no gradient", e.name);
    grads.push_back(e.grad);
    elements += double(p.tensor(e.grad).numel());
  }
  b.set_layer(-1);
  const Phase saved = b.phase();
  b.set_phase(Phase::backward);
  const TensorId flag = b.persistent(kOverflowFlag, Shape{1}, Category::activations);
  b.emit({OpKind::check_finite, "check_finite", grads, {flag}, NoAttrs{}, elements});
  b.set_phase(saved);
}

void apply_precision(Program& p, const Policy& policy, const OpCapabilities& backend) {
  const DType cdt = compute_dtype(policy.precision);
  if (cdt == DType::f32) return;
  MEMFIT_CHECK(backend.known(), "policy",
               "{} precision needs the op capabilities of the backend that will run the program (none given)",
               precision_name(policy.precision));

  // 1. Dtypes.
  std::vector<char> fp32(p.tensors().size(), 0);
  for (const Op& op : p.ops()) mark_fp32_slots(op, fp32);
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    TensorDesc& t = p.tensor(TensorId(id));
    if (!dtype_is_float(t.dtype) || t.is_view()) continue;
    switch (t.category) {
      case Category::parameters: t.dtype = fp32[id] ? DType::f32 : cdt; break;
      case Category::gradients: t.dtype = policy.grad_dtype; break;
      case Category::activations:
      case Category::temporaries: t.dtype = fp32[id] ? DType::f32 : cdt; break;
      default: break;  // master weights, optimizer state, buffers: as declared
    }
  }

  // 2. Islands.
  std::vector<char> used(policy.fp32_ops.size(), 0);
  IslandBuilder islands(p);
  const std::vector<Op> old = p.ops();
  islands.new_index.resize(old.size());
  for (size_t i = 0; i < old.size(); ++i) {
    const Op& op = old[i];
    bool pinned = false;
    for (size_t k = 0; k < policy.fp32_ops.size(); ++k)
      if (matches(policy.fp32_ops[k], op)) pinned = true, used[k] = 1;
    bool touches16 = false;
    for (const auto* list : {&op.inputs, &op.outputs})
      for (TensorId id : *list)
        if (id != kNoTensor && dtype_bits(p.tensor(id).dtype) == 16) touches16 = true;
    const bool island = touches16 && !dtype_agnostic(op.kind) && (pinned || !backend.supports(op.kind, cdt));
    // A pinned op keeps its index for Op::replays; its casts come around it.
    Op moved = op;
    const TensorId dx32 = island ? quant_product_in_fp32(p, moved) : kNoTensor;
    islands.add(std::move(moved), p.section_of_op(int(i)), island, dx32);
    size_t at = islands.ops.size() - 1;
    while (islands.ops[at].name != op.name) --at;
    islands.new_index[i] = int(at);
  }
  for (size_t k = 0; k < used.size(); ++k)
    MEMFIT_CHECK(used[k], "policy", "fp32 op '{}' matches no op kind, op name or name prefix of the program",
                 policy.fp32_ops[k]);
  for (Op& op : islands.ops)
    if (op.replays >= 0) op.replays = islands.new_index[size_t(op.replays)];
  p.replace_ops(std::move(islands.ops), islands.section_of);
}

}  // namespace memfit
