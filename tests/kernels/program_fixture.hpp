// A hand-built Program with one std::vector of bytes per tensor, standing in for the planner
// and the arenas in backend tests: add tensors and ops, then prepare each op on a backend
// with a binding into these buffers (the scratch the backend asks for becomes a tensor too).
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "graph/program.hpp"
#include "kernels/backend.hpp"

namespace memfit::test {

class ProgramFixture {
 public:
  TensorId tensor(const std::string& name, Shape shape, DType dtype = DType::f32) {
    TensorDesc d;
    d.name = name;
    d.shape = std::move(shape);
    d.dtype = dtype;
    const TensorId id = program.add_tensor(d);
    buffers_.emplace_back(program.tensor(id).bytes() + 64, char(0));
    return id;
  }

  int op(OpKind kind, std::vector<TensorId> inputs, std::vector<TensorId> outputs, OpAttrs attrs = NoAttrs{},
         std::vector<WriteMode> modes = {}, std::vector<TensorId> workspace = {}) {
    Op o;
    o.kind = kind;
    o.name = std::string(op_kind_name(kind)) + "_" + std::to_string(program.ops().size());
    o.inputs = std::move(inputs);
    o.outputs = std::move(outputs);
    o.modes = std::move(modes);
    o.workspace = std::move(workspace);
    o.attrs = std::move(attrs);
    return program.add_op(std::move(o));
  }

  template <class T = float>
  T* data(TensorId id) {
    return id == kNoTensor ? nullptr : reinterpret_cast<T*>(buffers_[size_t(id)].data());
  }
  template <class T>
  void set(TensorId id, const std::vector<T>& values) {
    std::memcpy(data<T>(id), values.data(), values.size() * sizeof(T));
  }
  template <class T = float>
  std::vector<T> get(TensorId id) {
    const T* p = data<T>(id);
    return std::vector<T>(p, p + program.tensor(id).numel());
  }

  // Prepares op `index`, first giving it the scratch tensor the backend asks for as its last
  // (uint8) workspace tensor, as runtime/compile.cpp does.
  std::unique_ptr<PreparedOp> prepare(Backend& backend, int index) {
    if (const uint64_t bytes = backend.scratch_bytes(program, program.op(index)); bytes > 0) {
      const std::vector<TensorId>& ws = program.op(index).workspace;
      if (ws.empty() || program.tensor(ws.back()).dtype != DType::u8) {
        const TensorId s = tensor(program.op(index).name + ".scratch", Shape{int64_t(bytes)}, DType::u8);
        program.ops()[size_t(index)].workspace.push_back(s);
      }
    }
    const Op& o = program.op(index);
    OpBinding b;
    for (TensorId id : o.inputs) b.inputs.push_back(data(id));
    for (TensorId id : o.outputs) b.outputs.push_back(data(id));
    for (TensorId id : o.workspace) b.workspace.push_back(data(id));
    return backend.prepare(program, o, b);
  }

  Program program;

 private:
  std::vector<std::vector<char>> buffers_;
};

}  // namespace memfit::test
