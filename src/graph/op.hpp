// Ops of a step program. Each op names its input and output tensors; the order of ops in a
// Program is the execution order. The tensor conventions of every kind are listed below and
// are the contract between builders (graph/), the planner (plan/) and kernels (kernels/).
//
// Shapes: B batch, T sequence, C channels, NH heads, HS head size, V vocabulary (padded Vp),
// N rows (B*T), L layers.
//
// Dtypes (graph/precision.hpp): float tensors are fp32, or 16-bit under a bf16/fp16 policy,
// except these slots, fp32 whatever the policy: layernorm_forward's mean and rstd,
// rmsnorm_forward's rstd, flash_attention_forward's lse, classifier losses, loss_mean's input
// and output, check_finite's and grad_norm's outputs, and every float workspace. Kernels
// compute in fp32 and accumulate every product and reduction in fp32.
//
// Loss scaling: the classifier multiplies d(loss)/d(logits) by StepContext::loss_scale;
// every optimizer-section kernel (adamw, adamw8bit, grad_norm) divides the gradients it
// reads by it before using them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/dropout_mask.hpp"
#include "graph/quant_layout.hpp"
#include "graph/tensor.hpp"

namespace memfit {

enum class Phase : uint8_t { forward, backward, recompute, optimizer, communication, transfer };
inline constexpr int kNumPhases = 6;
std::string_view phase_name(Phase p);

enum class OpKind : uint16_t {
  // --- data ---
  load_input,          // out [tokens (B,T) i32, targets (B,T) i32]; filled by the host (data loader)
  // --- forward / backward kernels ---
  embedding_forward,   // in [tokens, wte (Vp,C), wpe (Tmax,C)] out [x (B,T,C)]; llama: in [tokens, wte]
                       //   (rotary positions, no table)
  embedding_backward,  // in [dx, tokens] out [dwte, dwpe]; llama: out [dwte] (EmbeddingAttrs: dwte has the
                       //   slice's rows)
  layernorm_forward,   // in [x (N,C), w (C), b (C)] out [y (N,C), mean (N), rstd (N)]
  layernorm_backward,  // in [dy, x, w, mean, rstd] out [dx, dw, db]
  rmsnorm_forward,     // in [x (N,C), w (C)] out [y (N,C), rstd (N)]
  rmsnorm_backward,    // in [dy, x, w, rstd] out [dx, dw]
  matmul,              // in [A, B, (bias)] out [C]: C = alpha * op(A) @ op(B) (+ bias); MatmulAttrs
  bias_grad,           // in [dy (M,N)] out [db (N)]: column sums
  gelu_forward,        // in [x] out [y]                 (tanh form)
  gelu_backward,       // in [dy, x] out [dx]            dx may overwrite dy
  swiglu_forward,      // in [gate (N,F), up (N,F)] out [y = silu(gate) * up]
  swiglu_backward,     // in [dy, gate, up] out [dgate, dup]
  rope_forward,        // in [qkv (B,T,(NH+2KV)HS)] out [y]: q and k heads rotated, v copied;
                       //   AttentionAttrs; y may overwrite qkv (the rotation is linear: no saved input)
  rope_backward,       // in [dy] out [dx]: the inverse rotation; dx may overwrite dy
  attention_forward,   // in [qkv (B,T,3C)] out [y (B,T,C), probs (B,NH,T,T)]   causal, plain form;
                       //   grouped-query (kv_heads < heads): qkv is (B,T,(NH+2KV)HS);
                       //   y may be kNoTensor (probabilities recomputed for the backward)
  attention_backward,  // in [dy, qkv, probs] out [dqkv]  workspace [dprobs (B,NH,T,T)]
  flash_attention_forward,   // in [qkv] out [y, lse (B,NH,T) fp32]   causal, no T x T tensor
  flash_attention_backward,  // in [dy, qkv, y, lse] out [dqkv]; the kernel's tiles and its per-row
                             //   D = rowsum(dy * y) live in the backend's library scratch
  add,                 // in [a, b] out [y = a + b]      y may overwrite a or b
  add_columns,         // in [a (M,N), d (M,W)] out [y (M,N)]: y = a, then y[:, begin:begin+W] += d;
                       //   ColumnsAttrs; y may overwrite a (a LoRA branch on one part of a fused
                       //   projection, e.g. q_proj's rows of llama's qkv weight)
  slice_columns,       // in [x (M,N)] out [y (M,W)]: y = x[:, begin:begin+W] (y += in accumulate modes)
  dora_norm,           // in [W (N,K), A (r,K), B (R,r)] out [norm (R) fp32]: norm[j] = the 2-norm of row
                       //   row_begin + j of W + scale B A; DoraNormAttrs. DoRA's ||W + dW||, held constant
                       //   in the backward (no gradient flows through it). A quantised W: in [codes,
                       //   scales, (scales2, offset), A, B] (DoraNormAttrs::quantized)
  dora_scale,          // in [z (M,N), (m (W_i), norm (W_i)) per block, (bias (N))] out [y (M,N)]: y = z,
                       //   then y[:, block] = (z[:, block] - bias) * m / norm + bias; DoraScaleAttrs
  dora_scale_backward,  // in [dy, z, (m, norm) per block, (bias)] out [dz, dm per block, (db)]: dz = dy,
                       //   then dz[:, block] *= m / norm; dm = column sums of dy (z - bias) / norm over the
                       //   block; a trained bias's db = column sums of dy (1 - m / norm) in the blocks, 0
                       //   elsewhere (the rest of its gradient comes through dz); dz may overwrite dy
  dora_blend,          // in [y0 (M,N), (m (W_i), norm (W_i), p_i (M,W_i), q_i (M,W_i)) per block]
                       //   out [y (M,N), z_i (M,W_i) per block]: DoRA with dropout (PEFT's form, where the
                       //   dropped input has its own base product): y = y0, then y[:, block] += (m / norm - 1)
                       //   p + (m / norm) q, and z = p + q (all the backward keeps); p = dropout(x) W^T (no
                       //   bias), q = scale dropout(x) A^T B^T; DoraScaleAttrs; y may overwrite y0, z p
  dora_blend_backward,  // in [dy, (m, norm, z) per block] out [(dp, dq, dm) per block]: dp = dy[:, block]
                       //   (m / norm - 1), dq = dy[:, block] m / norm, dm = column sums of dy[:, block] z /
                       //   norm (y0's gradient is dy itself)
  dropout_forward,     // in [x] out [y]: y = x * keep / (1 - p), keep drawn per element from a
                       //   counter-based hash of (run seed, step, micro-step, salt, index); DropoutAttrs
  dropout_backward,    // in [dy] out [dx]: dx = dy * keep / (1 - p), the same keep (no mask is stored);
                       //   dx may overwrite dy
  accumulate,          // in [x] out [y]: y = x (overwrite) or y += x (accumulate)
  classifier,          // in [x (N,C), wte (Vp,C), targets (N)] out [losses (N), dx (N,C), dwte]
                       //   fused logits + softmax + cross-entropy + gradient, chunked over rows;
                       //   workspace [logits chunk (R,Vp)]
  classifier_eval,     // in [x, wte, targets] out [losses (N)] workspace [logits chunk]
  loss_mean,           // in [losses (N)] out [loss (1)]: loss = scale * sum(losses)
  // --- precision ---
  cast,                // in [x] out [y] with another dtype: y = round(x), or y = round(y + x)
                       //   in accumulate modes (one rounding, round to nearest even)
  quantize,            // in [x] out [codes, scales]
  dequantize,          // in [codes, scales] out [x]
  quant_linear,        // in [x (M,K), codes (N,K), scales, (scales2, offset), (bias (N))] out [y (M,N)]
                       //   workspace [tile]: y = x dequant(W)^T (+ bias), W a frozen quantised weight
                       //   dequantised a tile of rows at a time into `tile` (compute dtype: the one
                       //   float workspace that is not fp32); QuantLinearAttrs. scales is fp32 per
                       //   block, or (double_quant) uint8 codes with fp32 scales2 and offset
  quant_linear_backward,  // in [dy (M,N), codes, scales, (scales2, offset)] out [dx (M,K)]
                       //   workspace [tile, (dx fp32 (M,K) when compute is 16-bit)]: dx = dy dequant(W),
                       //   summed over tiles in fp32; no weight gradient (W is frozen)
  check_finite,        // in [tensors...] (any float dtype) out [flag (1) fp32]: 1 when any
                       //   element is inf or NaN, else 0
  // --- generation over a KV cache (graph/inference_program.hpp) ---
  //   p = StepContext::position: the op's T tokens are at positions p .. p+T-1 of their sequence.
  embedding_at,        // in [tokens (B,T), wte (Vp,C), (wpe (Tmax,C))] out [x (B,T,C)]: embedding_forward with
                       //   the position table read at rows p + t; p + T <= Tmax
  cached_attention,    // in [qkv (B,T,(NH+2KV)HS)] out [y (B,T,NH*HS), k cache (B,KV,S,HS), v cache (B,KV,S,HS)]
                       //   (caches: update); CachedAttentionAttrs. Writes the tokens' k (rotated by HF's rope
                       //   at its position when attrs.rope) and v into cache rows [p, p+T), then query t (rotated
                       //   too) attends causally over rows [0, p+t]; p + T <= S. workspace [library scratch]
  // --- optimizer ---
  fill,                // out [x]: x = value
  grad_norm,           // in [grads...] out [norm (1)] workspace [partials (chunks) fp32]; GradNormAttrs
                       //   norm of the unscaled gradients: sqrt(sum g^2) / loss_scale, in fp32 or better
  adamw,               // in [grads... (n), (norm)] out [targets... (n), m... (n), v... (n)]  (all updated in place)
                       //   targets: the parameters, or their fp32 master copies; AdamWAttrs. Every
                       //   update op uses g * clip / loss_scale: clip = min(1, max_grad_norm /
                       //   (norm + 1e-6)) when max_grad_norm > 0 (then `norm` is the last input)
  adamw8bit,           // in [grads... (n), (norm)] out [targets... (n), m codes... (n), v codes... (n),
                       //   m absmax... (n), v absmax... (n)]: codes uint8 (numel), absmax fp32
                       //   (ceil(numel / block)); m in the signed dynamic map, v in the unsigned one
                       //   (kernels/quant_map.hpp); AdamWAttrs (block)
  // --- communication (collectives over a group of ranks) ---
  //   Run by the communicator engine (runtime/collective_op.hpp), not by a backend;
  //   CollectiveAttrs (the group of ranks and its size). Counts are elements of the shard (the
  //   out of reduce_scatter, the in of all_gather); full = group size * shard.
  all_reduce,          // out [x] (in place)
  reduce_scatter,      // in [full] out [shard]; shard may be full's own block (rank * shard)
  all_gather,          // in [shard] out [full]; shard may be full's own block (in place)
  broadcast,           // out [x] (in place)
  // --- transfers between tiers ---
  //   Run by the transfer engine; src and dst have the same bytes and live on different tiers.
  transfer,            // in [src] out [dst] on another tier
  // --- ZeRO++ qwZ (graph/zero_quant.cpp): the int8 wire of a quantised all-gather ---
  comm_quantize,       // in [x (n) float] out [wire (u8, comm_wire_bytes(n, block))]: n int8 codes, then
                       //   n / block fp32 scales; symmetric absmax per block (kernels/cpu/comm_codec.hpp);
                       //   CommQuantAttrs. Elements outside attrs.valid count as 0
  comm_dequantize,     // in [wire (u8, ranks wires of n / ranks elements each)] out [x (n) float]:
                       //   x = code * scale, rounded once to x's dtype; CommQuantAttrs (block, ranks)
  // --- asynchronous work ---
  wait,                // in [the started op's inputs] out [its outputs] (update): completes the op
                       //   with the same Op::async_id on the same queue; between the two, no op may
                       //   touch those bytes (graph/schedule_async.hpp)
  // --- ZeRO++ qgZ (graph/zero_qgz.cpp): the quantised gradient reduce-scatter ---
  all_to_all,          // in [send (u8, size x part)] out [recv (u8, size x part)]: part r of send goes to
                       //   member r, recv's part r comes from member r; CollectiveAttrs (a collective)
  grad_quantize,       // in [x (n) float] out [wire (u8, ranks x qgz_wire_bytes(n / ranks))]: the parts, one
                       //   per destination d, each the chunks (chunk elements) k * ranks + d of x for
                       //   k = 0 .. n / (ranks chunk) - 1, coded in blocks: int8 or packed int4 codes,
                       //   then fp32 scales (kernels/cpu/grad_codec.hpp); CommQuantAttrs (block, bits,
                       //   ranks, chunk, valid)
  grad_dequantize_sum, // in [wire (u8, ranks parts of n elements each)] out [y (n) float]: the sum in fp32
                       //   of the ranks decoded parts, rounded once to y's dtype; CommQuantAttrs
  // --- tensor parallelism (graph/tensor_parallel.hpp) ---
  add_bias,            // in [x (M,N), b (N)] out [y (M,N) = x + b per row]; y may overwrite x (a row-parallel
                       //   product's bias, added once after the tensor group's all_reduce)
  classifier_partial,  // in [x (N,C), w (Vs,C), targets (N)] out [stats (N,3) fp32] workspace [logits chunk (R,Vs)]:
                       //   this rank's vocabulary slice, global columns vocab_begin .. vocab_begin+Vs-1 (those >=
                       //   vocab are padding): per row the slice's max logit m (-inf when it has no real column), the
                       //   sum of exp(logit - m) over it (0 when none), and the target's logit when the target is in
                       //   the slice (else 0); ClassifierAttrs (rows, vocab, chunk_rows, vocab_begin)
  classifier_combine,  // in [stats (P,N,3) fp32: the tensor group's stats, gathered in rank order] out [losses (N),
                       //   lse (N)] both fp32: lse = M + log(sum_r s_r exp(m_r - M)) with M = max_r m_r,
                       //   loss = lse - sum_r target_r; ClassifierAttrs (rows, parts = P)
  classifier_parallel_backward,  // in [x, w (Vs,C), targets, lse (N) fp32] out [dx (N,C), dw (Vs,C)] workspace
                       //   [logits chunk (R,Vs)]: with g = (exp(logit - lse) - [column is the target]) * grad_scale *
                       //   loss_scale over the slice's real columns (0 on padding), dx = g w (this slice's part of
                       //   the input gradient: summed over the tensor group afterwards) and dw = g^T x; either
                       //   output may be kNoTensor; ClassifierAttrs as classifier_partial's
};
std::string_view op_kind_name(OpKind k);
// The collectives (all_reduce, reduce_scatter, all_gather, broadcast, all_to_all); not wait.
bool is_collective_kind(OpKind k);

// Who runs an op: the backend's kernels, the communicator (collectives), or the transfer
// engine (moves between tiers). The executor dispatches by engine.
enum class Engine : uint8_t { compute, communicator, transfer };
inline constexpr int kNumEngines = 3;
std::string_view engine_name(Engine e);

// Queues: FIFO streams of work, each run by one engine. `compute` is the step's own sequence;
// an op on another queue may run asynchronously: with Op::async_id >= 0 the op only starts
// its work, and the `wait` op with the same id completes it. Each queue has its own scratch
// (runtime/compile.hpp), since work on different queues can run at the same time.
enum class Queue : uint8_t { compute, comm_reduce, comm_gather, transfer_out, transfer_in };
inline constexpr int kNumQueues = 5;
std::string_view queue_name(Queue q);  // "compute", "comm.reduce", "comm.gather", "transfer.out", "transfer.in"
Engine queue_engine(Queue q);
// Ops of a queue that may be in flight at once (graph/schedule_async.hpp). 1 for the compute
// and communicator queues: each has one scratch (runtime/compile.hpp), which a depth of 2
// would have to double. Transfer queues keep up to kTransferQueueDepth.
int queue_depth(Queue q);
inline constexpr int kTransferQueueDepth = 8;  // the transfer engine's request slots per queue
// The queue an op of this kind runs on by default: reductions and gathers are separate
// streams (a gradient reduction may stay in flight while the next block is gathered);
// transfers go out to a slower tier or in to a faster one (`outward`).
Queue default_queue(OpKind kind, bool outward = true);

// How an op writes each output.
enum class WriteMode : uint8_t {
  overwrite,                     // y = f(...)
  accumulate,                    // y += f(...): reads y first
  accumulate_after_first_micro,  // overwrite in the first micro-step of an optimizer step,
                                 // accumulate in the later ones (gradient accumulation)
  update,                        // read-modify-write of state (optimizer updates)
};
bool write_mode_reads(WriteMode m);  // true when the op reads the output's previous value

struct NoAttrs {};
struct MatmulAttrs {
  // C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N]; op(X) = X^T when trans_x. A is stored [M,K] or
  // [K,M], B is stored [K,N] or [N,K]; leading dimensions are packed.
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f;
  // b_window: B is a window of rows of a larger tensor (one piece of a fused q/k/v weight, as
  // B [N,K] of a forward product or of its input gradient), its elements from b_offset on.
  int64_t b_offset = 0;
  bool b_window = false;
};
// A product with a frozen quantised weight W [N, K] (graph/quantize_base.hpp). W is stored as
// `segments` pieces of rows, each quantised on its own (a fused weight keeps the HF tensors it
// was made of): codes, block scales, second-level scales and offsets of the pieces are
// concatenated in their storage tensors (kernels/quant/quant_segments.hpp has the layout).
struct QuantLinearAttrs {
  int64_t m = 0, n = 0, k = 0;
  QuantSpec spec;  // format, block, double quantisation (graph/quant_layout.hpp)
  bool has_bias = false;
  int64_t tile_rows = 1;          // rows of W dequantised at once (the tile is tile_rows x K)
  DType compute = DType::f32;     // the product's dtype: x, y, dy, dx and the tile
  // The policy's compute dtype, which the weight was rounded to before quantising (bnb quantises
  // the model as loaded in it). It stays when an fp16 product becomes an fp32 island.
  DType weight_dtype = DType::f32;
  std::vector<int64_t> segments;  // rows of each separately quantised piece; they sum to n
  // >= 0: the product multiplies only this piece of the storage (n is its rows): a window of
  // rows of a fused weight, as MatmulAttrs::b_offset.
  int64_t piece = -1;
};
// The pieces a quantised product multiplies: all of them, or its one piece.
inline std::vector<int64_t> multiplied_segments(const QuantLinearAttrs& a) {
  return a.piece < 0 ? a.segments : std::vector<int64_t>{a.segments[size_t(a.piece)]};
}
struct NormAttrs {
  float eps = 1e-5f;
};
// HF's rotary frequency scalings that the rope kernels compute (rope_type "linear": every
// frequency divided by factor; "llama3": long wavelengths divided by factor, short ones kept,
// those between blended, as Llama 3.1 and 3.2 publish them). kind none is rope_theta alone.
struct RopeScaling {
  enum class Kind : uint8_t { none, linear, llama3 };
  Kind kind = Kind::none;
  // Doubles, as HF's config holds them: its fp32 arithmetic rounds each one where it uses it.
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_positions = 8192.0;                // llama3: the context before scaling
};
struct AttentionAttrs {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;             // 1/sqrt(head_dim)
  float rope_theta = 10000.0f; // rotary base (rope ops of the llama family)
  RopeScaling rope_scaling;
};
// cached_attention: the attention shape (seq = T, the tokens of one run), the caches' rows S and
// whether q and k are rotated (llama family) before k is stored.
struct CachedAttentionAttrs {
  AttentionAttrs attn;
  int64_t capacity = 0;  // S
  bool rope = false;
};
struct ClassifierAttrs {
  int64_t rows = 0;        // N
  int64_t vocab = 0;       // real vocabulary; columns >= vocab are padding and get no probability
  int64_t chunk_rows = 0;  // R: rows of logits materialised at once
  float grad_scale = 1;    // d(loss)/d(loss_i): 1 / (tokens per optimizer step)
  // Tensor parallelism (the vocabulary-parallel classifier ops): the global column of this
  // rank's first weight row, and the ranks whose stats classifier_combine combines.
  int64_t vocab_begin = 0;
  int parts = 1;
};
// embedding_forward / embedding_backward under tensor parallelism: wte holds the vocabulary
// rows [vocab_begin, vocab_begin + rows of wte); tokens outside them contribute nothing (their
// row comes from another rank, summed by the tensor group's all_reduce). With add_positions
// false the forward leaves wpe out (one rank of the group adds it); the backward still writes
// dwpe from dy. The defaults are the one-rank op.
struct EmbeddingAttrs {
  int64_t vocab_begin = 0;
  bool add_positions = true;
};
struct ScaleAttrs {
  float scale = 1;
};
struct AdamWAttrs {
  // Doubles, as PyTorch's hyper-parameters are: 1 - beta is then rounded to fp32 once.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::vector<float> weight_decay;  // per parameter tensor (0 for biases and norm weights)
  double max_grad_norm = 0;         // > 0: clip by the global norm, the op's last input
  int64_t block = 256;              // adamw8bit: elements per quantization block
};
struct GradNormAttrs {
  int64_t chunk = 32768;  // elements per partial sum (fixed, so the norm is thread-count independent)
  // ZeRO (graph/zero.hpp) takes the global norm over gradient shards in three ops:
  //   sum_of_squares  in [grads...] out [s (1)]: sum g^2 / loss_scale^2 of this rank's shard;
  //   all_reduce of s over ranks;
  //   sqrt_of_input   in [s (1)] out [norm (1)]: sqrt(s) (no workspace).
  enum class Form : uint8_t { norm, sum_of_squares, sqrt_of_input } form = Form::norm;
};
struct ColumnsAttrs {
  int64_t rows = 0, cols = 0;        // M, N: the wide tensor
  int64_t begin = 0, width = 0;      // the column block [begin, begin + width)
};
struct DoraNormAttrs {
  int64_t k = 0;                    // W's columns
  int64_t row_begin = 0, rows = 0;  // the adapted rows of W (a piece of a fused weight)
  int64_t rank = 0;
  float scale = 1;                  // the adapter's alpha / r
  // A quantised W (QDoRA): inputs [codes, scales, (scales2, offset), A, B], W's pieces and
  // format as its quant_linear's; its rows are dequantised, rounded to weight_dtype (the values
  // the quantised product multiplies by), a piece of a row at a time.
  bool quantized = false;
  QuantSpec spec;
  std::vector<int64_t> segments;
  DType weight_dtype = DType::f32;
};
struct DoraScaleAttrs {
  int64_t m = 0, n = 0;                  // z's rows and columns
  std::vector<int64_t> begins, widths;   // the column blocks, one per adapter (its m and norm)
  bool has_bias = false;
};
struct DropoutAttrs {
  float p = 0;          // probability of dropping an element, in (0, 1)
  uint64_t salt = 0;    // distinguishes the dropout sites of a program (a hash of the op's name)
  DropoutLayout layout;  // where the elements sit in the one-rank tensor (core/dropout_mask.hpp)
};
struct FillAttrs {
  float value = 0;
};
// The ranks a collective runs over (graph/policy.hpp Topology): all of them, the ranks holding
// the same tensor-parallel slice (data parallelism, ZeRO), or the ranks sharing one model
// replica (tensor parallelism; adjacent ranks, as Megatron lays them out).
// qgZ's two hops (graph/zero_qgz.cpp) add the data ranks on this rank's node (member: data
// rank % Topology::data_per_node()) and those with its index on every node (member: data rank /
// data_per_node()); ZeRO++ hpZ the N consecutive ranks of the data group
// (Policy::zero_hpz_partition_size; graph/zero_hpz.hpp).
enum class CommGroup : uint8_t { world, data, tensor, node, across_nodes, hpz };
inline constexpr int kNumCommGroups = 6;
std::string_view comm_group_name(CommGroup g);  // "world", "data", "tensor", "node", "across_nodes", "hpz"
struct CollectiveAttrs {
  CommGroup group = CommGroup::world;
  int size = 1;      // ranks in the group
  bool max = false;  // all_reduce: maximum instead of sum (overflow flags)
};
// comm_quantize / comm_dequantize: elements per block (a multiple of it: the op's n), the ranks
// whose wires a dequantise decodes, and the (first, count) element ranges of a quantise's input
// that hold values (ascending; ZeRO's padding between parameters is left out).
struct CommQuantAttrs {
  int64_t block = 256;
  int ranks = 1;
  std::vector<std::pair<int64_t, int64_t>> valid;
  int bits = 8;        // qgZ: 8 or 4 (two codes a byte)
  int64_t chunk = 0;   // grad_quantize: elements of one chunk (op.hpp, grad_quantize)
};
// Bytes of the int8 wire of n elements: the codes, then one fp32 scale per block.
inline constexpr uint64_t comm_wire_bytes(int64_t n, int64_t block) { return uint64_t(n) + 4 * uint64_t(n / block); }
// Bytes of one part of qgZ's wire of n elements: int8 codes (bits 8) or two int4 codes a byte
// (bits 4, the odd one last alone), then one fp32 scale per block (the last one may be partial).
inline constexpr uint64_t qgz_wire_bytes(int64_t n, int64_t block, int bits) {
  return (bits == 4 ? uint64_t(n + 1) / 2 : uint64_t(n)) + 4 * uint64_t((n + block - 1) / block);
}
// Bytes a ring collective sends per rank: all_reduce passes = 2, reduce_scatter and
// all_gather 1 (bytes: the full tensor).
inline double ring_bytes(double bytes, int ranks, double passes) {
  return passes * bytes * double(ranks - 1) / double(ranks);
}
using OpAttrs = std::variant<NoAttrs, MatmulAttrs, NormAttrs, AttentionAttrs, ClassifierAttrs,
                             ScaleAttrs, AdamWAttrs, GradNormAttrs, FillAttrs, CollectiveAttrs, ColumnsAttrs,
                             DropoutAttrs, QuantLinearAttrs, CachedAttentionAttrs, CommQuantAttrs, EmbeddingAttrs,
                             DoraNormAttrs, DoraScaleAttrs>;

struct Op {
  OpKind kind = OpKind::fill;
  Phase phase = Phase::forward;
  std::string name;
  int layer = -1;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  std::vector<WriteMode> modes;      // one per output
  std::vector<TensorId> workspace;   // scratch used only while this op runs
  // (output index, input index): the kernel accepts the output in the input's bytes; the
  // planner uses it when the input dies at this op.
  std::vector<std::pair<int, int>> inplace;
  OpAttrs attrs;
  Queue queue = Queue::compute;  // Program::add_op sets default_queue(kind) for collectives and transfers
  int async_id = -1;    // >= 0: the op only starts its work on `queue`; the wait with this id completes it
  int replays = -1;     // a recomputed op: index of the forward op it re-emits
  double flops = 0;     // arithmetic work of one execution
  double comm_bytes = 0;  // bytes a collective sends per rank
};

}  // namespace memfit
