#include "graph/program.hpp"

#include <array>
#include <iterator>

#include <unordered_set>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"

namespace memfit {

namespace {

// One tensor larger than a whole tier can never be planned; refusing it here names it (and
// keeps every byte count the planner adds up far from 2^64).
void check_tensor_bytes(const TensorDesc& t) {
  uint64_t bytes = 0;
  try {
    bytes = t.bytes();
  } catch (const Error&) {
    bytes = UINT64_MAX;  // more than 2^64 bits: over the bound below either way
  }
  MEMFIT_CHECK(bytes <= kMaxTierBytes, "graph",
               "tensor '{}' {} {} needs {} bytes, more than one memory tier may hold ({})", t.name, dtype_name(t.dtype),
               t.shape.to_string(), bytes == UINT64_MAX ? std::string("over 2^64") : std::to_string(bytes),
               format_bytes(kMaxTierBytes));
}

}  // namespace

TensorId Program::add_tensor(TensorDesc desc) {
  MEMFIT_ASSERT(desc.view_of == kNoTensor, "use add_view for views ({})", desc.name);
  check_tensor_bytes(desc);
  tensors_.push_back(std::move(desc));
  return TensorId(tensors_.size() - 1);
}

TensorId Program::add_view(TensorId base, std::string name, Shape shape, DType dtype, uint64_t offset) {
  const TensorId root = root_of(base);
  const TensorDesc& b = tensor(base);
  TensorDesc v = b;
  v.name = std::move(name);
  v.shape = std::move(shape);
  v.dtype = dtype;
  v.view_of = root;
  v.view_offset = (b.is_view() ? b.view_offset : 0) + offset;
  MEMFIT_ASSERT(v.view_offset + v.bytes() <= tensor(root).bytes(), "view {} exceeds its root {}",
                v.name, tensor(root).name);
  tensors_.push_back(std::move(v));
  return TensorId(tensors_.size() - 1);
}

int Program::add_op(Op op) {
  if (op.modes.empty()) op.modes.assign(op.outputs.size(), WriteMode::overwrite);
  MEMFIT_ASSERT(op.modes.size() == op.outputs.size(), "op {}: {} modes for {} outputs", op.name,
                op.modes.size(), op.outputs.size());
  assign_queue(op);
  ops_.push_back(std::move(op));
  return int(ops_.size() - 1);
}

std::string_view section_name(SectionKind kind) {
  switch (kind) {
    case SectionKind::micro: return "micro";
    case SectionKind::sync: return "sync";
    case SectionKind::optimizer: return "optimizer";
    case SectionKind::eval: return "eval";
    case SectionKind::generate: return "generate";
  }
  return "?";
}

int Section::runs_per_step() const {
  switch (kind) {
    case SectionKind::micro: return repeat;
    case SectionKind::sync:
    case SectionKind::optimizer: return 1;
    case SectionKind::eval:
    case SectionKind::generate: return 0;
  }
  return 0;
}

void Program::begin_section(SectionKind kind, int repeat) {
  MEMFIT_ASSERT(!section_open_, "section {} opened inside another", section_name(kind));
  MEMFIT_ASSERT(repeat >= 1, "section {} repeats {} times", section_name(kind), repeat);
  sections_.push_back(Section{kind, int(ops_.size()), int(ops_.size()), repeat});
  section_open_ = true;
}

void Program::end_section() {
  MEMFIT_ASSERT(section_open_, "end_section without begin_section");
  sections_.back().end = int(ops_.size());
  section_open_ = false;
}

std::vector<Op> Program::take_ops_from(int begin) {
  MEMFIT_ASSERT(section_open_ && begin >= sections_.back().begin && begin <= int(ops_.size()),
                "take_ops_from({}) outside the open section", begin);
  std::vector<Op> taken(std::make_move_iterator(ops_.begin() + begin), std::make_move_iterator(ops_.end()));
  ops_.resize(size_t(begin));
  return taken;
}

void Program::replace_ops(std::vector<Op> ops, const std::vector<int>& section_of) {
  MEMFIT_ASSERT(!section_open_ && ops.size() == section_of.size(), "replace_ops: {} ops, {} section indices",
                ops.size(), section_of.size());
  int previous = 0;
  for (Section& s : sections_) s.begin = s.end = -1;
  for (size_t i = 0; i < ops.size(); ++i) {
    const int s = section_of[i];
    MEMFIT_ASSERT(s >= previous && s < int(sections_.size()), "replace_ops: op {} out of section order", ops[i].name);
    if (sections_[size_t(s)].begin < 0) sections_[size_t(s)].begin = int(i);
    sections_[size_t(s)].end = int(i) + 1;
    previous = s;
  }
  // Empty sections keep their place between their neighbours.
  int at = 0;
  for (Section& s : sections_) {
    if (s.begin < 0) s.begin = s.end = at;
    at = s.end;
  }
  for (Op& op : ops) assign_queue(op);
  ops_ = std::move(ops);
}

void Program::assign_queue(Op& op) const {
  if (op.queue != Queue::compute || op.kind == OpKind::wait) return;
  // A transfer goes outward when its destination is a slower tier (device < host < disk).
  const bool outward = op.kind != OpKind::transfer || op.inputs.empty() || op.outputs.empty() ||
                       tensor(op.outputs[0]).tier > tensor(op.inputs[0]).tier;
  op.queue = default_queue(op.kind, outward);
}

const TensorDesc& Program::tensor(TensorId id) const {
  MEMFIT_ASSERT(id >= 0 && size_t(id) < tensors_.size(), "tensor id {} out of range", id);
  return tensors_[size_t(id)];
}

TensorDesc& Program::tensor(TensorId id) {
  MEMFIT_ASSERT(id >= 0 && size_t(id) < tensors_.size(), "tensor id {} out of range", id);
  return tensors_[size_t(id)];
}

TensorId Program::root_of(TensorId id) const {
  const TensorDesc& t = tensor(id);
  return t.is_view() ? t.view_of : id;
}

TensorId Program::find_tensor(std::string_view name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return TensorId(i);
  return kNoTensor;
}

const ParamEntry* Program::find_param(std::string_view name) const {
  for (const ParamEntry& e : params_)
    if (e.name == name) return &e;
  return nullptr;
}

const Section* Program::find_section(SectionKind kind) const {
  for (const Section& s : sections_)
    if (s.kind == kind) return &s;
  return nullptr;
}

int Program::section_of_op(int op_index) const {
  for (size_t i = 0; i < sections_.size(); ++i)
    if (op_index >= sections_[i].begin && op_index < sections_[i].end) return int(i);
  return -1;
}

std::string_view param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::value: return "value";
    case ParamRole::codes: return "codes";
    case ParamRole::scales: return "scales";
    case ParamRole::scales2: return "scales2";
    case ParamRole::offset: return "offset";
  }
  return "?";
}

