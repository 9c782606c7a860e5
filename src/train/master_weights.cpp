#include "train/master_weights.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace memfit {

namespace {

void narrow_into(void* dst, DType dtype, const float* src, int64_t n) {
  const bool ok = visit_float_type(dtype, [&](auto t) {
    using T = decltype(t);
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = narrow<T>(src[i]);
  });
  MEMFIT_ASSERT(ok, "parameter of dtype {}", dtype_name(dtype));
}

// Values exist as floats only for parameters stored as one value tensor (graph/program.hpp);
// quantised storage is read through the ops a forward rewrite emits.
void require_plain_storage(const ParamEntry& e) {
  MEMFIT_CHECK(e.plain_storage(), "train", "parameter '{}' is stored as {} tensors ({} first): its values cannot be "
               "initialised, loaded or saved as floats yet", e.name, e.storage.size(),
               e.storage.empty() ? "none" : param_role_name(e.storage[0].role));
}

}  // namespace

float* fp32_values(const Executor& ex, const ParamEntry& e) {
  require_plain_storage(e);
  const Program& p = ex.program();
  if (e.value_shard != kNoTensor) return nullptr;  // ZeRO-3: no whole copy of the parameter persists
  if (e.master != kNoTensor && e.whole_state()) return ex.data_as<float>(e.master);
  if (e.master != kNoTensor) return nullptr;  // a ZeRO piece: the values live in the parameter
  return p.tensor(e.value).dtype == DType::f32 ? ex.data_as<float>(e.value) : nullptr;
}

void store_parameter(const Executor& ex, const ParamEntry& e, const float* values) {
  require_plain_storage(e);
  const TensorDesc& t = ex.program().tensor(e.value);
  if (e.master != kNoTensor && ex.data_as<float>(e.master) != values) {
    if (e.whole_state()) std::memcpy(ex.data(e.master), values, size_t(t.numel()) * sizeof(float));
    else if (e.shard_numel > 0)
      std::memcpy(ex.data(e.master), values + e.shard_offset, size_t(e.shard_numel) * sizeof(float));
  }
  if (e.value_shard != kNoTensor) {  // ZeRO-3: only this rank's piece persists
    narrow_into(ex.data(e.value_shard), t.dtype, values + e.shard_offset, e.shard_numel);
    return;
  }
  if (e.shard_numel == 0 && ex.program().tensor(e.value).is_view() &&
      ex.program().tensor(ex.program().root_of(e.value)).category == Category::communication)
    return;  // ZeRO-3 and this rank holds no piece of it
  if (ex.data_as<float>(e.value) != values) narrow_into(ex.data(e.value), t.dtype, values, t.numel());
}

std::vector<float> load_parameter(const Executor& ex, const ParamEntry& e) {
  require_plain_storage(e);
  const TensorDesc& t = ex.program().tensor(e.value);
  MEMFIT_CHECK(ex.program().tensor(ex.program().root_of(e.value)).category != Category::communication, "train",
               "parameter '{}' is sharded by ZeRO-3: whole weights cannot be read or saved yet (use --checkpoint-dir)",
               e.name);
  if (const float* home = fp32_values(ex, e)) return std::vector<float>(home, home + t.numel());
  std::vector<float> out(size_t(t.numel()));
  visit_float_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* s = ex.data_as<const T>(e.value);
    for (size_t i = 0; i < out.size(); ++i) out[i] = widen(s[i]);
  });
  return out;
}

void narrow_masters_into_parameters(const Executor& ex) {
  for (const ParamEntry& e : ex.program().params()) {
    if (e.master == kNoTensor) continue;
    if (e.whole_state()) {
      store_parameter(ex, e, ex.data_as<float>(e.master));
    } else if (e.shard_numel > 0) {  // a ZeRO piece narrows into its slice of the parameter
      const DType dt = ex.program().tensor(e.value).dtype;
      std::byte* to = e.value_shard != kNoTensor ? ex.data(e.value_shard) : ex.data(e.value) + dtype_bytes(dt, e.shard_offset);
      narrow_into(to, dt, ex.data_as<float>(e.master), e.shard_numel);
    }
  }
}

}  // namespace memfit
