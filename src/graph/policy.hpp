// Policy: how a model is trained (precision, recomputation, attention kind, batch shape,
// accumulation, optimizer, sharding, offload). Every field is a transformation of the step
// program; the builder rejects combinations it cannot express yet with a clear [graph] error.
// Topology: where the program runs (data- and tensor-parallel degrees, this rank).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "graph/tensor.hpp"

namespace memfit {

enum class Precision : uint8_t { fp32, bf16, fp16 };
enum class AttentionKind : uint8_t { plain, flash };
enum class OptimizerKind : uint8_t { adamw, adamw8bit };
enum class RecomputeMode : uint8_t { none, full, every, selective, automatic };

std::string_view precision_name(Precision p);
Precision parse_precision(std::string_view s);
std::string_view attention_name(AttentionKind a);
AttentionKind parse_attention(std::string_view s);
std::string_view optimizer_name(OptimizerKind o);
OptimizerKind parse_optimizer(std::string_view s);

// What one transformer block keeps for backward; every recompute mode expands to one per
// block (graph/recompute.hpp), and `auto` is resolved to such a list by a planner search.
struct BlockRecompute {
  bool whole = false;           // re-run the block's forward ops from its input in backward
  bool keep_input = true;       // the residual stream entering the block stays live until backward
  bool attention = false;       // selective: the attention core's probabilities (plain form)
  bool mlp_activation = false;  // selective: the GELU output
  bool norms = false;           // selective: the layernorm outputs
  bool operator==(const BlockRecompute&) const = default;
};

struct RecomputePolicy {
  RecomputeMode mode = RecomputeMode::none;
  int every = 0;                  // every:K keeps the input of every K-th block
  std::vector<std::string> ops;   // selective: which ops are recomputed
  std::vector<BlockRecompute> blocks;  // auto: the choice of the search, one per block (empty until resolved)
  std::string to_string() const;
};
RecomputePolicy parse_recompute(std::string_view s);
std::string blocks_to_string(const std::vector<BlockRecompute>& blocks);  // "full x2,attention x10"
// The inverse of blocks_to_string; throws [policy] naming `whole_text` on anything else.
std::vector<BlockRecompute> blocks_from_string(std::string_view text, std::string_view whole_text);

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  float weight_decay = 0.01f;  // PyTorch's default; applied to matrices and embeddings only
};

// LoRA (graph/lora.hpp): every base parameter frozen, low-rank adapters A [r, in], B [out, r]
// on the targeted linear layers, y = x W^T + scale * dropout(x) A^T B^T, scale alpha / r
// (alpha / sqrt(r) with rsLoRA). PEFT's
// LoraConfig gives the defaults (alpha 8, dropout 0, bias none).
enum class LoraBias : uint8_t { none, all, lora_only };
std::string_view lora_bias_name(LoraBias b);
LoraBias parse_lora_bias(std::string_view s);  // PEFT's "none" | "all" | "lora_only"; throws [policy]
// PEFT's init_lora_weights: true (A Kaiming-uniform, B zero: the run starts at the base model),
// "gaussian" (A normal with std 1 / r, B zero) or false (A and B as nn.Linear draws them,
// U(+-1/sqrt(fan_in)): the run starts away from the base).
// "olora" and "pissa" / "pissa_niter_N" (LoraPolicy::pissa_niter) take the adapters from the base
// weight and leave its residual in the base (train/lora_base_start.hpp).
enum class LoraInit : uint8_t { peft_default, gaussian, random, olora, pissa };
struct LoraPolicy {
  int64_t rank = 0;  // 0: no LoRA
  double alpha = 8;
  double dropout = 0;
  // Module names matched against the last components of a linear layer's name ("q_proj",
  // "self_attn.q_proj") or "all-linear" (every linear but the output head); empty: PEFT's
  // default for the architecture. target_regex (PEFT's string form) full-matches the module
  // path instead.
  std::vector<std::string> targets;
  std::string target_regex;
  LoraBias bias = LoraBias::none;
  LoraInit init = LoraInit::peft_default;
  int pissa_niter = -1;  // LoraInit::pissa: -1 for "pissa" (the exact top r), N for "pissa_niter_N"
  // pissa_niter_N's Gaussian start is drawn from this seed (the training run's, which memfit
  // records in the adapter's config as "memfit_start_seed"); -1: the run's --seed.
  int64_t start_seed = -1;
  // PEFT's use_rslora (Kalajdzievski 2023): the branch is scaled by alpha / sqrt(r), which
  // keeps its output's size from shrinking as the rank grows.
  bool rslora = false;
  // PEFT's use_dora (Liu et al. 2024, DoRA): each target's output columns are rescaled by a
  // trained magnitude over ||W + scale B A|| (held constant in the backward), i.e. the
  // adapted weight's direction and size train apart.
  bool dora = false;
  // PEFT's modules_to_save: modules trained whole beside the adapters (an output head,
  // embeddings, norms), matched as PEFT matches them: a module whose path ends with the name.
  std::vector<std::string> modules_to_save;
  // PEFT's exclude_modules (names, or a regular expression full-matching the module path) and
  // layers_to_transform (layer indices; layers_pattern names the layer list, any when empty).
  std::vector<std::string> exclude_modules;
  std::string exclude_regex;
  std::vector<int64_t> layers_to_transform;
  std::vector<std::string> layers_pattern;
  // PEFT's rank_pattern and alpha_pattern: a module whose HF path ("model.layers.0.mlp.up_proj")
  // matches "(.*\.)?(KEY)$" takes KEY's rank or alpha, the others r and lora_alpha. Two keys
  // matching one module are refused (PEFT would take the first in its dict's order).
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  bool enabled() const { return rank > 0; }
  int64_t rank_of(const std::string& hf_path) const;
  double scale_of(const std::string& hf_path) const;
};
// PEFT's init_lora_weights value ("true", "gaussian", "false", "olora", "pissa", "pissa_niter_4"),
// and its parse into `l` (false for a name memfit does not build; throws [policy] for a bad N).
std::string lora_init_name(const LoraPolicy& l);
bool parse_lora_init(std::string_view s, LoraPolicy& l);