TensorId ParamEntry::stored(ParamRole role) const {
  for (const StoredTensor& s : storage)
    if (s.role == role) return s.id;
  return kNoTensor;
}

int64_t Program::param_numel(const ParamEntry& e) const {
  // Quantised codes keep the parameter's logical shape (nf4 and int8 alike); a tensor-parallel
  // slice counts as the whole parameter it is a slice of.
  if (e.split.split()) return e.split.global.numel();
  const TensorId id = e.value != kNoTensor ? e.value : e.stored(ParamRole::codes);
  return id == kNoTensor ? 0 : tensor(id).numel();
}

int64_t Program::parameter_count() const {
  int64_t n = 0;
  for (const ParamEntry& p : params_) n = checked_add(n, param_numel(p), "parameter count", "graph");
  return n;
}

int64_t Program::trainable_parameter_count() const {
  int64_t n = 0;
  for (const ParamEntry& p : params_)
    if (p.trainable) n += param_numel(p);
  return n;
}

void Program::validate_params() const {
  for (const ParamEntry& e : params_) {
    MEMFIT_CHECK(!e.storage.empty(), "graph", "parameter '{}' has no stored tensor", e.name);
    MEMFIT_CHECK(e.stored(ParamRole::value) == e.value, "graph", "parameter '{}': its value is not its value-role tensor",
                 e.name);
    for (const StoredTensor& s : e.storage)
      MEMFIT_CHECK(s.id >= 0 && size_t(s.id) < tensors_.size(), "graph", "parameter '{}' stores its {} as tensor id {}",
                   e.name, param_role_name(s.role), s.id);
    MEMFIT_CHECK(e.value != kNoTensor || e.frozen(), "graph",
                 "parameter '{}' is trainable but has no value tensor (quantised parameters must be frozen)", e.name);
    if (e.frozen())
      MEMFIT_CHECK(e.grad == kNoTensor && e.master == kNoTensor && e.state.empty(), "graph",
                   "frozen parameter '{}' has a gradient, a master or optimizer state", e.name);
  }
}

