#include "graph/lora.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "core/error.hpp"
#include "core/dropout_mask.hpp"
#include "graph/quantize_base.hpp"
#include "graph/tensor_parallel.hpp"

namespace memfit {

namespace {

constexpr const char* kWeightSuffix = ".weight";

std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - 7); }

bool is_embedding_or_head(const std::string& module) {
  const std::string last = module.substr(module.rfind('.') + 1);
  return last == "wte" || last == "wpe" || last == "embed_tokens" || last == "lm_head";
}

// PEFT: a target names a module when it equals the module's name or is a dotted suffix of it.
bool matches_target(const std::string& module, const std::string& target) {
  return module == target || (module.size() > target.size() && module.ends_with(target) &&
                              module[module.size() - target.size() - 1] == '.');
}

// The module's path in the HF model PEFT wraps: "model.layers.0.mlp.up_proj", "lm_head",
// "transformer.h.0.attn.c_attn".
std::string hf_module_path(const Program& p, const std::string& module) {
  if (module == "lm_head") return module;
  return (p.find_param("wte.weight") ? "transformer." : "model.") + module;
}

// `text` as a regular expression; `given` is the user's part of it, for the error.
std::regex checked_regex(const std::string& text, const char* what, const std::string& given = {}) {
  try {
    return std::regex(text, std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    throw Error("policy", fmt::format("LoRA {} '{}' is not a valid regular expression", what,
                                      given.empty() ? text : given));
  }
}

// PEFT's check_target_module_exists past the target match: exclude_modules, modules_to_save
// (an adapter never wraps a module trained whole) and layers_to_transform (only with a list
// of targets), on the HF module path.
bool kept_by_selection(const std::string& path, const LoraPolicy& lora) {
  if (!lora.exclude_regex.empty() && std::regex_match(path, checked_regex(lora.exclude_regex, "exclude_modules")))
    return false;
  for (const std::string& x : lora.exclude_modules)
    if (path == x || path.ends_with("." + x)) return false;
  for (const std::string& m : lora.modules_to_save)
    if (std::regex_match(path, checked_regex("(^|.*\\.)" + m + "($|\\..*)", "modules_to_save", m))) return false;
  if (lora.layers_to_transform.empty() || !lora.target_regex.empty()) return true;
  // The first numbered component after a layers_pattern name (any name when none is given).
  std::smatch match;
  bool found = false;
  if (lora.layers_pattern.empty()) {
    found = std::regex_search(path, match, std::regex(R"(^.*?\.[^.]*\.(\d+)\.)"));
  } else {
    for (const std::string& pattern : lora.layers_pattern)
      if ((found = std::regex_search(path, match, checked_regex("^(?:|.*?\\.)" + pattern + "\\.(\\d+)\\.",
                                                               "layers_pattern", pattern))))
        break;
  }
  if (!found) return false;
  const int64_t layer = std::stoll(match[1].str());
  return std::count(lora.layers_to_transform.begin(), lora.layers_to_transform.end(), layer) > 0;
}

// PEFT's defaults (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) for memfit's families.
std::vector<std::string> default_targets(const std::vector<LinearModule>& modules) {
  for (const LinearModule& m : modules)
    if (m.short_name() == "c_attn") return {"c_attn"};
  return {"q_proj", "v_proj"};
}

// A branch's op names: the linear's, and for a piece of a fused weight its HF module's after it
// ("...qkv_proj.q_proj.lora_A").
std::string site_of(const Op& op, const LinearModule& m) {
  return m.whole() ? op.name : op.name + "." + m.short_name();
}

class LoraRewrite final : public ForwardRewrite {
 public:
  LoraRewrite(LoraPolicy lora, int data_rank) : lora_(std::move(lora)), data_rank_(data_rank) {}
  std::string name() const override { return "lora"; }
  void declare(GraphBuilder& b) override;
  bool rewrite(const Op& op, GraphBuilder& b) override;

 private:
  struct Branch {
    LinearModule module;
    TensorId a = kNoTensor, b = kNoTensor;
    int64_t rank = 0;  // rank_pattern's, else r
    double scale = 0;  // alpha / rank (alpha_pattern's alpha; sqrt(rank) with rsLoRA)
    bool row_parallel = false;  // its input is this tensor rank's column slice of x
    TensorId magnitude = kNoTensor;  // DoRA's
  };
  LoraPolicy lora_;
  int data_rank_ = 0;
  std::map<TensorId, std::vector<Branch>> branches_;  // by the base weight's value tensor

  void emit_dora(const Op& op, std::vector<Branch> branches, TensorId z, GraphBuilder& b);
  void rewrite_dora_with_dropout(const Op& op, std::vector<Branch> branches, GraphBuilder& b);
  TensorId dropped_input(const Op& op, const Branch& br, GraphBuilder& b);
  TensorId dora_norm(const Op& op, const Branch& br, GraphBuilder& b);
  TensorId lora_a_product(const Op& op, const Branch& br, TensorId in, GraphBuilder& b);
  TensorId lora_b_product(const Op& op, const Branch& br, TensorId xa, GraphBuilder& b, TensorId into = kNoTensor);
  TensorId branch_tensor(const Op& op, const Branch& br, const char* suffix, GraphBuilder& b);
};

void LoraRewrite::declare(GraphBuilder& b) {
  branches_.clear();
  Program& p = b.program();
  const std::vector<LinearModule> targets = lora_targets(p, lora_);
  std::set<std::string> kept;
  for (const LinearModule& m : targets)
    if (lora_.bias == LoraBias::lora_only && !m.bias.empty()) kept.insert(m.bias);
  for (const std::string& name : lora_modules_to_save(p, lora_)) kept.insert(name);
  for (ParamEntry& e : p.params()) {
    const bool bias = e.name.ends_with(".bias");
    const bool keep = (bias && lora_.bias == LoraBias::all) || kept.count(e.name) > 0;
    if (e.trainable && !keep) freeze_parameter(p, e);
  }
  const TensorParallel& tp = b.tensor_parallel();
  MEMFIT_CHECK(!lora_.dora || !tp.on(), "policy", "DoRA (use_dora) with tensor parallelism: not supported");
  const bool rewrites = lora_.init == LoraInit::olora || lora_.init == LoraInit::pissa;
  MEMFIT_CHECK(!rewrites || !tp.on(), "policy",
               "init_lora_weights {} with tensor parallelism: not supported (the factors are the whole weight's)",
               lora_init_name(lora_));
  // PEFT's olora_init factors the weight as stored, which for GPT-2's Conv1D is [in, out]: the
  // adapters it makes do not fit the layer, so there is nothing to match.
  MEMFIT_CHECK(lora_.init != LoraInit::olora || !p.find_param("wte.weight"), "policy",
               "init_lora_weights olora on GPT-2's Conv1D layers: not supported (PEFT's factors the [in, out] weight "
               "as stored); use pissa, which PEFT transposes");
  for (const LinearModule& m : targets) {
    // Copies: declaring parameters grows the parameter and tensor tables.
    const ParamEntry* base = p.find_param(m.weight);
    const TensorId w = base->value;
    const TensorSplit ws = base->split;
    b.set_layer(p.tensor(w).layer);
    Branch br{m};
    // Tensor parallelism (Megatron's LoRA): a column-parallel weight (its output rows split)
    // gets a replicated A and B split as its rows; a row-parallel one (input columns split) A
    // split as its columns and a replicated B. The module's sizes are this rank's; the
    // parameters are declared with the one-rank shapes, so initialisation draws the one-rank
    // values (A's bound from the whole fan-in) and checkpoints describe global tensors.
    const bool column = ws.axis == TensorSplit::Axis::rows, row = ws.axis == TensorSplit::Axis::columns;
    const int64_t in = row ? m.cols * tp.parts : m.cols, out = column ? m.rows * tp.parts : m.rows;
    br.rank = lora_.rank_of(hf_module_path(p, m.name));
    br.scale = lora_.scale_of(hf_module_path(p, m.name));
    const Shape a_shape{br.rank, in}, b_shape{out, br.rank};
    br.row_parallel = row;
    const bool gaussian = lora_.init == LoraInit::gaussian, random = lora_.init == LoraInit::random;
    const float bound = float(1.0 / std::sqrt(double(in)));
    br.a = b.parameter(lora_a_name(m.name), a_shape, gaussian ? ParamInit::normal : ParamInit::uniform,
                       gaussian ? float(1.0 / double(br.rank)) : bound, true, row ? tp.columns(a_shape) : TensorSplit{});
    br.b = b.parameter(lora_b_name(m.name), b_shape, random ? ParamInit::uniform : ParamInit::zeros,
                       random ? float(1.0 / std::sqrt(double(br.rank))) : 0.0f, true,
                       // B's rows split as W's: a whole fused weight (GPT-2's c_attn) by its q, k, v segments
                       column ? tp.rows(b_shape, m.whole() ? ws.segments : std::vector<int64_t>{}) : TensorSplit{});
    // DoRA's magnitude: one per output row of the module, as PEFT's lora_magnitude_vector.
    if (lora_.dora) br.magnitude = b.parameter(lora_magnitude_name(m.name), Shape{out}, ParamInit::row_norm, 0.0f, false);
    // The replicated factor's gradient is a partial sum on each rank: column-parallel, A's
    // (each rank back-propagates its output rows through its slice of B); row-parallel, B's
    // (each rank's x A holds its input columns' share).
    if (column) b.sum_grad_over_tensor_group(br.a);
    if (row) b.sum_grad_over_tensor_group(br.b);
    branches_[w].push_back(br);
  }
}

bool LoraRewrite::rewrite(const Op& op, GraphBuilder& b) {
  if (op.kind != OpKind::matmul || op.inputs.size() < 2) return false;
  const auto it = branches_.find(op.inputs[1]);
  if (it == branches_.end()) return false;
  Program& p = b.program();
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  MEMFIT_ASSERT(a.trans_b && !a.trans_a, "linear {} is not x @ W^T", op.name);
  if (lora_.dora && lora_.dropout > 0 && b.grad_enabled()) {
    rewrite_dora_with_dropout(op, it->second, b);
    return true;
  }
  const TensorId x = op.inputs[0];
  const Shape ys = p.tensor(op.outputs[0]).shape;
  const DType dt = p.tensor(op.outputs[0]).dtype;
  // DoRA: the LoRA sum z is kept for the magnitudes' gradient; the op's output is z rescaled.
  const TensorId y = lora_.dora ? b.transient(op.name + ".dora.z", ys, Category::activations, dt) : op.outputs[0];
  // The base product keeps the op's name, inputs and attributes (so --fp32-ops, recompute
  // selections and a quantising pass still find it).
  const std::vector<Branch>& branches = it->second;
  // A whole weight's one adapter adds its product into y where the base product put it (the
  // skinny products of kernels/cpu/skinny_bf16.hpp accumulate into a bf16 y at the cost of
  // the add alone); a fused weight's pieces add into column blocks of y, through add_columns.
  const bool into_y = branches.size() == 1 && branches[0].module.whole();
  TensorId sum = into_y ? y : b.transient(op.name + ".base.y", ys, Category::activations, dt);
  b.emit({OpKind::matmul, op.name, op.inputs, {sum}, op.attrs, op.flops});
  for (size_t i = 0; i < branches.size(); ++i) {
    const Branch& br = branches[i];
    const std::string site = site_of(op, br.module);
    const TensorId in = lora_.dropout > 0 && b.grad_enabled() ? dropped_input(op, br, b) : x;
    const TensorId xa = lora_a_product(op, br, in, b);
    if (into_y) {
      lora_b_product(op, br, xa, b, y);
      break;
    }
    const TensorId d = lora_b_product(op, br, xa, b);
    const bool last = i + 1 == branches.size();
    const TensorId next = last ? y : b.transient(site + ".lora_sum", ys, Category::activations, dt);
    if (br.module.whole())
      b.emit({OpKind::add, site + ".lora_add", {sum, d}, {next}, NoAttrs{}, double(ys.numel()), {}, {},
              {{0, 0}, {0, 1}}});
    else
      b.emit({OpKind::add_columns, site + ".lora_add", {sum, d}, {next},
              ColumnsAttrs{a.m, a.n, br.module.row_begin, br.module.rows}, double(p.tensor(d).numel()), {}, {},
              {{0, 0}}});
    sum = next;
  }
  if (lora_.dora) emit_dora(op, branches, y, b);
  return true;
}

// The branch's dropout(x): the one-rank run's mask (a data rank's rows follow the lower
// ranks' rows, and a row-parallel input is a column slice of the one-rank x).
TensorId LoraRewrite::dropped_input(const Op& op, const Branch& br, GraphBuilder& b) {
  Program& p = b.program();
  const TensorId x = op.inputs[0];
  const std::string site = site_of(op, br.module);
  const TensorId in = b.transient(site + ".lora_dropout.y", p.tensor(x).shape, Category::activations, p.tensor(x).dtype);
  const std::string salt = br.module.name + ".lora_dropout";
  const TensorParallel& tp = b.tensor_parallel();
  const int64_t cols = p.tensor(x).shape.dims().back(), rows = p.tensor(x).numel() / cols;
  const int parts = br.row_parallel ? tp.parts : 1;
  const DropoutLayout layout{cols, cols * parts, br.row_parallel ? tp.index * cols : 0, data_rank_ * rows};
  b.emit({OpKind::dropout_forward, site + ".lora_dropout", {x}, {in},
          DropoutAttrs{float(lora_.dropout), dropout_salt(salt.c_str()), layout}, double(p.tensor(x).numel())});
  return in;
}

// x A^T [tokens, r] of the branch's (maybe dropped) input.
TensorId LoraRewrite::lora_a_product(const Op& op, const Branch& br, TensorId in, GraphBuilder& b) {
  const Program& p = b.program();
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  std::vector<int64_t> mid = p.tensor(op.outputs[0]).shape.dims();
  mid.back() = br.rank;
  const std::string site = site_of(op, br.module);
  const TensorId xa = b.transient(site + ".lora_A.y", Shape(mid), Category::activations, p.tensor(op.outputs[0]).dtype);
  b.emit({OpKind::matmul, site + ".lora_A", {in, br.a}, {xa}, MatmulAttrs{a.m, br.rank, a.k, false, true, 1.0f},
          2.0 * double(a.m) * double(br.rank) * double(a.k)});
  return xa;
}

// scale (x A^T) B^T: added into `into` (update mode), or into a new [tokens, the branch's
// rows] tensor, which is returned.
TensorId LoraRewrite::lora_b_product(const Op& op, const Branch& br, TensorId xa, GraphBuilder& b, TensorId into) {
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  const int64_t rows = br.module.rows;
  const TensorId out = into != kNoTensor ? into : branch_tensor(op, br, ".lora_B.y", b);
  b.emit({OpKind::matmul, site_of(op, br.module) + ".lora_B", {xa, br.b}, {out},
          MatmulAttrs{a.m, rows, br.rank, false, true, float(br.scale)},
          2.0 * double(a.m) * double(rows) * double(br.rank), {into != kNoTensor ? WriteMode::update : WriteMode::overwrite}});
  return out;
}

// A new activation [tokens, the branch's rows] of the linear's dtype, named site + suffix.
TensorId LoraRewrite::branch_tensor(const Op& op, const Branch& br, const char* suffix, GraphBuilder& b) {
  const TensorDesc& y = b.program().tensor(op.outputs[0]);
  std::vector<int64_t> dims = y.shape.dims();
  dims.back() = br.module.rows;
  const DType dt = y.dtype;
  return b.transient(site_of(op, br.module) + suffix, Shape(dims), Category::activations, dt);
}

// ||W + scale B A|| of the branch's rows, from the weights of this step.
TensorId LoraRewrite::dora_norm(const Op& op, const Branch& br, GraphBuilder& b) {
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  const std::string site = site_of(op, br.module);
  const int64_t rows = br.module.rows;
  const TensorId norm = b.transient(site + ".dora_norm.y", Shape{rows}, Category::activations, DType::f32);
  const double flops = double(rows) * double(a.k) * (2.0 * double(br.rank) + 3.0);
  b.emit({OpKind::dora_norm, site + ".dora_norm", {op.inputs[1], br.a, br.b}, {norm},
          DoraNormAttrs{a.k, br.module.row_begin, rows, br.rank, float(br.scale)}, flops});
  return norm;
}

// PEFT's DoRA with dropout: the base product y0 = x W^T + bias stays, and each branch adds
// (m / norm - 1) p + (m / norm) q to its columns, p = dropout(x) W_rows^T its own product of
// the dropped input with the branch's rows of W (a window of a fused weight), q = scale
// dropout(x) A^T B^T. Only z = p + q is kept for the backward (dora_blend_backward), in p's
// bytes.
void LoraRewrite::rewrite_dora_with_dropout(const Op& op, std::vector<Branch> branches, GraphBuilder& b) {
  Program& p = b.program();
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  const Shape ys = p.tensor(op.outputs[0]).shape;
  const DType dt = p.tensor(op.outputs[0]).dtype;
  const TensorId y0 = b.transient(op.name + ".base.y", ys, Category::activations, dt);
  b.emit({OpKind::matmul, op.name, op.inputs, {y0}, op.attrs, op.flops});
  std::sort(branches.begin(), branches.end(),
            [](const Branch& l, const Branch& r) { return l.module.row_begin < r.module.row_begin; });
  DoraScaleAttrs blend{a.m, a.n, {}, {}, false};
  std::vector<TensorId> inputs{y0}, outputs{op.outputs[0]};
  std::vector<std::pair<int, int>> inplace{{0, 0}};
  for (const Branch& br : branches) {
    const int64_t rows = br.module.rows;
    const TensorId in = dropped_input(op, br, b);
    const TensorId pd = branch_tensor(op, br, ".dora_dropped.y", b);
    b.emit({OpKind::matmul, site_of(op, br.module) + ".dora_dropped", {in, op.inputs[1]}, {pd},
            MatmulAttrs{a.m, rows, a.k, false, true, 1.0f, br.module.row_begin * a.k, !br.module.whole()},
            2.0 * double(a.m) * double(rows) * double(a.k)});
    const TensorId q = lora_b_product(op, br, lora_a_product(op, br, in, b), b);
    blend.begins.push_back(br.module.row_begin);
    blend.widths.push_back(rows);
    inplace.push_back({int(outputs.size()), int(inputs.size()) + 2});  // z over p
    inputs.insert(inputs.end(), {br.magnitude, dora_norm(op, br, b), pd, q});
    outputs.push_back(branch_tensor(op, br, ".dora_blend.z", b));
  }
  b.emit({OpKind::dora_blend, op.name + ".dora_blend", std::move(inputs), std::move(outputs), std::move(blend),
          5.0 * double(ys.numel()), {}, {}, std::move(inplace)});
}

// y = z with each branch's columns (z - bias) * m / ||W + scale B A|| + bias, the norms
// computed from the weights of this step.
void LoraRewrite::emit_dora(const Op& op, std::vector<Branch> branches, TensorId z, GraphBuilder& b) {
  Program& p = b.program();
  const MatmulAttrs& a = std::get<MatmulAttrs>(op.attrs);
  std::sort(branches.begin(), branches.end(),
            [](const Branch& l, const Branch& r) { return l.module.row_begin < r.module.row_begin; });
  DoraScaleAttrs scale{a.m, a.n, {}, {}, op.inputs.size() > 2};
  std::vector<TensorId> inputs{z};
  for (const Branch& br : branches) {
    scale.begins.push_back(br.module.row_begin);
    scale.widths.push_back(br.module.rows);
    inputs.insert(inputs.end(), {br.magnitude, dora_norm(op, br, b)});
  }
  if (scale.has_bias) inputs.push_back(op.inputs[2]);
  b.emit({OpKind::dora_scale, op.name + ".dora_scale", std::move(inputs), op.outputs, std::move(scale),
          3.0 * double(p.tensor(z).numel())});
}

}  // namespace

