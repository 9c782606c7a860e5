#include "runtime/compile.hpp"

#include <algorithm>

namespace memfit {

void attach_backend_scratch(Program& p, const Backend& backend) {
  std::vector<uint64_t> bytes(p.ops().size());
  uint64_t largest = 0;
  for (size_t i = 0; i < p.ops().size(); ++i) largest = std::max(largest, bytes[i] = backend.scratch_bytes(p, p.op(int(i))));
  if (largest == 0) return;
  // One scratch shared by every op that needs one (ops run one at a time), persistent and so
  // laid out at the bottom of the arena: its size is what the library asks for, but the
  // library may leave the end of it untouched, and it must never be what sets the peak.
  TensorDesc d;
  d.name = "library.scratch";
  d.shape = Shape{int64_t(largest)};
  d.dtype = DType::u8;
  d.category = Category::temporaries;
  d.lifetime = Lifetime::persistent;
  const TensorId id = p.add_tensor(std::move(d));
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (bytes[i] > 0) p.ops()[i].workspace.push_back(id);
}

CompiledProgram compile_program(Program program, const Backend& backend) {
  attach_backend_scratch(program, backend);
  program.validate();
  MemoryPlan plan = plan_memory(program);
  return CompiledProgram{std::move(program), std::move(plan)};
}

}  // namespace memfit