// Frozen base weights stored quantised (QLoRA; kernels/quant/quant_format.hpp has the formats).
enum class BaseQuant : uint8_t { none, nf4, fp4, int8 };
std::string_view base_quant_name(BaseQuant q);
BaseQuant parse_base_quant(std::string_view s);  // none | nf4 | fp4 | int8; throws [policy]
struct BaseQuantPolicy {
  BaseQuant kind = BaseQuant::none;
  int64_t block = 64;         // bitsandbytes' default blocksize
  bool double_quant = false;  // bnb's compress_statistics (4-bit kinds)
  bool enabled() const { return kind != BaseQuant::none; }
};

struct Policy {
  int64_t batch = 4;    // micro-batch rows (B)
  int64_t seq = 64;     // sequence length (T)
  int grad_accum = 1;   // micro-steps per optimizer step
  Precision precision = Precision::fp32;
  DType grad_dtype = DType::f32;          // dtype of the parameter gradients (bf16/fp16 runs)
  std::vector<std::string> fp32_ops;      // ops computed in fp32 under bf16/fp16: kind names,
                                          // op names, or name prefixes ending in '*'
  RecomputePolicy recompute;
  std::vector<std::string> freeze;  // glob patterns (fnmatch) over parameter names: frozen parameters
  LoraPolicy lora;
  BaseQuantPolicy quantize_base;
  AttentionKind attention = AttentionKind::plain;
  OptimizerKind optimizer = OptimizerKind::adamw;
  AdamWConfig adamw;
  double grad_clip = 0;  // > 0: clip gradients to this global norm (DeepSpeed gradient_clipping)
  bool update_in_backward = false;  // update each parameter in the backward (graph/update_in_backward.hpp)
  int zero_stage = 0;
  // ZeRO++ qwZ (DeepSpeed's zero_quantized_weights, stage 3): parameter shards all-gathered as
  // blockwise int8 with fp32 scales, decoded on arrival (graph/zero.hpp).
  bool zero_quantized_weights = false;
  // Tensor parallelism's sequence parallelism (Korthikanti et al. 2022): the norms and residual
  // stream hold 1/T of the rows on each tensor rank (graph/tensor_parallel.hpp).
  bool sequence_parallel = false;
  bool overlap_comm = true;  // collectives run asynchronously, overlapping compute (graph/schedule_async.hpp)
  Tier offload_optimizer = Tier::device;
  Tier offload_params = Tier::device;
  int64_t offload_chunk_elements = 0;  // optimizer offload's staging chunk (graph/offload.hpp); 0: the default
  int64_t classifier_chunk_rows = 0;  // 0: chosen by the builder (logits chunk of at most 128 MiB)
  bool with_eval = true;              // add the "eval" section (validation loss)
  // > 0: add the "generate" section (graph/inference_program.hpp) for a prompt of this many
  // tokens and a KV cache of sample_capacity positions (train --sample-every).
  int64_t sample_prompt = 0, sample_capacity = 0;
  // ZeRO++ qgZ (DeepSpeed's zero_quantized_gradients, stages 2-3): each bucket's gradient
  // reduce-scatter becomes blockwise int4 (or int8) all-to-alls, one inside each node and one
  // across nodes, summed in fp32 between them (graph/zero_qgz.cpp).
  bool zero_quantized_gradients = false;
  int zero_quantized_gradient_bits = 4;
  // ZeRO++ hpZ (DeepSpeed's zero_hpz_partition_size, stage 3): a secondary copy of the
  // parameters partitioned over groups of this many consecutive data-parallel ranks, so the
  // backward's gathers stay inside the group (graph/zero.hpp). 1, or the data degree: off.
  int zero_hpz_partition_size = 1;
};

// world = data x tensor ranks. Tensor-parallel ranks are adjacent, as Megatron lays them out:
// rank r holds tensor slice r % tensor of replica r / tensor; the data group of r is the
// ranks with its tensor rank (ZeRO shards over it), its tensor group the ranks of its replica.
struct Topology {
  int data = 1;    // data-parallel degree
  int tensor = 1;  // tensor-parallel degree
  int rank = 0;    // in the world
  int world() const { return data * tensor; }
  int data_rank() const { return rank / tensor; }
  int tensor_rank() const { return rank % tensor; }
  int ranks_per_node = 0;  // consecutive world ranks per node; 0: every rank on one node
  // Data-parallel ranks per node (qgZ's first hop): data ranks d and e share a node when d / it
  // == e / it. The data degree when everything is on one node.
  int data_per_node() const { return ranks_per_node <= 0 ? data : std::max(1, std::min(data, ranks_per_node / tensor)); }
};

}  // namespace memfit
