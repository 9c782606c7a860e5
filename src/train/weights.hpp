// Model weights in HF's safetensors layout, for GPT-2 and the llama family.
// GPT-2: memfit keeps linear weights [out, in]; HF's Conv1D weights are stored [in, out], so
// attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are transposed on the way in and
// out. Names are accepted with or without the "transformer." prefix (the hub's gpt2 checkpoint
// has none); saved files use the prefix, as HF's save_pretrained does.
// Llama: HF names ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"); memfit's fused
// q|k|v projection is read from and written as HF's q_proj, k_proj and v_proj (the rows in that
// order), and names without the "model." prefix (a bare LlamaModel) are accepted.
// A saved directory also gets a config.json, so it loads with from_pretrained.
// Values move between the file and the executor's tensors a TensorStaging chunk at a time
// (Executor::read / write, never an address into a tier), so loading or saving a parameter of
// any size adds at most the staging buffer to host memory.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "graph/model_spec.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

inline constexpr uint64_t kDefaultShardBytes = 5'000'000'000;  // transformers' max_shard_size "5GB"

// Loads every parameter from a .safetensors file, an HF sharded checkpoint's index.json, or a
// directory holding either (io/safetensors_shards.hpp); bf16, fp16 and fp32 files are converted
// to the run's precision. The embedding table's padded rows are zeroed. Throws [safetensors] naming a missing or
// mis-shaped tensor, or a tensor the model does not have.
// `start`: an OLoRA / PiSSA start (train/lora_base_start.hpp), made as a quantised base is quantised.
class BaseStart;
void load_weights(const std::string& path, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                  BaseStart* start = nullptr);

// Writes the parameters: into DIR plus DIR/config.json when `path` is a directory (created if
// needed): model.safetensors, or transformers' shards and index when the model exceeds
// max_shard_bytes (HF's default 5 GB); or into `path` itself when it ends in .safetensors.
// Writes are atomic, so an earlier file at the same path survives a failed save.
// `whole`, when given, holds every parameter's fp32 values (indexed like Program::params():
// train/whole_weights.hpp gathers them under ZeRO); otherwise they are read from the executor.
void save_weights(const std::string& path, const Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                  const std::vector<std::vector<float>>* whole = nullptr,
                  uint64_t max_shard_bytes = kDefaultShardBytes);

// save_weights from any source of whole-parameter values (memfit consolidate reads them from a
// checkpoint): `params` names each parameter (memfit's name) and its shape, in program order;
// values(i, first, out) fills elements [first, first + out.size()) of parameter i as fp32,
// called once per HF tensor in the order the file is written, a staging chunk at a time.
struct SavedParam {
  std::string name;
  Shape shape;
};
using ParamRange = std::function<void(size_t param, int64_t first, std::span<float> out)>;
void save_weights_from(const std::string& path, const std::vector<SavedParam>& params, const ModelSpec& spec,
                       TensorStaging& staging, const ParamRange& values,
                       uint64_t max_shard_bytes = kDefaultShardBytes);

// One HF tensor holding `rows` consecutive rows of a memfit parameter: the whole parameter,
// except llama's fused q|k|v projection, which HF keeps as q_proj, k_proj and v_proj.
struct HfPiece {
  std::string name;  // canonical HF name: GPT-2 without "transformer.", llama with "model."
  int64_t rows = 0;  // rows of the parameter (of the real vocabulary for embedding tables)
};
std::vector<HfPiece> hf_pieces(const ModelSpec& spec, const std::string& param, const Shape& shape);

// A parameter's one-rank shape: the global shape of a tensor-parallel slice.
Shape one_rank_shape(const Program& p, const ParamEntry& e);
// Stores elements [first, first + values.size()) of the one-rank parameter e: under tensor
// parallelism only those this rank's slice holds.
void store_one_rank_range(Executor& ex, const ParamEntry& e, int64_t first, std::span<const float> values,
                          TensorStaging& staging);

// True for HF GPT-2 Conv1D weights, which are stored transposed.
bool is_conv1d_weight(const std::string& name);

}  // namespace memfit
