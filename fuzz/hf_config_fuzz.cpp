// libFuzzer target: read_hf_config on arbitrary bytes; a config either yields a spec that
// validates and writes back to a config.json, or is refused with a memfit::Error.
#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "fuzz_input_file.hpp"
#include "io/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = memfit::fuzz::write_input(data, size, "-config.json");
  try {
    const memfit::ModelSpec spec = memfit::read_hf_config(path);
    (void)spec.parameter_count();
    (void)memfit::hf_config(spec).dump();
  } catch (const memfit::Error&) {
  }
  return 0;
}