std::string LinearModule::short_name() const { return name.substr(name.rfind('.') + 1); }

std::string lora_module_path(const Program& p, const std::string& module) { return hf_module_path(p, module); }

std::vector<LinearModule> linear_modules(const Program& p) {
  std::vector<LinearModule> out;
  for (const ParamEntry& e : p.params()) {
    if (!e.name.ends_with(kWeightSuffix) || e.name.find(".lora_") != std::string::npos) continue;
    const Shape s = p.tensor(e.value != kNoTensor ? e.value : e.storage.front().id).shape;
    const std::string module = module_of(e.name);
    if (s.rank() != 2 || is_embedding_or_head(module)) continue;
    LinearModule m{module, e.name, "", 0, s[0], s[1], s[0]};
    if (p.find_param(module + ".bias")) m.bias = module + ".bias";
    // Fused q, k, v rows (graph/quantize_base.hpp's hf_segments_of knows the layout).
    const std::vector<int64_t> rows = hf_segments_of(p, e);
    if (rows.size() == 1) {
      out.push_back(m);
      continue;
    }
    const std::string prefix = module.substr(0, module.size() - 8);
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int64_t i = 0, begin = 0; i < 3; begin += rows[size_t(i)], ++i)
      out.push_back({prefix + names[i], e.name, m.bias, begin, rows[size_t(i)], s[1], s[0]});
  }
  return out;
}

