// Prepared oneDNN matmul primitives (see dnnl_matmul.hpp). The primitive descriptor is built
// the same way for the scratch query and for the primitive itself, so that the scratch the
// plan reserves is exactly what the primitive asks for.
#include "kernels/cpu/dnnl_matmul.hpp"

#include "core/error.hpp"
#include "core/library_scope.hpp"

namespace memfit {
namespace {

using dt = dnnl::memory::data_type;

dnnl::memory::desc strided_desc(const DnnlOperand& op) { return dnnl::memory::desc(op.dims, op.dt, op.strides); }

// The bias as a (1, ..., 1, N) tensor broadcast over every other dim of dst.
dnnl::memory::desc bias_desc(const DnnlMatmulSpec& spec) {
  const size_t rank = spec.dst.dims.size();
  MEMFIT_ASSERT(rank >= 2, "matmul operands have rank {}", rank);
  const int64_t n = spec.dst.dims[rank - 1];
  dnnl::memory::dims dims(rank, 1), strides(rank, n);
  dims[rank - 1] = n;
  strides[rank - 1] = 1;
  return dnnl::memory::desc(dims, spec.bias_dt, strides);
}

bool bias_needs_post_op(const DnnlMatmulSpec& spec) { return spec.bias && spec.scale != 1.0f; }

dnnl::matmul::primitive_desc make_pd(const DnnlEnv& env, const DnnlMatmulSpec& spec) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (spec.scale != 1.0f) attr.set_output_scales(0, {spec.scale});
  dnnl::post_ops po;
  // Order matters: the sum adds the old dst to scale*product first, then the bias is added,
  // which is the same value as scale*product + bias + old dst.
  if (spec.accumulate) po.append_sum(1.0f);
  if (bias_needs_post_op(spec)) po.append_binary(dnnl::algorithm::binary_add, bias_desc(spec));
  attr.set_post_ops(po);
  const auto src = strided_desc(spec.src), wei = strided_desc(spec.wei), dst = strided_desc(spec.dst);
  try {
    if (spec.bias && !bias_needs_post_op(spec))
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias_desc(spec), dst), attr, env.engine);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, env.engine);
  } catch (const dnnl::error& e) {
    throw Error("kernels", fmt::format("oneDNN has no matmul for this layout: {}", e.what()));
  }
}

}  // namespace

DnnlEnv DnnlEnv::make_cpu() {
  DnnlEnv env;
  env.engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
  env.stream = dnnl::stream(env.engine);
  return env;
}

DnnlOperand dnnl_matrix(int64_t rows, int64_t cols, bool transposed, dt type) {
  if (transposed) return DnnlOperand{{rows, cols}, {1, rows}, type};
  return DnnlOperand{{rows, cols}, {cols, 1}, type};
}

uint64_t DnnlMatmul::scratch_bytes(const DnnlEnv& env, const DnnlMatmulSpec& spec) {
  return make_pd(env, spec).scratchpad_desc().get_size();
}

DnnlMatmul::DnnlMatmul(const DnnlEnv& env, const DnnlMatmulSpec& spec)
    : env_(env), spec_(spec), pd_(make_pd(env, spec)), bias_as_post_op_(bias_needs_post_op(spec)) {
  prim_ = dnnl::matmul(pd_);
  scratch_bytes_ = pd_.scratchpad_desc().get_size();
}

int DnnlMatmul::bind(const void* src, const void* wei, const void* bias, void* dst, void* scratch) {
  MEMFIT_ASSERT(valid(), "bind on an empty DnnlMatmul");
  MEMFIT_ASSERT(scratch || scratch_bytes_ == 0, "matmul needs {} bytes of scratch and got none", scratch_bytes_);
  Bound b;
  auto add = [&](int arg, const dnnl::memory::desc& md, const void* ptr) {
    b.memories.emplace_back(md, env_.engine, const_cast<void*>(ptr));
    b.args[size_t(b.nargs++)] = dnnl_exec_arg_t{arg, b.memories.back().get()};
  };
  b.memories.reserve(b.args.size());
  add(DNNL_ARG_SRC, pd_.src_desc(), src);
  add(DNNL_ARG_WEIGHTS, pd_.weights_desc(), wei);
  add(DNNL_ARG_DST, pd_.dst_desc(), dst);
  if (spec_.bias) {
    MEMFIT_ASSERT(bias, "matmul with a bias bound without one");
    if (bias_as_post_op_)
      add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(spec_.accumulate ? 1 : 0) | DNNL_ARG_SRC_1, bias_desc(spec_), bias);
    else
      add(DNNL_ARG_BIAS, pd_.bias_desc(), bias);
  }
  if (scratch_bytes_ > 0) add(DNNL_ARG_SCRATCHPAD, pd_.scratchpad_desc(), scratch);
  bound_.push_back(std::move(b));
  return int(bound_.size() - 1);
}

// No stream wait follows: on the CPU engine with the OpenMP runtime, execution is synchronous
// and the primitive has finished when the call returns.
void DnnlMatmul::execute(int index) const {
  const Bound& b = bound_[size_t(index)];
  dnnl_status_t status;
  {
    LibraryCallScope scope;
    status = dnnl_primitive_execute(prim_.get(), env_.stream.get(), b.nargs, b.args.data());
  }
  MEMFIT_CHECK(status == dnnl_success, "kernels", "oneDNN matmul failed with status {}", int(status));
}

}  // namespace memfit