void Program::validate() const {
  validate_params();
  auto check_id = [&](TensorId id, const Op& op) {
    MEMFIT_CHECK(id >= 0 && size_t(id) < tensors_.size(), "graph", "op '{}' names tensor id {} which does not exist",
                 op.name, id);
  };
  MEMFIT_CHECK(!section_open_, "graph", "section '{}' was never closed", section_name(sections_.back().kind));
  int covered = 0;
  std::array<bool, kNumSectionKinds> seen{};
  for (const Section& s : sections_) {
    MEMFIT_CHECK(s.begin == covered && s.end >= s.begin, "graph", "section '{}' [{}, {}) leaves a gap or overlaps",
                 section_name(s.kind), s.begin, s.end);
    MEMFIT_CHECK(!seen[size_t(s.kind)], "graph", "the program has two '{}' sections", section_name(s.kind));
    seen[size_t(s.kind)] = true;
    covered = s.end;
  }
  MEMFIT_CHECK(covered == int(ops_.size()), "graph", "ops [{}, {}) belong to no section", covered, ops_.size());

  for (const TensorDesc& t : tensors_) {
    if (!t.is_view()) continue;
    const TensorDesc& r = tensor(t.view_of);
    MEMFIT_CHECK(!r.is_view() && t.view_offset + t.bytes() <= r.bytes(), "graph",
                 "view '{}' does not fit inside its root '{}'", t.name, r.name);
    MEMFIT_CHECK(t.tier == r.tier, "graph", "view '{}' is on another tier than its root '{}'", t.name, r.name);
  }

  // A transient root must be written (overwritten) before anything reads it within a pass
  // over its section; persistent tensors are initialised outside the program.
  std::vector<char> written(tensors_.size(), 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].lifetime == Lifetime::persistent) written[i] = 1;
  for (const Op& op : ops_) {
    MEMFIT_CHECK(op.modes.size() == op.outputs.size(), "graph", "op '{}' has {} write modes for {} outputs", op.name,
                 op.modes.size(), op.outputs.size());
    for (TensorId id : op.inputs) {
      check_id(id, op);
      MEMFIT_CHECK(written[size_t(root_of(id))], "graph", "op '{}' reads '{}' before anything writes it", op.name,
                   tensor(id).name);
    }
    for (TensorId id : op.workspace) check_id(id, op);
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      TensorId id = op.outputs[j];
      if (id == kNoTensor) continue;  // an output the op need not compute
      check_id(id, op);
      const bool reads = op.modes[j] == WriteMode::accumulate || op.modes[j] == WriteMode::update;
      MEMFIT_CHECK(!reads || written[size_t(root_of(id))], "graph", "op '{}' accumulates into '{}' before it is written",
                   op.name, tensor(id).name);
      written[size_t(root_of(id))] = 1;
    }
    for (auto [o, in] : op.inplace)
      MEMFIT_CHECK(o >= 0 && size_t(o) < op.outputs.size() && in >= 0 && size_t(in) < op.inputs.size(), "graph",
                   "op '{}' has an in-place pair out of range", op.name);
  }
}

}  // namespace memfit