std::vector<LinearModule> lora_targets(const Program& p, const LoraPolicy& lora) {
  const std::vector<LinearModule> modules = linear_modules(p);
  MEMFIT_CHECK(!modules.empty(), "policy", "LoRA: the model has no linear layer");
  std::set<std::string> kinds;
  for (const LinearModule& m : modules) kinds.insert(m.short_name());
  std::string known;
  for (const std::string& k : kinds) known += (known.empty() ? "" : ", ") + k;
  std::vector<bool> chosen(modules.size(), false);
  MEMFIT_CHECK(lora.layers_to_transform.empty() || lora.target_regex.empty(), "policy",
               "LoRA layers_to_transform needs target_modules as a list of names, not a regular expression (as PEFT)");
  if (!lora.target_regex.empty()) {
    const std::regex re = checked_regex(lora.target_regex, "target_modules");
    bool any = false;
    for (size_t i = 0; i < modules.size(); ++i)
      for (const char* prefix : {"", "model.", "transformer."})
        if (std::regex_match(prefix + modules[i].name, re)) chosen[i] = any = true;
    MEMFIT_CHECK(any, "policy", "LoRA target_modules '{}' matches no linear layer (modules: {})", lora.target_regex,
                 known);
  } else {
    const std::vector<std::string> targets = lora.targets.empty() ? default_targets(modules) : lora.targets;
    for (const std::string& t : targets) {
      bool any = false;
      for (size_t i = 0; i < modules.size(); ++i)
        if (t == "all-linear" || matches_target(modules[i].name, t)) chosen[i] = any = true;
      MEMFIT_CHECK(any, "policy", "LoRA target '{}' matches no linear layer of this model (its linear layers: {})", t,
                   known);
    }
  }
  std::vector<LinearModule> out;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!chosen[i] || !kept_by_selection(hf_module_path(p, modules[i].name), lora)) continue;
    const LinearModule& m = modules[i];
    const int64_t rank = lora.rank_of(hf_module_path(p, m.name));
    MEMFIT_CHECK(rank <= std::min(m.rows, m.cols), "policy",
                 "LoRA rank {} is larger than min(in, out) = min({}, {}) of {}", rank, m.cols, m.rows, m.name);
    out.push_back(m);
  }
  MEMFIT_CHECK(!out.empty(), "policy", "LoRA: exclude_modules, modules_to_save and layers_to_transform leave no "
               "target (its linear layers: {})", known);
  return out;
}

