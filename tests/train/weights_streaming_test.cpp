// --save and --load stream each parameter through the run's TensorStaging in chunks
// (train/weights.cpp). With 512 channels a Conv1D weight spans several chunks, so every chunk
// boundary of the transposed and the in-order paths is crossed. Oracles: the safetensors
// reader's own whole-tensor read (with its own transpose) must give back the masters the
// executor held, bit for bit; and loading that file into a fresh executor must reproduce the
// masters and their bf16 rounding bit for bit, padded vocabulary rows at zero.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <vector>

#include "graph/training_program.hpp"
#include "io/safetensors.hpp"
#include "kernels/backend.hpp"
#include "support/run_cli.hpp"
#include "support/tensor_values.hpp"
#include "train/init.hpp"
#include "train/weights.hpp"

namespace memfit {
namespace {

ModelSpec wide_spec() {
  ModelSpec spec = model_preset("gpt2-tiny");
  spec.n_layer = 1;
  spec.n_head = 8;
  spec.n_kv_head = 8;
  spec.n_embd = 512;
  spec.n_inner = 4 * 512;
  spec.vocab_size = 1000;
  spec.padded_vocab = pad_vocab(1000);  // 1024: padded rows that are not saved
  spec.max_seq = 64;
  spec.validate();
  return spec;
}

struct Bf16Run {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  CompiledProgram compiled;
  std::unique_ptr<Executor> ex;
  explicit Bf16Run(const ModelSpec& spec) {
    Policy pol;
    pol.batch = 1;
    pol.seq = 16;
    pol.precision = Precision::bf16;
    pol.with_eval = false;
    compiled = compile_program(build_training_program(spec, pol, {}, cpu_capabilities()), *backend);
    ex = std::make_unique<Executor>(compiled, *backend);
  }
};

TEST(WeightsStreaming, SavedFileHoldsTheMastersAndLoadsBackBitForBit) {
  const ModelSpec spec = wide_spec();
  const int64_t c_fc = spec.n_embd * spec.n_inner;
  ASSERT_GT(c_fc, 2 * int64_t(TensorStaging::kElements)) << "a Conv1D weight must span several staging chunks";
  TensorStaging staging;
  Bf16Run saved(spec);
  initialize_parameters(*saved.ex, spec, 5, staging);
  const std::string file = test::temp_dir() + "/model.safetensors";
  save_weights(file, *saved.ex, spec, staging);

  const Program& p = saved.compiled.program;
  const SafetensorsReader reader(file);
  int compared = 0;
  for (const ParamEntry& e : p.params()) {
    ASSERT_NE(e.master, kNoTensor) << e.name;
    const std::vector<float> master = test::tensor_values<float>(*saved.ex, e.master);
    const TensorDesc& t = p.tensor(e.value);
    const bool transpose = is_conv1d_weight(e.name);
    const int64_t rows = e.name == "wte.weight" ? spec.vocab_size : t.shape[0], row_size = t.numel() / t.shape[0];
    const Shape shape =
        transpose ? Shape{t.shape[1], t.shape[0]} : t.shape.rank() == 1 ? Shape{rows} : Shape{rows, row_size};
    std::vector<float> file_values(size_t(rows * row_size));
    reader.read_f32("transformer." + e.name, shape, file_values.data(), transpose);
    for (size_t i = 0; i < file_values.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(file_values[i]), std::bit_cast<uint32_t>(master[i])) << e.name << " " << i;
    ++compared;
  }
  EXPECT_EQ(compared, int(p.params().size()));

  Bf16Run loaded(spec);
  load_weights(file, *loaded.ex, spec, staging);
  for (const ParamEntry& e : p.params()) {
    EXPECT_EQ(test::tensor_bytes(*loaded.ex, e.master), test::tensor_bytes(*saved.ex, e.master)) << e.name;
    EXPECT_EQ(test::tensor_bytes(*loaded.ex, e.value), test::tensor_bytes(*saved.ex, e.value)) << e.name;
  }
  const std::vector<float> wte = test::tensor_values<float>(*loaded.ex, p.find_tensor("master.wte.weight"));
  for (size_t i = size_t(spec.vocab_size * spec.n_embd); i < wte.size(); ++i) ASSERT_EQ(wte[i], 0.0f) << i;
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace memfit
