// HF config.json reading against the published configs of real models and their published
// parameter counts, and writing against the keys GPT2LMHeadModel reads.
#include "io/hf_config.hpp"

#include <gtest/gtest.h>

#include "io/io_test_util.hpp"

namespace memfit {
namespace {

using nlohmann::json;
using test::expect_error;
using test::ScratchDir;

// openai-community/gpt2 config.json, as published.
const char* kGpt2Config = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

// meta-llama/Llama-2-7b-hf config.json, as published.
const char* kLlama2Config = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
  "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

// mistralai/Mistral-7B-v0.1 config.json, as published.
const char* kMistralConfig = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

// Qwen/Qwen2-0.5B config.json, as published.
const char* kQwen2Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

ModelSpec read_config_text(const ScratchDir& dir, const std::string& text, const std::string& name = "config.json") {
  const std::string path = dir.file(name);
  test::write_bytes(path, text);
  return read_hf_config(path);
}

std::string config_path_with(const ScratchDir& dir, const char* base, const json& patch) {
  json j = json::parse(base);
  j.merge_patch(patch);
  const std::string path = dir.file("patched.json");
  test::write_bytes(path, j.dump());
  return path;
}

TEST(HfConfig, ReadsGpt2SmallWithItsPublishedParameterCount) {
  ScratchDir dir;
  const ModelSpec s = read_config_text(dir, kGpt2Config);
  EXPECT_EQ(s.arch, Arch::gpt2);
  EXPECT_EQ(s.n_layer, 12);
  EXPECT_EQ(s.n_head, 12);
  EXPECT_EQ(s.n_kv_head, 12);
  EXPECT_EQ(s.n_embd, 768);
  EXPECT_EQ(s.n_inner, 3072);
  EXPECT_EQ(s.vocab_size, 50257);
  EXPECT_EQ(s.padded_vocab, 50304);
  EXPECT_EQ(s.max_seq, 1024);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_NE(s.name.find("gpt2"), std::string::npos);
  EXPECT_NE(s.name.find(dir.file("config.json")), std::string::npos);

  // Closed form: V*C + P*C + L*(12C^2 + 13C) + 2C. HF's 124,439,808 counts the real
  // vocabulary; memfit's table has 50304 - 50257 = 47 padding rows of 768 more.
  const int64_t C = 768, L = 12, P = 1024;
  const auto closed_form = [&](int64_t V) { return V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C; };
  EXPECT_EQ(closed_form(50257), 124'439'808);
  EXPECT_EQ(s.parameter_count(), closed_form(50304));
  EXPECT_EQ(s.parameter_count(), 124'439'808 + 47 * 768);
  ModelSpec unpadded = s;
  unpadded.padded_vocab = unpadded.vocab_size;
  EXPECT_EQ(unpadded.parameter_count(), 124'439'808);
}

TEST(HfConfig, AppliesGpt2Defaults) {
  ScratchDir dir;
  // No n_positions (n_ctx instead), no epsilon, no activation, explicit null n_inner.
  const ModelSpec s = read_config_text(
      dir, R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":64,"n_ctx":128,"vocab_size":256,"n_inner":null})");
  EXPECT_EQ(s.max_seq, 128);
  EXPECT_EQ(s.n_inner, 256);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_TRUE(s.tied_embeddings);
  EXPECT_EQ(s.padded_vocab, 256);

  const ModelSpec wide = read_config_text(
      dir, R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":64,"n_positions":64,"n_ctx":128,"vocab_size":300,)"
           R"("n_inner":100,"activation_function":"gelu_pytorch_tanh","tie_word_embeddings":true})");
  EXPECT_EQ(wide.max_seq, 64);  // n_positions wins over n_ctx
  EXPECT_EQ(wide.n_inner, 100);
  EXPECT_EQ(wide.padded_vocab, 320);
  EXPECT_TRUE(wide.tied_embeddings);
}

TEST(HfConfig, ReadsLlama2With6738415616Parameters) {
  ScratchDir dir;
  const ModelSpec s = read_config_text(dir, kLlama2Config);
  EXPECT_EQ(s.arch, Arch::llama);
  EXPECT_EQ(s.n_layer, 32);
  EXPECT_EQ(s.n_head, 32);
  EXPECT_EQ(s.n_kv_head, 32);
  EXPECT_EQ(s.n_embd, 4096);
  EXPECT_EQ(s.n_inner, 11008);
  EXPECT_EQ(s.vocab_size, 32000);
  EXPECT_EQ(s.padded_vocab, 32000);
  EXPECT_EQ(s.max_seq, 4096);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_FALSE(s.tied_embeddings);
  EXPECT_EQ(s.parameter_count(), 6'738'415'616);
}

TEST(HfConfig, ReadsMistral7bWithGroupedQueryAttention) {
  ScratchDir dir;
  const ModelSpec s = read_config_text(dir, kMistralConfig);
  EXPECT_EQ(s.arch, Arch::llama);
  EXPECT_EQ(s.n_kv_head, 8);
  EXPECT_EQ(s.n_inner, 14336);
  // max_position_embeddings is 32768, but its sliding_window of 4096 caps the sequences that
  // full causal attention computes exactly.
  EXPECT_EQ(s.max_seq, 4096);
  EXPECT_EQ(s.parameter_count(), 7'241'732'096);  // published: 7.24B
}

TEST(HfConfig, ReadsQwen2) {
  ScratchDir dir;
  const ModelSpec s = read_config_text(dir, kQwen2Config);
  EXPECT_EQ(s.arch, Arch::llama);
  EXPECT_EQ(s.n_head, 14);
  EXPECT_EQ(s.n_kv_head, 2);
  EXPECT_EQ(s.n_embd, 896);
  EXPECT_EQ(s.head_dim(), 64);
  EXPECT_EQ(s.norm_eps, 1e-6f);
  EXPECT_EQ(s.rope_theta, 1e6f);
  EXPECT_TRUE(s.tied_embeddings);
  // Qwen2-0.5B has 494,032,768 parameters; 24 * (896 + 2 * 128) of them are the q/k/v biases.
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_EQ(s.parameter_count(), 494'032'768);
}

TEST(HfConfig, AppliesLlamaDefaults) {
  ScratchDir dir;
  const ModelSpec s = read_config_text(
      dir, R"({"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":64,)"
           R"("intermediate_size":172,"vocab_size":1000,"max_position_embeddings":256})");
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_EQ(s.norm_eps, 1e-6f);
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_FALSE(s.tied_embeddings);
  EXPECT_EQ(s.padded_vocab, 1024);
}

TEST(HfConfig, EachBadConfigGivesOneClearError) {
  ScratchDir dir;
  const struct {
    const char* what;
    const char* base;
    json patch;
    std::vector<std::string_view> expected;
  } cases[] = {
      {"relu gpt2", kGpt2Config, {{"activation_function", "relu"}}, {"activation_function", "'relu'"}},
      {"missing n_embd", kGpt2Config, {{"n_embd", nullptr}}, {"missing key 'n_embd'"}},
      {"no context", kGpt2Config, {{"n_ctx", nullptr}, {"n_positions", nullptr}}, {"'n_positions'", "'n_ctx'"}},
      {"string layers", kGpt2Config, {{"n_layer", "12"}}, {"'n_layer'", "positive integer", "\"12\""}},
      {"fractional heads", kGpt2Config, {{"n_head", 12.5}}, {"'n_head'", "positive integer"}},
      {"zero layers", kGpt2Config, {{"n_layer", 0}}, {"'n_layer'", "positive integer"}},
      {"huge vocabulary", kGpt2Config, {{"vocab_size", 1LL << 40}}, {"'vocab_size'", "below 2^31"}},
      {"string epsilon", kGpt2Config, {{"layer_norm_epsilon", "1e-5"}}, {"'layer_norm_epsilon'", "positive number"}},
      {"tie as string", kGpt2Config, {{"tie_word_embeddings", "yes"}}, {"'tie_word_embeddings'", "true or false"}},
      {"heads not dividing C", kGpt2Config, {{"n_head", 5}}, {"768 channels", "5 heads"}},
      {"unknown model", kGpt2Config, {{"model_type", "bert"}}, {"model_type 'bert'", "gpt2, llama, mistral, qwen2"}},
      {"numeric model type", kGpt2Config, {{"model_type", 2}}, {"'model_type'", "string"}},
      {"missing model type", kGpt2Config, {{"model_type", nullptr}}, {"missing key 'model_type'"}},
      {"gelu llama", kLlama2Config, {{"hidden_act", "gelu"}}, {"hidden_act 'gelu'"}},
      {"missing intermediate", kLlama2Config, {{"intermediate_size", nullptr}}, {"missing key 'intermediate_size'"}},
      {"kv heads not dividing", kMistralConfig, {{"num_key_value_heads", 5}}, {"5 key/value heads"}},
      {"odd head_dim", kMistralConfig, {{"head_dim", 160}}, {"head_dim 160", "128"}},
      {"attention bias", kLlama2Config, {{"attention_bias", true}}, {"'attention_bias'"}},
      {"negative theta", kLlama2Config, {{"rope_theta", -1.0}}, {"'rope_theta'", "positive number"}},
      // Keys that change the model's math are honoured or refused, never ignored.
      {"untied gpt2", kGpt2Config, {{"tie_word_embeddings", false}}, {"'tie_word_embeddings': false", "gpt2"}},
      {"unscaled attention", kGpt2Config, {{"scale_attn_weights", false}}, {"'scale_attn_weights': false"}},
      {"layer-scaled attention", kGpt2Config, {{"scale_attn_by_inverse_layer_idx", true}},
       {"'scale_attn_by_inverse_layer_idx': true"}},
      {"cross attention", kGpt2Config, {{"add_cross_attention", true}}, {"'add_cross_attention': true"}},
      {"mlp bias", kLlama2Config, {{"mlp_bias", true}}, {"'mlp_bias'"}},
      {"rope scaling without type", kLlama2Config, {{"rope_scaling", {{"factor", 8.0}}}}, {"'rope_scaling' has no 'rope_type'"}},
      {"rope scaling not an object", kLlama2Config, {{"rope_scaling", 8.0}}, {"'rope_scaling'", "must be an object"}},
      {"rope scaling conflicting", kLlama2Config,
       {{"rope_parameters", {{"rope_type", "default"}}}, {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}},
       {"'rope_scaling' says rope_type 'llama3'", "'rope_parameters' says 'default'"}},
      {"unknown rope type", kLlama2Config, {{"rope_scaling", {{"type", "ntk"}}}}, {"rope_type 'ntk'"}},
      {"partial rotary", kLlama2Config, {{"partial_rotary_factor", 0.5}}, {"'partial_rotary_factor'"}},
      {"other layer type", kQwen2Config, {{"layer_types", {"full_attention", "chunked_attention"}}}, {"'layer_types'", "chunked_attention"}},
      {"window without size", kQwen2Config, {{"use_sliding_window", true}, {"sliding_window", nullptr}}, {"'sliding_window'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = config_path_with(dir, c.base, c.patch);
    const std::string message = expect_error([&] { (void)read_hf_config(path); }, "config", {path});
    for (std::string_view part : c.expected) EXPECT_NE(message.find(part), std::string::npos) << part << " / " << message;
  }
}

// Sliding-window attention is honoured by capping max_seq at the window, where it equals full
// causal attention; Qwen2 uses its window only when use_sliding_window (or layer_types) says so.
TEST(HfConfig, CapsTheSequenceAtTheSlidingWindow) {
  ScratchDir dir;
  EXPECT_EQ(read_hf_config(config_path_with(dir, kQwen2Config, json::object())).max_seq, 131072);  // use_sliding_window false
  EXPECT_EQ(read_hf_config(config_path_with(dir, kQwen2Config, {{"use_sliding_window", true}})).max_seq, 131072);
  EXPECT_EQ(read_hf_config(config_path_with(dir, kQwen2Config, {{"use_sliding_window", true}, {"sliding_window", 512}}))
                .max_seq, 512);
  EXPECT_EQ(read_hf_config(config_path_with(dir, kQwen2Config,
                                            {{"sliding_window", 256}, {"layer_types", {"full_attention", "sliding_attention"}}}))
                .max_seq, 256);
  EXPECT_EQ(read_hf_config(config_path_with(dir, kMistralConfig, {{"sliding_window", nullptr}})).max_seq, 32768);
}

TEST(HfConfig, RefusesUnreadableFiles) {
  ScratchDir dir;
  expect_error([&] { (void)read_hf_config(dir.file("absent.json")); }, "config", {"absent.json", "no such file"});
  expect_error([&] { (void)read_hf_config(dir.path().string()); }, "config", {"is a directory"});
  const std::string empty = dir.file("empty.json");
  test::write_bytes(empty, "");
  expect_error([&] { (void)read_hf_config(empty); }, "config", {empty, "not valid JSON"});
  const std::string broken = dir.file("broken.json");
  test::write_bytes(broken, R"({"model_type": "gpt2",)");
  expect_error([&] { (void)read_hf_config(broken); }, "config", {broken, "not valid JSON"});
  const std::string array = dir.file("array.json");
  test::write_bytes(array, "[1, 2]");
  expect_error([&] { (void)read_hf_config(array); }, "config", {array, "JSON object"});
}

TEST(HfConfig, WritesAGpt2ConfigWithTheKeysHfReads) {
  const json j = gpt2_hf_config(model_preset("gpt2"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], 12);
  EXPECT_EQ(j["n_head"], 12);
  EXPECT_EQ(j["n_embd"], 768);
  EXPECT_EQ(j["n_positions"], 1024);
  EXPECT_EQ(j["n_ctx"], 1024);
  EXPECT_EQ(j["vocab_size"], 50257);  // the real vocabulary, not the padded 50304
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_EQ(j["layer_norm_epsilon"].get<double>(), 1e-5);  // the decimal, not fp32's 9.99999974e-06
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["resid_pdrop"], 0.0);
  EXPECT_EQ(j["embd_pdrop"], 0.0);
  EXPECT_EQ(j["attn_pdrop"], 0.0);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_NE(j.dump().find("\"layer_norm_epsilon\":1e-05"), std::string::npos) << j.dump();
}

TEST(HfConfig, WrittenConfigReadsBackToTheSameSpec) {
  ScratchDir dir;
  for (const char* preset : {"gpt2-tiny", "gpt2", "gpt2-xl"}) {
    SCOPED_TRACE(preset);
    const ModelSpec spec = model_preset(preset);
    const ModelSpec back = read_config_text(dir, gpt2_hf_config(spec).dump(2));
    EXPECT_EQ(back.arch, spec.arch);
    EXPECT_EQ(back.n_layer, spec.n_layer);
    EXPECT_EQ(back.n_head, spec.n_head);
    EXPECT_EQ(back.n_kv_head, spec.n_kv_head);
    EXPECT_EQ(back.n_embd, spec.n_embd);
    EXPECT_EQ(back.n_inner, spec.n_inner);
    EXPECT_EQ(back.vocab_size, spec.vocab_size);
    EXPECT_EQ(back.padded_vocab, spec.padded_vocab);
    EXPECT_EQ(back.max_seq, spec.max_seq);
    EXPECT_EQ(back.norm_eps, spec.norm_eps);
    EXPECT_EQ(back.tied_embeddings, spec.tied_embeddings);
    EXPECT_EQ(back.parameter_count(), spec.parameter_count());
  }
  ModelSpec narrow = model_preset("gpt2-tiny");
  narrow.n_inner = 300;
  EXPECT_EQ(gpt2_hf_config(narrow)["n_inner"], 300);
  EXPECT_EQ(read_config_text(dir, gpt2_hf_config(narrow).dump()).n_inner, 300);
}

TEST(HfConfig, WrittenLlamaConfigReadsBackToTheSameSpec) {
  ScratchDir dir;
  for (const std::string& text : {std::string(kLlama2Config), std::string(kMistralConfig), std::string(kQwen2Config)}) {
    const ModelSpec spec = read_config_text(dir, text, "published.json");
    SCOPED_TRACE(spec.name);
    const json written = hf_config(spec);
    EXPECT_EQ(written["model_type"], spec.qkv_bias ? "qwen2" : "llama");
    const ModelSpec back = read_config_text(dir, written.dump(2));
    EXPECT_EQ(back.arch, Arch::llama);
    EXPECT_EQ(back.n_layer, spec.n_layer);
    EXPECT_EQ(back.n_head, spec.n_head);
    EXPECT_EQ(back.n_kv_head, spec.n_kv_head);
    EXPECT_EQ(back.n_embd, spec.n_embd);
    EXPECT_EQ(back.n_inner, spec.n_inner);
    EXPECT_EQ(back.vocab_size, spec.vocab_size);
    EXPECT_EQ(back.max_seq, spec.max_seq);
    EXPECT_EQ(back.norm_eps, spec.norm_eps);
    EXPECT_EQ(back.rope_theta, spec.rope_theta);
    EXPECT_EQ(back.tied_embeddings, spec.tied_embeddings);
    EXPECT_EQ(back.qkv_bias, spec.qkv_bias);
    EXPECT_EQ(back.parameter_count(), spec.parameter_count());
  }
}

// transformers 5 writes rope_theta inside rope_parameters; Llama 3.1 scales its frequencies.
TEST(HfConfig, ReadsRotarySettingsOfEveryTransformersVersion) {
  ScratchDir dir;
  const char* base = R"({"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":64,)"
                     R"("intermediate_size":172,"vocab_size":1000,"max_position_embeddings":256})";
  auto read_with = [&](const json& patch) { return read_hf_config(config_path_with(dir, base, patch)); };
  ModelSpec s = read_with({{"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}}});
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.rope_type, "default");
  s = read_with({{"rope_theta", 250000.0}, {"rope_scaling", nullptr}});
  EXPECT_EQ(s.rope_theta, 250000.0f);
  EXPECT_EQ(s.rope_type, "default");
  const json llama3 = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  s = read_with({{"rope_theta", 500000.0}, {"rope_scaling", llama3}});
  EXPECT_EQ(s.rope_type, "llama3");
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_EQ(s.rope_scaling.factor, 8.0);
  EXPECT_EQ(s.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(s.rope_scaling.original_max_positions, 8192.0);
  json in_parameters = llama3;
  in_parameters["rope_theta"] = 500000.0;
  s = read_with({{"rope_parameters", in_parameters}});
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_EQ(s.rope_theta, 500000.0f);
  // Written back and read again: the same scaling.
  const ModelSpec back = read_hf_config(config_path_with(dir, llama_hf_config(s).dump().c_str(), json::object()));
  EXPECT_EQ(back.rope_type, "llama3");
  EXPECT_EQ(back.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(back.rope_scaling.original_max_positions, 8192.0);
  s = read_with({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}});
  EXPECT_EQ(s.rope_type, "linear");
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::linear);
  EXPECT_EQ(s.rope_scaling.factor, 2.0);
  s = read_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}});
  EXPECT_EQ(s.rope_type, "yarn");  // planned; the trainer refuses it
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::none);
  expect_error([&] { (void)read_with({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}}); }, "config",
               {"rope_type 'llama3' needs 'low_freq_factor'"});
  json inverted = llama3;
  inverted["high_freq_factor"] = 0.5;
  expect_error([&] { (void)read_with({{"rope_scaling", inverted}}); }, "config", {"high_freq_factor", "above"});
  expect_error([&] { (void)read_with({{"rope_parameters", 3}}); }, "config", {"rope_parameters", "object"});
}

TEST(HfConfig, RefusesToWriteAGpt2ConfigForLlama) {
  ScratchDir dir;
  const ModelSpec llama = read_config_text(dir, kLlama2Config);
  expect_error([&] { (void)gpt2_hf_config(llama); }, "config", {"llama", "gpt2"});
}

}  // namespace
}  // namespace memfit