std::vector<std::string> lora_modules_to_save(const Program& p, const LoraPolicy& lora) {
  if (lora.modules_to_save.empty()) return {};
  const bool gpt2 = p.find_param("wte.weight") != nullptr, tied = p.find_param("lm_head.weight") == nullptr;
  const std::vector<LinearModule> linears = linear_modules(p);
  std::set<std::string> fused;  // memfit modules that hold several HF modules (llama's qkv_proj)
  for (const LinearModule& m : linears)
    if (!m.whole()) fused.insert(module_of(m.weight));
  std::map<std::string, std::vector<std::string>> leaves;  // memfit module -> its parameters
  for (const ParamEntry& e : p.params())
    if (e.name.find(".lora_") == std::string::npos) leaves[e.name.substr(0, e.name.rfind('.'))].push_back(e.name);
  std::set<std::string> kinds;
  for (const auto& [module, params] : leaves)
    if (!fused.count(module)) kinds.insert(module.substr(module.rfind('.') + 1));
  std::string known;
  for (const std::string& k : kinds) known += (known.empty() ? "" : ", ") + k;
  std::vector<std::string> out;
  for (const std::string& t : lora.modules_to_save) {
    for (const LinearModule& m : linears)
      MEMFIT_CHECK(m.whole() || !hf_module_path(p, m.name).ends_with(t), "policy",
                   "modules_to_save '{}' names {}, which memfit holds fused with the other q/k/v projections: "
                   "not supported", t, m.name);
    bool any = false, ancestor = false;
    for (const auto& [module, params] : leaves) {
      const std::string path = hf_module_path(p, module);
      for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1))
        ancestor = ancestor || path.substr(0, dot).ends_with(t);
      if (fused.count(module) || !path.ends_with(t)) continue;
      MEMFIT_CHECK(!gpt2 || std::none_of(linears.begin(), linears.end(),
                                         [&](const LinearModule& m) { return m.name == module; }),
                   "policy", "modules_to_save '{}' names {}, a GPT-2 Conv1D layer: not supported (target it with "
                   "LoRA instead)", t, module);
      MEMFIT_CHECK(!tied || !is_embedding_or_head(module), "policy", "modules_to_save '{}' names {}, whose weight "
                   "is tied to the output head here: not supported", t, module);
      any = true;
      out.insert(out.end(), params.begin(), params.end());
    }
    MEMFIT_CHECK(any || !ancestor, "policy", "modules_to_save '{}' names a module that holds other modules: name "
                 "the modules inside it that should train whole", t);
    MEMFIT_CHECK(any, "policy", "modules_to_save '{}' matches no module of this model (its modules: {})", t, known);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string lora_a_name(const std::string& module) { return module + ".lora_A" + kWeightSuffix; }
std::string lora_b_name(const std::string& module) { return module + ".lora_B" + kWeightSuffix; }
std::string lora_magnitude_name(const std::string& module) { return module + ".lora_magnitude_vector"; }

std::shared_ptr<ForwardRewrite> make_lora_rewrite(const LoraPolicy& lora, int data_rank) {
  return std::make_shared<LoraRewrite>(lora, data_rank);
}

}  // namespace memfit
