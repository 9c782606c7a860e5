// libFuzzer target: the run-config reader (memfit's --config JSON and DeepSpeed keys) on
// arbitrary bytes, applied to a default RunConfig; refused inputs throw memfit::Error only.
#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "fuzz_input_file.hpp"
#include "train/run_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = memfit::fuzz::write_input(data, size, "-run.json");
  try {
    memfit::RunConfig config;
    memfit::apply_config_file(path, config);
  } catch (const memfit::Error&) {
  }
  return 0;
}
