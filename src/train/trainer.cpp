// prepare_run (shared with `memfit plan`), the report's model and policy objects, and
// run_training, which is three stages in their own files: train/run_setup.cpp (everything
// before step 1), train/train_loop.cpp (the steps and validation) and train/run_report.cpp
// (measurement, save and report).
#include "train/trainer.hpp"
#include "train/deepspeed_config.hpp"

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "graph/zero.hpp"
#include "train/generate.hpp"
#include "train/run_report.hpp"
#include "train/run_setup.hpp"
#include "train/train_loop.hpp"

namespace memfit {

uint64_t run_budget(const RunConfig& c) { return c.memory_budget ? c.memory_budget : available_memory_bytes(); }

PreparedRun prepare_run(const RunConfig& c, const Backend& backend) {
  PreparedRun run;
  run.spec = resolve_model(c.model);
  run.policy = c.policy;
  run.policy.with_eval = c.val_fraction > 0;
  plan_training_samples(c, run.spec, run.policy);
  // The node layout (qgZ's hops): the communicator's when running, --ranks-per-node in a plan.
  Topology topo = c.topology;
  if (topo.ranks_per_node == 0) topo.ranks_per_node = c.ranks_per_node;
  if (run.policy.recompute.mode == RecomputeMode::automatic && run.policy.recompute.blocks.empty()) {
    run.recompute_choice = choose_recompute(run.spec, run.policy, topo, backend.capabilities(), run_budget(c),
                                            [&](Program& p) { attach_backend_scratch(p, backend); });
    run.policy.recompute.blocks = run.recompute_choice->blocks;
    if (run.recompute_choice->classifier_chunk_rows > 0)
      run.policy.classifier_chunk_rows = run.recompute_choice->classifier_chunk_rows;
  }
  run.compiled = compile_program(build_training_program(run.spec, run.policy, topo, backend.capabilities()), backend);
  check_deepspeed_bounds(c, run.compiled.program);
  return run;
}

std::string describe_recompute_choice(const PreparedRun& run, uint64_t budget) {
  if (!run.recompute_choice) return "";
  const RecomputeChoice& r = *run.recompute_choice;
  const std::string chunk =
      r.classifier_chunk_rows > 0 ? fmt::format(", classifier chunk {} rows", r.classifier_chunk_rows) : "";
  return fmt::format("recompute auto: {}{} ({:.1f} GFLOP recomputed per micro-step; peak {} {} the budget {}; {} "
                     "candidate programs planned)\n",
                     r.fits ? blocks_to_string(r.blocks) : "nothing fits, closest " + blocks_to_string(r.blocks),
                     chunk, r.recompute_flops / 1e9, format_bytes(r.peak_bytes), r.fits ? "within" : "above",
                     format_bytes(budget), r.planned);
}

nlohmann::json model_json(const ModelSpec& s, int64_t parameters) {
  return {{"name", s.name},         {"arch", arch_name(s.arch)}, {"n_layer", s.n_layer},
          {"n_head", s.n_head},     {"n_embd", s.n_embd},        {"vocab_size", s.vocab_size},
          {"padded_vocab", s.padded_vocab}, {"max_seq", s.max_seq}, {"parameters", parameters}};
}

nlohmann::json policy_json(const Policy& p) {
  return {{"batch", p.batch},
          {"seq", p.seq},
          {"grad_accum", p.grad_accum},
          {"precision", precision_name(p.precision)},
          {"grad_dtype", dtype_name(p.grad_dtype)},
          {"fp32_ops", p.fp32_ops},
          {"freeze", p.freeze},
          {"lora", p.lora.enabled() ? nlohmann::json{{"r", p.lora.rank}, {"lora_alpha", p.lora.alpha},
                                                      {"lora_dropout", p.lora.dropout},
                                                      {"target_modules", p.lora.target_regex.empty()
                                                                             ? nlohmann::json(p.lora.targets)
                                                                             : nlohmann::json(p.lora.target_regex)},
                                                      {"bias", lora_bias_name(p.lora.bias)},
                                                      {"use_rslora", p.lora.rslora},
                                                      {"modules_to_save", p.lora.modules_to_save}}
                                    : nlohmann::json(nullptr)},
          {"quantize_base", p.quantize_base.enabled() ? nlohmann::json{{"kind", base_quant_name(p.quantize_base.kind)},
                                                                        {"block", p.quantize_base.block},
                                                                        {"double_quant", p.quantize_base.double_quant}}
                                                      : nlohmann::json(nullptr)},
          {"recompute", p.recompute.to_string()},
          {"attention", attention_name(p.attention)},
          {"optimizer", optimizer_name(p.optimizer)},
          {"grad_clip", p.grad_clip},
          {"optimizer_in_backward", p.update_in_backward},
          {"adamw", {{"beta1", p.adamw.beta1}, {"beta2", p.adamw.beta2}, {"eps", p.adamw.eps},
                     {"weight_decay", p.adamw.weight_decay}}},
          {"zero_stage", p.zero_stage},
          {"overlap_comm", p.overlap_comm},
          {"zero_quantized_weights", p.zero_quantized_weights},
          {"zero_quantized_gradients", p.zero_quantized_gradients},
          {"zero_quantized_gradient_bits", p.zero_quantized_gradient_bits},
          {"zero_hpz_partition_size", p.zero_hpz_partition_size},
          {"offload_optimizer", tier_name(p.offload_optimizer)},
          {"offload_params", tier_name(p.offload_params)},
          {"classifier_chunk_rows", p.classifier_chunk_rows}};
}

nlohmann::json communication_json(const Program& program, const Topology& topo, int ranks_per_node) {
  const CommVolume v = communication_volume(program, topo, ranks_per_node);
  nlohmann::json by;
  for (int c = 0; c < kNumCommPurposes; ++c) by[std::string(comm_purpose_name(CommPurpose(c)))] = v.by_purpose[c];
  return {{"bytes", v.total},         {"by_purpose", by},           {"intra_node_bytes", v.intra_node},
          {"inter_node_bytes", v.inter_node}, {"node_link_bytes", v.node_link}, {"ranks_per_node", v.ranks_per_node},
          {"nodes", v.nodes}};
}

std::string describe_communication(const Program& program, const Topology& topo, int ranks_per_node) {
  const CommVolume v = communication_volume(program, topo, ranks_per_node);
  std::string parts;
  for (int c = 0; c < kNumCommPurposes; ++c)
    if (v.by_purpose[c] > 0)
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", comm_purpose_name(CommPurpose(c)),
                           format_bytes(uint64_t(v.by_purpose[c])));
  return fmt::format("communication: {} sent per rank per step ({}); {} node(s) of {} ranks: this rank {} intra-node, "
                     "{} inter-node; {} across each node boundary\n",
                     format_bytes(uint64_t(v.total)), parts.empty() ? "none" : parts, v.nodes, v.ranks_per_node,
                     format_bytes(uint64_t(v.intra_node)), format_bytes(uint64_t(v.inter_node)),
                     format_bytes(uint64_t(v.node_link)));
}

nlohmann::json run_training(const RunConfig& config, std::ostream& rank_log, RunHooks* hooks, Communicator* comm) {
  const std::unique_ptr<RunState> state = setup_run(config, rank_log, hooks, comm);
  const LoopRecord record = run_train_loop(*state, hooks);
  return finish_run(*state, record, hooks);
}

}  // namespace memfit
