#include "runtime/compile.hpp"

namespace memfit {

void attach_backend_scratch(Program& p, const Backend& backend) {
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const uint64_t bytes = backend.scratch_bytes(p, p.op(int(i)));
    if (bytes == 0) continue;
    TensorDesc d;
    d.name = p.op(int(i)).name + ".scratch";
    d.shape = Shape{int64_t(bytes)};
    d.dtype = DType::u8;
    d.category = Category::temporaries;
    d.layer = p.op(int(i)).layer;
    const TensorId id = p.add_tensor(std::move(d));
    p.ops()[i].workspace.push_back(id);
  }
}

CompiledProgram compile_program(Program program, const Backend& backend) {
  attach_backend_scratch(program, backend);
  program.validate();
  MemoryPlan plan = plan_memory(program);
  return CompiledProgram{std::move(program), std::move(plan)};
}

}  // namespace memfit
