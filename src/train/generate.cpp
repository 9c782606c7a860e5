#include "train/generate.hpp"

#include "train/adapter_files.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "io/mapped_file.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/speed_probe.hpp"
#include "plan/plan_report.hpp"
#include "runtime/compile.hpp"
#include "runtime/rss.hpp"
#include "text/tokenizer.hpp"
#include "train/init.hpp"
#include "train/tensor_staging.hpp"
#include "train/weights.hpp"

namespace memfit {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

Generator::Generator(Executor& ex, int64_t vocab) : ex_(ex), ops_(find_generate_ops(ex.program())), vocab_(vocab) {
  const TensorDesc& t = ex.program().tensor(ops_.logits);
  MEMFIT_CHECK(vocab >= 1 && vocab <= t.numel(), "generate", "vocabulary {} for logits of {} columns", vocab, t.numel());
  raw_.resize(size_t(t.bytes()));
  logits_.resize(size_t(t.numel()));
}

std::span<const float> Generator::read_logits() {
  ex_.read(ops_.logits, raw_);
  const DType dt = ex_.program().tensor(ops_.logits).dtype;
  visit_float_type(dt, [&](auto v) {
    using T = decltype(v);
    const T* src = reinterpret_cast<const T*>(raw_.data());
    for (size_t i = 0; i < logits_.size(); ++i) logits_[i] = widen(src[i]);
  });
  return std::span<const float>(logits_.data(), size_t(vocab_));
}

std::span<const float> Generator::prefill(std::span<const int32_t> prompt) {
  MEMFIT_CHECK(int64_t(prompt.size()) == ops_.prompt, "generate", "a prompt of {} tokens for a prefill planned for {}",
               prompt.size(), ops_.prompt);
  for (int32_t id : prompt)
    MEMFIT_CHECK(id >= 0 && id < vocab_, "generate", "token id {} is outside the vocabulary [0, {})", id, vocab_);
  ex_.write_as<int32_t>(ops_.prompt_tokens, prompt);
  StepContext ctx;
  ctx.position = 0;
  ex_.run_ops(ops_.prefill_begin, ops_.prefill_end, ctx);
  return read_logits();
}

std::span<const float> Generator::decode(int32_t token, int64_t position) {
  MEMFIT_CHECK(token >= 0 && token < vocab_, "generate", "token id {} is outside the vocabulary [0, {})", token, vocab_);
  MEMFIT_CHECK(position >= ops_.prompt && position < ops_.capacity, "generate",
               "decode at position {} outside the cache's [{}, {})", position, ops_.prompt, ops_.capacity);
  ex_.write_as<int32_t>(ops_.token, std::span<const int32_t>(&token, 1));
  StepContext ctx;
  ctx.position = position;
  ex_.run_ops(ops_.decode_begin, ops_.decode_end, ctx);
  return read_logits();
}

Generator::Result Generator::generate(std::span<const int32_t> prompt, int64_t max_new, Sampler& sampler,
                                      std::optional<int32_t> eos, std::vector<int32_t>& out) {
  max_new = std::min(max_new, ops_.capacity - ops_.prompt + 1);
  MEMFIT_CHECK(out.capacity() >= size_t(std::max<int64_t>(max_new, 0)), "generate",
               "the output holds {} tokens, {} may come", out.capacity(), max_new);
  out.clear();
  Result r;
  if (max_new <= 0) return r;
  auto t0 = Clock::now();
  std::span<const float> logits = prefill(prompt);
  int32_t next = sampler.next(logits);
  r.prefill_seconds = since(t0);
  out.push_back(next);
  t0 = Clock::now();
  // The last token needs no decode: its logits would choose a token past max_new.
  for (int64_t pos = ops_.prompt; int64_t(out.size()) < max_new; ++pos) {
    if (eos && next == *eos) break;
    next = sampler.next(decode(next, pos));
    out.push_back(next);
  }
  r.decode_seconds = since(t0);
  r.new_tokens = int64_t(out.size());
  r.stopped_at_eos = eos && out.back() == *eos;
  return r;
}

std::vector<int32_t> prompt_tokens(const GenerateRequest& request, const std::string& tokenizer, int64_t vocab) {
  std::vector<int32_t> ids = request.prompt_ids;
  if (ids.empty()) {
    MEMFIT_CHECK(!request.prompt.empty(), "cli", "generation needs a prompt: --prompt TEXT or --prompt-ids 1,2,3");
    if (!tokenizer.empty()) {
      for (uint32_t id : text::Tokenizer::load(tokenizer).encode(request.prompt)) ids.push_back(int32_t(id));
    } else {
      MEMFIT_CHECK(vocab == 256, "cli",
                   "--prompt TEXT needs --tokenizer DIR for a vocabulary of {} (a 256-token vocabulary reads bytes); "
                   "or give --prompt-ids",
                   vocab);
      for (unsigned char c : request.prompt) ids.push_back(int32_t(c));
    }
  }
  MEMFIT_CHECK(!ids.empty(), "cli", "the prompt encodes to no tokens");
  for (int32_t id : ids)
    MEMFIT_CHECK(id >= 0 && id < vocab, "cli", "prompt token id {} is outside the vocabulary [0, {})", id, vocab);
  return ids;
}

std::optional<int32_t> model_eos_token(const std::string& model) {
  namespace fs = std::filesystem;
  if (model.find('/') == std::string::npos && !model.ends_with(".json")) return std::nullopt;
  fs::path path(model);
  if (fs::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("eos_token_id")) return std::nullopt;
  const nlohmann::json& e = j["eos_token_id"];
  if (e.is_number_integer()) return e.get<int32_t>();
  if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int32_t>();
  return std::nullopt;
}

namespace {

std::string decode_text(const std::string& tokenizer, int64_t vocab, std::span<const int32_t> ids) {
  if (!tokenizer.empty()) {
    std::vector<uint32_t> u(ids.begin(), ids.end());
    return text::Tokenizer::load(tokenizer).decode(u);
  }
  if (vocab == 256) return std::string(ids.begin(), ids.end());
  return "";
}

double flops_of(const Program& p, int begin, int end) {
  double f = 0;
  for (int i = begin; i < end; ++i) f += p.op(i).flops;
  return f;
}

// Prefill's share of the probed product speed (it is products), decode's of the probed
// streaming bandwidth (one token reads every parameter and the cache once).
nlohmann::json speed_shares(const CompiledProgram& c, const Generator& gen, const Generator::Result& r, DType dt) {
  const CpuSpeed speed = probe_cpu_speed();
  const Program& p = c.program;
  const GenerateOps& g = gen.ops();
  const double peak = dt == DType::bf16 && speed.bf16_gemm_flops > 0 ? speed.bf16_gemm_flops : speed.fp32_gemm_flops;
  const double prefill_flops = flops_of(p, g.prefill_begin, g.prefill_end);
  uint64_t weights = 0, cache = 0;
  for (const TensorDesc& t : p.tensors()) {
    if (t.category == Category::parameters && !t.is_view()) weights += t.bytes();
    if (t.category == Category::kv_cache) cache += t.bytes();
  }
  const double decodes = double(std::max<int64_t>(r.new_tokens - 1, 0));
  // The cache is read up to the position, half of it on average.
  const double bytes_per_decode = double(weights) + 0.5 * double(cache);
  nlohmann::json j;
  j["probed_gemm_flops"] = peak;
  j["probed_stream_bytes_per_s"] = speed.stream_bytes_per_s;
  j["prefill_flops_share"] = r.prefill_seconds > 0 && peak > 0 ? prefill_flops / r.prefill_seconds / peak : 0.0;
  j["decode_bandwidth_share"] = r.decode_seconds > 0 && speed.stream_bytes_per_s > 0
                                    ? bytes_per_decode * decodes / r.decode_seconds / speed.stream_bytes_per_s
                                    : 0.0;
  return j;
}

nlohmann::json generate_report(const RunConfig& config, const ModelSpec& spec, const CompiledProgram& compiled,
                               const Executor& ex, const Generator& gen, std::span<const int32_t> prompt,
                               std::span<const int32_t> out, const Generator::Result& r, std::ostream& log) {
  const Program& program = compiled.program;
  const double prefill_tps = r.prefill_seconds > 0 ? double(prompt.size()) / r.prefill_seconds : 0.0;
  const double decodes = double(std::max<int64_t>(r.new_tokens - 1, 0));
  const double decode_tps = r.decode_seconds > 0 ? decodes / r.decode_seconds : 0.0;
  const DType dt = program.tensor(gen.ops().logits).dtype;
  const nlohmann::json shares = speed_shares(compiled, gen, r, dt);
  const std::string text = decode_text(config.tokenizer, spec.vocab_size, out);
  log << fmt::format("generate: model {}, {} prompt tokens, {} new tokens{}\n", spec.name, prompt.size(), r.new_tokens,
                     r.stopped_at_eos ? " (stopped at eos)" : "");
  log << fmt::format("tokens: {}\n", fmt::join(out, ","));
  if (!text.empty()) log << "text: " << text << "\n";
  log << fmt::format("prefill {:.1f} tokens/s ({:.1f}% of the probed product peak), decode {:.1f} tokens/s ({:.1f}% "
                     "of the probed stream bandwidth)\n",
                     prefill_tps, 100.0 * shares["prefill_flops_share"].get<double>(), decode_tps,
                     100.0 * shares["decode_bandwidth_share"].get<double>());
  log << format_memory_table(program, compiled.plan);
  TierBytes measured{};
  bool equal = true;
  for (Tier t : kAllTiers) {
    measured[size_t(t)] = ex.buffer(t).measured_high_water();
    const uint64_t planned = compiled.plan.tier(t).peak_bytes;
    if (planned == 0 && measured[size_t(t)] == 0) continue;
    equal = equal && planned == measured[size_t(t)];
    log << fmt::format("memory: {} planned peak {} ({} bytes), measured high-water {} ({} bytes), {}\n", tier_name(t),
                       format_bytes(planned), planned, format_bytes(measured[size_t(t)]), measured[size_t(t)],
                       planned == measured[size_t(t)] ? "equal" : "DIFFERENT");
  }
  const uint64_t rss = peak_resident_set_bytes();
  log << fmt::format("max RSS {}\n", format_bytes(rss));
  nlohmann::json report;
  report["model"] = spec.name;
  report["prompt_tokens"] = prompt.size();
  report["prompt"] = std::vector<int32_t>(prompt.begin(), prompt.end());
  report["new_tokens"] = r.new_tokens;
  report["tokens"] = std::vector<int32_t>(out.begin(), out.end());
  report["text"] = text;
  report["stopped_at_eos"] = r.stopped_at_eos;
  report["prefill_seconds"] = r.prefill_seconds;
  report["decode_seconds"] = r.decode_seconds;
  report["prefill_tokens_per_second"] = prefill_tps;
  report["decode_tokens_per_second"] = decode_tps;
  report["speed"] = shares;
  report["memory"] = memory_json(program, compiled.plan, measured);
  report["memory"]["max_rss_bytes"] = rss;
  report["memory"]["planned_equals_measured"] = equal;
  if (!config.report_json.empty()) {
    const std::string body = report.dump(2) + "\n";
    AtomicFileWriter file(config.report_json, "generate");
    file.write(body.data(), body.size());
    file.commit();
  }
  MEMFIT_CHECK(equal, "generate", "planned memory differs from the measured high-water mark (see the table above)");
  return report;
}

}  // namespace

namespace {

GenerateRequest sample_request(const RunConfig& c) {
  GenerateRequest r;
  r.prompt = c.sample_prompt;
  if (r.prompt.empty()) r.prompt_ids = {0};
  r.max_new_tokens = c.sample_tokens;
  return r;
}

}  // namespace

void plan_training_samples(const RunConfig& c, const ModelSpec& spec, Policy& policy) {
  if (c.sample_every <= 0) return;
  MEMFIT_CHECK(policy.zero_stage < 3, "train",
               "--sample-every reads whole parameters, which ZeRO stage 3 holds only inside a step: use --zero 2 or less");
  MEMFIT_CHECK(!policy.lora.enabled() && !policy.quantize_base.enabled(), "train",
               "--sample-every with LoRA or a quantised base is not supported yet (the sample would skip the adapters)");
  MEMFIT_CHECK(policy.offload_params == Tier::device, "train",
               "--sample-every with --offload-params is not supported: the sample reads the parameters on the device");
  const std::vector<int32_t> prompt = prompt_tokens(sample_request(c), c.tokenizer, spec.vocab_size);
  policy.sample_prompt = int64_t(prompt.size());
  policy.sample_capacity = policy.sample_prompt + c.sample_tokens - 1;
  MEMFIT_CHECK(policy.sample_capacity <= spec.max_seq, "train",
               "--sample-prompt ({} tokens) + --sample-tokens ({}) exceeds the {} positions of model '{}'",
               prompt.size(), c.sample_tokens, spec.max_seq, spec.name);
}

TrainingSampler::TrainingSampler(const RunConfig& c, Executor& ex, int64_t vocab)
    : gen_(ex, vocab),
      greedy_(SamplingOptions{}, vocab),
      prompt_(prompt_tokens(sample_request(c), c.tokenizer, vocab)),
      tokens_(c.sample_tokens),
      vocab_(vocab) {
  out_.reserve(size_t(tokens_));
  if (!c.tokenizer.empty()) tokenizer_.emplace(text::Tokenizer::load(c.tokenizer));
}

std::string TrainingSampler::sample() {
  gen_.generate(prompt_, tokens_, greedy_, std::nullopt, out_);
  if (tokenizer_) return tokenizer_->decode(std::vector<uint32_t>(out_.begin(), out_.end()));
  if (vocab_ == 256) return std::string(out_.begin(), out_.end());
  return fmt::format("ids {}", fmt::join(out_, ","));
}

nlohmann::json run_generate(const RunConfig& config, const GenerateRequest& request, std::ostream& log) {
  MEMFIT_CHECK(config.topology.world() == 1, "generate", "memfit generate runs on one rank");
  // Training techniques change nothing in an inference program: refused, not ignored.
  const Policy& p = config.policy;
  MEMFIT_CHECK(p.zero_stage == 0 && p.offload_optimizer == Tier::device && p.offload_params == Tier::device &&
                   p.recompute.mode == RecomputeMode::none && p.grad_accum == 1,
               "generate", "memfit generate takes no training options (--zero, --offload-*, --recompute, --grad-accum): "
               "it plans one sequence's inference");
  MEMFIT_CHECK(request.max_new_tokens >= 1, "cli", "--max-new-tokens must be at least 1, got {}", request.max_new_tokens);
  check_sampling_options(request.sampling);
  const ModelSpec spec = resolve_model(config.model);
  const std::vector<int32_t> prompt = prompt_tokens(request, config.tokenizer, spec.vocab_size);
  const GenerateShape shape{int64_t(prompt.size()), int64_t(prompt.size()) + request.max_new_tokens - 1};
  MEMFIT_CHECK(shape.capacity <= spec.max_seq, "generate",
               "prompt ({} tokens) + --max-new-tokens ({}) exceeds the {} positions of model '{}'", prompt.size(),
               request.max_new_tokens, spec.max_seq, spec.name);
  auto backend = make_backend(config.backend);
  const CompiledProgram compiled =
      compile_program(build_inference_program(spec, config.policy, backend->capabilities(), shape), *backend);
  Executor ex(compiled, *backend);
  TensorStaging staging;
  load_inference_weights(config, ex, spec, staging, log);
  zero_persistent_state(ex, staging);
  Generator gen(ex, spec.vocab_size);
  Sampler sampler(request.sampling, spec.vocab_size);
  const std::optional<int32_t> eos = request.ignore_eos ? std::nullopt : model_eos_token(config.model);
  std::vector<int32_t> out;
  out.reserve(size_t(request.max_new_tokens));
  const Generator::Result r = gen.generate(prompt, request.max_new_tokens, sampler, eos, out);
  return generate_report(config, spec, compiled, ex, gen, prompt, out, r, log);
}

}  // namespace memfit
