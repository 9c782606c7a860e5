// libFuzzer target: SafetensorsReader on arbitrary bytes. Every input must either be refused
// with a memfit::Error or open as a file whose every tensor can be read without leaving the
// mapping; anything else (a crash, a sanitizer report, another exception type) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "fuzz_input_file.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = memfit::fuzz::write_input(data, size, ".safetensors");
  try {
    const memfit::SafetensorsReader reader(path);
    std::vector<float> values;
    for (const memfit::SafetensorsEntry& e : reader.entries()) {
      if (!e.supported || !memfit::dtype_is_float(e.dtype) || e.shape.numel() > (int64_t(1) << 20)) continue;
      values.assign(size_t(e.shape.numel()), 0.0f);
      reader.read_f32(e.name, e.shape, values.data());
      if (e.shape.rank() == 2) reader.read_f32(e.name, e.shape, values.data(), /*transpose2d=*/true);
    }
  } catch (const memfit::Error&) {
  }
  return 0;
}
