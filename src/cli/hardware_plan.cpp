#include "cli/hardware_plan.hpp"

#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <tuple>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "fit/compare.hpp"
#include "fit/fit_search.hpp"
#include "fit/framework_deepspeed.hpp"
#include "fit/framework_pytorch.hpp"
#include "graph/precision.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/speed_probe.hpp"
#include "kernels/quant/quant_format.hpp"
#include "runtime/compile.hpp"
#include "train/trainer.hpp"

namespace memfit::cli {

namespace {

// Ranks a plan may ask about: 2^20, above the largest training clusters (~10^5 GPUs).
constexpr int kMaxRanks = 1 << 20;

}  // namespace

HardwarePlanOptions::HardwarePlanOptions(CLI::App& plan) : app_(plan) {
  std::string presets;
  for (const std::string& n : hardware_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  plan.add_option("--hardware", hardware_, "hardware preset: " + presets + " (default cpu: this machine)");
  plan.add_option("--hardware-file", hardware_file_,
                  "JSON file of hardware fields (\"base\": a preset, then any field of --hardware-set)");
  plan.add_option("--hardware-set", sets_,
                  "override one hardware field, KEY=VALUE (e.g. memory_bytes=40GiB, peak_bf16_flops=7e14); repeatable");
  plan.add_option("--device-memory", device_memory_, "device memory per rank, e.g. 80GiB (overrides the preset)");
  plan.add_option("--gpus-per-node", gpus_per_node_, "ranks per node")->check(CLI::Range(1, kMaxRanks));
  plan.add_option("--nodes", nodes_, "nodes")->check(CLI::Range(1, kMaxRanks));
  plan.add_option("--world-size", world_size_, "ranks in all (with --gpus-per-node: nodes = world / gpus per node)")
      ->check(CLI::Range(1, kMaxRanks));
  plan.add_option("--efficiency", efficiency_,
                  "share of peak FLOP/s compute-bound ops reach (default 0.45 on GPU presets; 1 on cpu, whose peaks "
                  "are measured)");
  plan.add_option("--comm-overlap", comm_overlap_, "share of collective time hidden behind compute (default 0)");
  plan.add_option("--headroom", headroom_,
                  "share of the memory budget a plan must leave free (default 0.05; 0.10 with --fit --framework pytorch): it fits only if its per-rank "
                  "peak, fixed runtime bytes included, is at most (1 - headroom) x the budget");
  plan.add_flag("--fit", fit_, "search the fastest configuration that fits the budget (--memory-budget, default: "
                               "the hardware's memory)");
  plan.add_option("--global-batch", global_batch_, "--fit: sequences per optimizer step over all ranks (sets accumulation)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  plan.add_option("--max-batch", max_batch_, "--fit: largest micro-batch tried (default 64)")
      ->check(CLI::Range(int64_t(1), kMaxKernelDim));
  plan.add_option("--fit-show", keep_, "--fit: configurations listed (default 5)")->check(CLI::Range(1, 1000));
  plan.add_flag("--compare", compare_, "also print what DeepSpeed's estimator and accelerate's estimate-memory say");
  plan.add_option("--emit", emit_, "--emit deepspeed FILE: write the (chosen) configuration as a DeepSpeed config")
      ->expected(2);
  plan.add_option("--framework", framework_,
                  "memfit (default): memfit's plan; pytorch: the peak tensor bytes of the same step in HF transformers "
                  "+ PyTorch (--recompute full: gradient checkpointing, --precision bf16: bf16 autocast; with --fit: "
                  "only configurations whose PyTorch peak fits are searched, flash as sdpa and plain as eager); "
                  "deepspeed: the per-rank peak of the same step under DeepSpeed 0.19 ZeRO (--zero, --world-size, "
                  "--precision; buckets from --deepspeed-config or --config, else DeepSpeed's defaults)")
      ->check(CLI::IsMember({"memfit", "pytorch", "deepspeed"}));
  plan.add_option("--deepspeed-config", deepspeed_config_,
                  "--framework deepspeed: a DeepSpeed JSON config whose zero_optimization sizes, overlap_comm, "
                  "bf16/fp16, optimizer.params.torch_adam and train_micro_batch_size_per_gpu the prediction takes");
  plan.add_option("--torch-attention", torch_attention_,
                  "--framework pytorch: HF's attn_implementation, eager or sdpa (default sdpa, as transformers; with --fit: "
                  "only configurations of that attention, else either)")
      ->check(CLI::IsMember({"eager", "sdpa"}));
}

bool HardwarePlanOptions::requested(const RunConfig&) const {
  const bool other_hardware = hardware_ != "cpu";
  for (const char* flag : {"--hardware", "--hardware-file", "--hardware-set", "--device-memory", "--gpus-per-node",
                           "--nodes", "--fit", "--compare", "--emit", "--efficiency", "--comm-overlap", "--headroom",
                           "--framework", "--torch-attention", "--deepspeed-config"})
    if (app_.get_option(flag)->count() > 0) return true;
  return other_hardware;
}

namespace {

// The "cpu" preset's speeds replaced by this machine's, measured with the backend's own
// kernels; fields the user set (--hardware-file, --hardware-set) stay as given.
void measure_this_machine(Hardware& hw, const std::set<std::string>& given) {
  const CpuSpeed speed = probe_cpu_speed();
  auto fill = [&](const char* key, double& field, double value) {
    if (!given.contains(key)) field = value;
  };
  fill("peak_fp32_flops", hw.peak_fp32_flops, speed.fp32_gemm_flops);
  if (speed.bf16_gemm_flops > 0) fill("peak_bf16_flops", hw.peak_bf16_flops, speed.bf16_gemm_flops);
  else std::cerr << "memfit: note: oneDNN has no bf16 product on this CPU; bf16 estimates use the preset's figure\n";
  fill("memory_bandwidth", hw.memory_bandwidth, speed.stream_bytes_per_s);
  fill("host_memory_bandwidth", hw.host_memory_bandwidth, speed.stream_bytes_per_s);
  hw.speeds_measured = true;
}

// The HF + PyTorch step a memfit policy corresponds to (torch_step_for): the attention given, or
// (a --fit winner) the one its attention maps to, on the hardware's device (CUDA on a GPU
// preset). With --json, added to `j` (which may hold the --fit search) and printed.
int print_pytorch_peak(const ModelSpec& spec, const Policy& p, std::optional<TorchAttention> attention,
                       const Hardware& hw, bool as_json, nlohmann::json j, std::ostream& out) {
  std::string why;
  std::optional<TorchStep> st = torch_step_for(p, 1, attention, why);
  MEMFIT_CHECK(st.has_value(), "framework", "--framework pytorch does not model {}", why);
  st = on_hardware(*st, hw);
  const TorchPeak peak = predict_pytorch_peak(spec, *st);
  if (!as_json) {
    out << format_pytorch_peak(spec, *st, peak);
    return 0;
  }
  j["pytorch"] = pytorch_peak_json(*st, peak);
  out << j.dump(2) << "\n";
  return 0;
}

// DeepSpeed's settings for --framework deepspeed: memfit's zero_optimization bounds when its
// --config gave them, then a --deepspeed-config file's own keys (which may also set the stage,
// precision and micro-batch).
DeepSpeedStep deepspeed_settings(const RunConfig& config, const std::string& ds_file, DeepSpeedStep st) {
  const RunConfig::ZeroBounds& zb = config.zero_bounds;
  if (zb.reduce_bucket) st.zero.reduce_bucket_size = zb.reduce_bucket;
  if (zb.allgather_bucket) st.zero.allgather_bucket_size = zb.allgather_bucket;
  if (zb.prefetch_bucket) st.zero.prefetch_bucket_size = zb.prefetch_bucket;
  if (zb.max_live_parameters) st.zero.max_live_parameters = zb.max_live_parameters;
  if (ds_file.empty()) return st;
  std::ifstream f(ds_file);
  MEMFIT_CHECK(f.good(), "cli", "cannot open DeepSpeed config '{}'", ds_file);
  try {
    apply_deepspeed_json(nlohmann::json::parse(f), st);
  } catch (const nlohmann::json::exception& e) {
    throw Error("framework", fmt::format("{}: not valid JSON ({})", ds_file, e.what()));
  }
  return st;
}

int print_deepspeed_step(const ModelSpec& spec, const DeepSpeedStep& st, bool as_json, nlohmann::json j,
                         std::ostream& out) {
  const DeepSpeedPeak peak = predict_deepspeed_peak(spec, st);
  if (!as_json) {
    out << format_deepspeed_peak(spec, st, peak);
    return 0;
  }
  j["deepspeed"] = deepspeed_peak_json(st, peak);
  out << j.dump(2) << "\n";
  return 0;
}

// Without --fit: the step memfit's flags give (on --world-size ranks), then the DeepSpeed
// config's keys over it.
int print_deepspeed_peak(const RunConfig& config, const std::string& ds_file, int world, const std::string& attention,
                         const Hardware& hw, bool as_json, std::ostream& out) {
  std::string why;
  const std::optional<DeepSpeedStep> st =
      deepspeed_step_for(config.policy, std::max(world, 1), parse_torch_attention(attention), why);
  MEMFIT_CHECK(st.has_value(), "framework", "--framework deepspeed does not model {}", why);
  DeepSpeedStep d = deepspeed_settings(config, ds_file, *st);
  d.torch = on_hardware(d.torch, hw);
  return print_deepspeed_step(resolve_model(config.model), d, as_json, {}, out);
}

// --fit --framework pytorch|deepspeed (only candidates of `attention` when given); for DeepSpeed
// the search judges every candidate under the config's sizes (each its own stage).
void set_framework_fit(bool torch, const RunConfig& config, const std::string& ds_file, const std::string& attention,
                       FitOptions& fo) {
  fo.framework = torch ? FitFramework::pytorch : FitFramework::deepspeed;
  if (!attention.empty()) fo.torch_attention = parse_torch_attention(attention);
  if (torch) return;
  const DeepSpeedStep settings = deepspeed_settings(config, ds_file, {});
  fo.deepspeed_zero = settings.zero, fo.deepspeed_torch_adam = settings.torch_adam;
}

// The --fit winner, as the search judged it.
int print_deepspeed_winner(const ModelSpec& spec, const RunConfig& config, const std::string& ds_file,
                           const Policy& winner, const Hardware& hw, int world, bool as_json, nlohmann::json j,
                           std::ostream& out) {
  FitOptions fo;
  set_framework_fit(false, config, ds_file, "", fo);
  std::string why;
  std::optional<DeepSpeedStep> st = fit_deepspeed_step(winner, world, fo, why);
  MEMFIT_CHECK(st.has_value(), "framework", "--framework deepspeed does not model {}", why);
  st->torch = on_hardware(st->torch, hw);
  return print_deepspeed_step(spec, *st, as_json, std::move(j), out);
}

void emit_deepspeed(const Policy& policy, double lr, const std::string& path, bool as_json, nlohmann::json& j,
                    std::ostream& out) {
  std::ofstream f(path);
  MEMFIT_CHECK(f.good(), "cli", "cannot write '{}'", path);
  f << deepspeed_config(policy, lr).dump(2) << "\n";
  const std::string fsdp = fsdp_settings(policy);
  if (as_json) j["emitted"] = {{"deepspeed", path}, {"fsdp", fsdp}};
  else out << fmt::format("wrote DeepSpeed config {}\nPyTorch FSDP equivalent: {}\n", path, fsdp);
}

Cluster make_cluster(const Hardware& hw, int gpn, int nodes, int world) {
  Cluster c;
  c.hw = hw;
  if (world > 0) {
    MEMFIT_CHECK(nodes == 0 || gpn > 0 || world % nodes == 0, "hardware", "world size {} does not split over {} nodes",
                 world, nodes);
    if (gpn == 0) gpn = nodes > 0 ? world / nodes : std::min(world, 8);
    MEMFIT_CHECK(world % gpn == 0, "hardware", "world size {} is not a multiple of {} GPUs per node", world, gpn);
    MEMFIT_CHECK(nodes == 0 || nodes * gpn == world, "hardware", "--nodes {} x --gpus-per-node {} is not --world-size {}",
                 nodes, gpn, world);
    nodes = world / gpn;
  }
  c.gpus_per_node = gpn > 0 ? gpn : 1;
  c.nodes = nodes > 0 ? nodes : 1;
  MEMFIT_CHECK(c.gpus_per_node >= 1 && c.nodes >= 1, "hardware", "GPUs per node and nodes must be at least 1");
  return c;
}

}  // namespace

void HardwarePlanOptions::check_tensor_parallel_plan(int tensor) const {
  MEMFIT_CHECK(tensor == 1 || !(fit_ || compare_ || framework_ != "memfit" || !emit_.empty()), "plan",
               "--tensor-parallel plans memfit's run of one layout: --fit searches the degree itself, and --compare, "
               "--emit and --framework do not translate tensor parallelism yet");
}

// --fit: the search, its ranked candidates printed (or put in `j`), and the winner's policy and
// tensor-parallel degree; throws when nothing fits.
std::pair<Policy, int> HardwarePlanOptions::fit_winner(const ModelSpec& spec, const RunConfig& config,
                                                       const Policy& policy, const Cluster& cluster,
                                                       const EstimateOptions& eo, uint64_t budget, double headroom,
                                                       bool as_json, nlohmann::json& j, std::ostream& out) const {
  const bool torch = framework_ == "pytorch", ds = framework_ == "deepspeed";
  const uint64_t usable = usable_bytes(budget, headroom);
  const Hardware& hw = cluster.hw;
  FitOptions fo;
  fo.budget = budget;
  fo.global_batch = global_batch_;
  fo.max_batch = max_batch_;
  fo.keep = keep_;
  fo.headroom = headroom;
  fo.search_tensor_parallel = !compare_;  // the comparisons name data-parallel frameworks
  const bool attention_given = app_.get_option("--torch-attention")->count() > 0;
  if (torch || ds) set_framework_fit(torch, config, deepspeed_config_, attention_given ? torch_attention_ : "", fo);
  const FitResult r = fit_search(spec, policy, cluster, eo, fo);
  if (as_json) j["fit"] = fit_json(r, cluster, budget, eo);
  else out << fmt::format("memfit plan --fit: model {} ({} parameters), sequence {}\n", spec.name,
                          spec.parameter_count(), policy.seq)
           << format_fit(r, cluster, budget);
  if (r.ranked.empty() && as_json) out << j.dump(2) << "\n";  // the rejected families, for scripts
  MEMFIT_CHECK(!r.ranked.empty(), "fit", "no configuration of {} fits {} per rank ({:g}% headroom of {}) on {} x {}",
               spec.name, format_bytes(usable), 100 * headroom, format_bytes(budget), cluster.world_size(), hw.name);
  return {r.ranked.front().policy, r.ranked.front().tensor};
}

Hardware HardwarePlanOptions::chosen_hardware(std::set<std::string>& given) const {
  Hardware hw = hardware_preset(hardware_);
  if (!hardware_file_.empty()) {
    std::ifstream f(hardware_file_);
    MEMFIT_CHECK(f.good(), "hardware", "cannot open hardware file '{}'", hardware_file_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw Error("hardware", fmt::format("{}: not valid JSON ({})", hardware_file_, e.what()));
    }
    apply_hardware_json(j, hw, hardware_file_);
    if (j.is_object())
      for (const auto& item : j.items()) given.insert(item.key());
  }
  for (const std::string& kv : sets_) {
    const auto eq = kv.find('=');
    MEMFIT_CHECK(eq != std::string::npos, "hardware", "--hardware-set expects KEY=VALUE, got '{}'", kv);
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    nlohmann::json v;
    try {
      v = nlohmann::json::parse(value);
    } catch (const nlohmann::json::exception&) {
      v = value;  // "80GiB", a name
    }
    apply_hardware_json(nlohmann::json{{key, v}}, hw, "--hardware-set");
    given.insert(key);
  }
  if (!device_memory_.empty()) hw.memory_bytes = parse_memory_bytes(device_memory_, "--device-memory");
  return hw;
}

int HardwarePlanOptions::run(const RunConfig& config, bool as_json, std::ostream& out) const {
  const bool torch = framework_ == "pytorch", ds = framework_ == "deepspeed";
  std::set<std::string> given;  // hardware fields the user set
  Hardware hw = chosen_hardware(given);
  // Without --fit the frameworks' peaks are closed forms of the shapes, on the hardware's
  // device: no program, nothing measured.
  if (torch && !fit_)
    return print_pytorch_peak(resolve_model(config.model), config.policy, parse_torch_attention(torch_attention_), hw,
                              as_json, {}, out);
  if (ds && !fit_)
    return print_deepspeed_peak(config, deepspeed_config_, world_size_, torch_attention_, hw, as_json, out);
  auto backend = make_backend(config.backend);
  if (hw.executes_here) {
    measure_this_machine(hw, given);
    hw.capabilities = backend->capabilities();  // this machine plans what its backend runs
  }
  hw.validate();
  const Cluster cluster = make_cluster(hw, gpus_per_node_, nodes_, world_size_);
  MEMFIT_CHECK(app_.get_option("--efficiency")->count() == 0 || (efficiency_ > 0 && efficiency_ <= 1), "hardware",
               "--efficiency must be in (0, 1] (got {})", efficiency_);
  MEMFIT_CHECK(comm_overlap_ >= 0 && comm_overlap_ <= 1, "hardware", "--comm-overlap must be in [0, 1] (got {})",
               comm_overlap_);
  // PyTorch's caching allocator rounds and caches more than memfit's plan leaves to chance.
  const double headroom = app_.get_option("--headroom")->count() > 0 ? headroom_ : (torch || ds) && fit_ ? 0.10 : 0.05;
  MEMFIT_CHECK(headroom >= 0 && headroom < 1, "hardware", "--headroom must be in [0, 1) (got {})", headroom);
  MEMFIT_CHECK(emit_.empty() || emit_[0] == "deepspeed", "cli", "--emit supports 'deepspeed FILE' (got '{}')",
               emit_.empty() ? "" : emit_[0]);

  const ModelSpec spec = resolve_model(config.model);
  EstimateOptions eo;
  eo.efficiency = efficiency_ > 0 ? efficiency_ : hw.default_efficiency;
  eo.comm_overlap = comm_overlap_;
  // On this machine the plan is the executed run's: the backend's scratch is part of it.
  if (hw.executes_here) {
    eo.prepare = [&](Program& p) { attach_backend_scratch(p, *backend); };
    for (Tier t : kAllTiers) eo.alignments[size_t(t)] = backend->buffer_type(t).alignment();
  }

  Policy policy = config.policy;
  policy.with_eval = config.val_fraction > 0;  // as `memfit train` builds it (train/trainer.cpp)
  // QLoRA's default 16 bits are the device's own: fp16 where products have no bf16 kernels.
  if (!config.precision_given && policy.precision == Precision::bf16) {
    policy.precision = native_half_precision(hw);
    if (policy.grad_dtype == DType::bf16) policy.grad_dtype = compute_dtype(policy.precision);
  }
  MEMFIT_CHECK(policy.recompute.mode != RecomputeMode::automatic, "policy",
               "--recompute auto is not searched on other hardware; use --fit (it searches recomputation too)");
  nlohmann::json j;
  int tensor = config.topology.tensor;  // --fit picks its own
  const uint64_t budget = config.memory_budget ? config.memory_budget : hw.memory_bytes;
  const uint64_t usable = usable_bytes(budget, headroom);
  if (fit_) std::tie(policy, tensor) = fit_winner(spec, config, policy, cluster, eo, budget, headroom, as_json, j, out);
  if ((torch || ds) && !emit_.empty()) emit_deepspeed(policy, config.lr, emit_[1], as_json, j, out);
  if (torch) return print_pytorch_peak(spec, policy, std::nullopt, hw, as_json, j, out);
  if (ds) return print_deepspeed_winner(spec, config, deepspeed_config_, policy, hw, cluster.world_size(), as_json, j, out);
  const ProgramSummary s = plan_run_summary(spec, policy, cluster.world_size(), hw, eo, tensor);
  RankEstimate e = estimate_from_summary(s, policy, cluster, eo);
  plan_every_rank(spec, policy, cluster, eo, e, kMaxRanksPlanned, tensor);  // budget: the largest
  if (as_json) {
    j["model"] = model_json(spec, s.parameters);
    j["policy"] = policy_json(policy);
    j["tensor_parallel"] = tensor;
    j["sequence_parallel"] = policy.sequence_parallel;
    j["estimate"] = estimate_json(e, cluster, eo);
    j["fits"] = check_fit(e, cluster, usable).fits();
    j["budget_bytes"] = budget;
    j["headroom"] = headroom;
    j["usable_bytes"] = usable;
    if (compare_) j["compare"] = comparison_json(spec, s, policy, cluster, e);
  } else {
    out << fmt::format("memfit plan: model {} ({} parameters), {}{}, micro-batch {} x {}, accumulation {}, {} ops\n",
                       spec.name, s.parameters, family_name(policy), tensor_parallel_label(tensor, policy),
                       policy.batch, policy.seq, policy.grad_accum, s.ops);
    out << format_estimate(e, cluster, eo);
    const Overflow o = check_fit(e, cluster, usable);
    const std::string within = fmt::format("{} usable per rank: {} less {:g}% headroom (--headroom)",
                                           format_bytes(usable), format_bytes(budget), 100 * headroom);
    if (!o.fits())
      out << fmt::format("does not fit {}: {} tier over by {} (largest there: {})\n", within, tier_name(o.tier),
                         format_bytes(o.excess), category_name(o.category));
    else out << fmt::format("fits {}\n", within);
    if (compare_) out << format_comparison(spec, s, policy, cluster, e);
  }
  if (!emit_.empty()) emit_deepspeed(policy, config.lr, emit_[1], as_json, j, out);
  if (as_json) out << j.dump(2) << "\n";
  return 0;
}

}  // namespace memfit::cli
