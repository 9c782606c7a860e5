// The one place a backend is chosen by name (the --backend flag and the config key `backend`
// of train, plan and max-batch all come here).
#include "kernels/backend.hpp"

#include "core/error.hpp"

namespace memfit {

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "reference") return make_reference_backend();
  std::string known;
  for (std::string_view n : kBackendNames) known += fmt::format("{}{}", known.empty() ? "" : ", ", n);
  throw Error("kernels", fmt::format("unknown backend '{}' (backends: {})", name, known));
}

}  // namespace memfit
