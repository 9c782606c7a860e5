// --quantize-base nf4|fp4|int8 (QLoRA's frozen base): a forward rewrite (forward_rewrite.hpp)
// that stores every frozen linear weight of the blocks quantised and computes its products
// from the quantised form.
//   declare  each frozen 2-D weight other than the embeddings and the output head (which
//            transformers + bitsandbytes keep unquantised) is stored as codes (its old tensor
//            id, so every op that named the weight names its codes), scales and, with double
//            quantisation, scales2 and offset; it has no value tensor. A fused weight is
//            stored as the HF tensors it was made of (Llama's q/k/v), each quantised on its own.
//   rewrite  a matmul x W^T (+ bias) reading such a weight becomes a quant_linear, which
//            dequantises a tile of W's rows at a time into a planned workspace; autodiff
//            gives it an input-gradient product only.
// Invariant: the stored bytes of a quantised weight are segmented_quant_storage() of its
// format (kernels/quant/quant_segments.hpp), and nothing holds the whole dequantised weight.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "graph/forward_rewrite.hpp"

namespace memfit {

// How one quantised weight is stored (kept by the pass for its rewrites; also what the
// initialisation, --load and tests need to fill or read the storage).
struct QuantizedParam {
  QuantSpec spec;
  DType weight_dtype = DType::f32;  // the values are rounded to it before quantising
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> segments;  // rows of each separately quantised piece
  TensorId codes = kNoTensor, scales = kNoTensor, scales2 = kNoTensor, offset = kNoTensor;
};

// The pieces a weight is quantised as: its HF tensors. Llama's fused qkv_proj is q, k and v
// (q's rows are o_proj's columns); every other weight is one piece.
std::vector<int64_t> hf_segments_of(const Program& p, const ParamEntry& e);

// The quantised layout of a parameter stored by this pass, read back from its storage records
// and the attributes of the quant_linear ops that read it; codes == kNoTensor for any other.
QuantizedParam quantized_param_of(const Program& p, const ParamEntry& e);


// Rows of W a quant_linear dequantises at once: about 4 Mi elements of the tile, in rows of 16.
int64_t quant_tile_rows(int64_t rows, int64_t cols);

std::shared_ptr<ForwardRewrite> make_quantize_base_pass(const BaseQuantPolicy& q, DType compute);

}  // namespace memfit
