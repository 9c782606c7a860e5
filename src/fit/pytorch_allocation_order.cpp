#include "fit/pytorch_allocation_order.hpp"

#include <array>
#include <charconv>
#include <string_view>

#include "core/error.hpp"
#include "fit/caching_allocator.hpp"
#include "fit/framework_pytorch_order.hpp"

namespace memfit {

namespace tm = torch_model;

namespace {

constexpr uint64_t kCublasLtWorkspace = uint64_t(1) << 20;  // torch 2.11's cuBLASLt workspace on sm90
constexpr int64_t kNumSm = 132, kThreadsPerSm = 2048;        // H100 SXM, H200
constexpr uint64_t kCubTemp = 1279;                          // cub's scan storage in embedding backward
constexpr int64_t kEmbeddingSortAbove = 3072;                // EmbeddingBackwardKernel.cu's direct path

// ------------------------------------------------------------------ the order tables' text

// Where a copy out of the relation's range puts the death: the relation's own index (inside P or
// S of the phase), with the step's last frees, or a fixed place of P or S.
struct Fallback {
  enum Kind : uint8_t { same, end, fixed } kind = same;
  bool forward = false;
  char region = 'P';
  int pos = 0;
};

// Where an allocation is freed: after allocation len(P) + len(X) x copy + pos of a phase laid out
// as P X X ... S, copy a function of the allocation's own copy c and the layers L.
struct Death {
  bool end = true;       // with the step's last frees
  bool forward = false;  // the phase
  char family = 's';     // copy: s c + k, o (L - 2) - c + k, a k, e (L - 2) + k
  int k = 0, pos = 0;
  int margin_low = 0, margin_high = 0;  // the relation holds for copies [low, L - 2 - high]
  Fallback low, high;
  // A model of one layer frees it elsewhere: with the step's last frees, or after allocation
  // `one_index` of the forward (one_forward) or backward.
  bool one_set = false, one_end = false, one_forward = false;
  int one_index = 0;
};

struct Item {
  int32_t expr = 0;
  uint32_t flags = 0;
  Death death;
};

struct OrderPhase {
  std::array<std::vector<Item>, 3> region;  // P, X, S
};

int to_int(std::string_view s) {
  int v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  MEMFIT_CHECK(r.ec == std::errc() && r.ptr == s.data() + s.size(), "framework", "bad order table entry '{}'", s);
  return v;
}

Fallback parse_fallback(std::string_view s) {
  Fallback f;
  if (s == "E") {
    f.kind = Fallback::end;
    return f;
  }
  MEMFIT_CHECK(s.size() >= 3 && (s[0] == 'f' || s[0] == 'b') && (s[1] == 'P' || s[1] == 'S'), "framework",
               "bad order table death '{}'", s);
  f.kind = Fallback::fixed;
  f.forward = s[0] == 'f';
  f.region = s[1];
  f.pos = to_int(s.substr(2));
  return f;
}

// `bs1.4^01<E>fS2/b13` (framework_pytorch_order.hpp)
Death parse_death(std::string_view s) {
  Death d;
  if (const size_t slash = s.find('/'); slash != std::string_view::npos) {
    const std::string_view one = s.substr(slash + 1);
    d = parse_death(s.substr(0, slash));
    d.one_set = true;
    d.one_end = one == "E";
    if (!d.one_end) {
      MEMFIT_CHECK(one.size() >= 2 && (one[0] == 'f' || one[0] == 'b'), "framework", "bad order table death '{}'", one);
      d.one_forward = one[0] == 'f';
      d.one_index = to_int(one.substr(1));
    }
    return d;
  }
  if (s == "E") return d;
  const size_t hi = s.find('>'), lo = s.find('<');
  if (hi != std::string_view::npos) d.high = parse_fallback(s.substr(hi + 1));
  if (lo != std::string_view::npos) d.low = parse_fallback(s.substr(lo + 1, hi == std::string_view::npos ? hi : hi - lo - 1));
  s = s.substr(0, std::min(lo, hi));
  if (const size_t caret = s.find('^'); caret != std::string_view::npos) {
    MEMFIT_CHECK(caret + 3 == s.size(), "framework", "bad order table death '{}'", s);
    d.margin_low = s[caret + 1] - '0', d.margin_high = s[caret + 2] - '0';
    s = s.substr(0, caret);
  }
  const size_t dot = s.find('.');
  MEMFIT_CHECK(s.size() >= 4 && (s[0] == 'f' || s[0] == 'b') && dot != std::string_view::npos, "framework",
               "bad order table death '{}'", s);
  d.end = false;
  d.forward = s[0] == 'f';
  d.family = s[1];
  d.k = to_int(s.substr(2, dot - 2));
  d.pos = to_int(s.substr(dot + 1));
  return d;
}

std::vector<Item> parse_items(std::string_view text) {
  std::vector<Item> out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ' ') continue;
    const std::string_view tok = text.substr(start, i - start);
    start = i + 1;
    if (tok.empty()) continue;
    const size_t c1 = tok.find(','), c2 = tok.find(',', c1 + 1);
    MEMFIT_CHECK(c2 != std::string_view::npos, "framework", "bad order table entry '{}'", tok);
    out.push_back(
        {to_int(tok.substr(0, c1)), uint32_t(to_int(tok.substr(c1 + 1, c2 - c1 - 1))), parse_death(tok.substr(c2 + 1))});
  }
  return out;
}

// The architecture's allocations, parsed once.
const std::vector<Item>& item_table(bool llama) {
  static const std::vector<Item> gpt2 = parse_items(tm::gpt2_order_items());
  static const std::vector<Item> llm = parse_items(tm::llama_order_items());
  return llama ? llm : gpt2;
}

OrderPhase parse_phase(std::string_view text, const std::vector<Item>& items) {
  OrderPhase ph;
  size_t r = 0;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '|') {
      MEMFIT_CHECK(++r < 3, "framework", "an order table phase has more than P|X|S");
      ++i;
      continue;
    }
    MEMFIT_CHECK(i + 1 < text.size(), "framework", "an order table phase ends inside an allocation's code");
    const size_t k = size_t(tm::order_code_digit(text[i]) * tm::kOrderCodeBase + tm::order_code_digit(text[i + 1]));
    MEMFIT_CHECK(k < items.size(), "framework", "an order table code {} past its {} allocations", k, items.size());
    ph.region[r].push_back(items[k]);
    i += 2;
  }
  MEMFIT_CHECK(r == 2, "framework", "an order table phase has {} parts, not P|X|S", r + 1);
  return ph;
}

// ------------------------------------------------------------------ one step's items for L layers

struct Gen {
  int32_t expr;
  uint32_t flags;
  int64_t death;  // index into the step's items (forward then backward), -1: with the step's last frees
};

struct Layout {
  const OrderPhase* phase[2];  // forward, backward
  int64_t layers;
  int64_t offset(bool forward) const { return forward ? 0 : size(true); }
  int64_t size(bool forward) const {
    const OrderPhase& p = *phase[forward ? 0 : 1];
    return int64_t(p.region[0].size() + p.region[1].size() * (layers - 1) + p.region[2].size());
  }
  int64_t resolve(const Death& d, int64_t copy) const {
    if (layers == 1 && d.one_set) return d.one_end ? -1 : offset(d.one_forward) + d.one_index;
    if (d.end) return -1;
    const OrderPhase& p = *phase[d.forward ? 0 : 1];
    const int64_t L = layers, a = int64_t(p.region[0].size()), b = int64_t(p.region[1].size());
    const int64_t c = d.family == 's' ? copy + d.k : d.family == 'o' ? (L - 2) - copy + d.k
                    : d.family == 'a' ? d.k : (L - 2) + d.k;
    const int64_t i = a + b * c + d.pos;
    if (c >= d.margin_low && c <= L - 2 - d.margin_high) return offset(d.forward) + i;
    const Fallback& f = c < d.margin_low ? d.low : d.high;
    if (f.kind == Fallback::end) return -1;
    if (f.kind == Fallback::fixed) {
      const OrderPhase& q = *phase[f.forward ? 0 : 1];
      const int64_t j = f.region == 'P' ? f.pos : int64_t(q.region[0].size() + q.region[1].size() * (L - 1)) + f.pos;
      return offset(f.forward) + j;
    }
    MEMFIT_CHECK(i >= 0 && i < size(d.forward), "framework", "the order table frees an allocation outside the step");
    return offset(d.forward) + i;
  }
};

std::vector<Gen> step_items(const Layout& lay) {
  std::vector<Gen> out;
  for (int f = 0; f < 2; ++f) {
    const OrderPhase& p = *lay.phase[f];
    for (int r = 0; r < 3; ++r) {
      const int64_t copies = r == 1 ? lay.layers - 1 : 1;
      for (int64_t c = 0; c < copies; ++c)
        for (const Item& it : p.region[size_t(r)]) out.push_back({it.expr, it.flags, lay.resolve(it.death, c)});
    }
  }
  return out;
}

// ------------------------------------------------------------------ sizes

using Monos = std::array<int64_t, tm::kMonos>;

Monos monos_of(const ModelSpec& s, const TorchStep& st) {
  const int64_t B = st.batch, T = st.seq, N = B * T, C = s.n_embd, H = s.n_head, KV = s.n_kv_head;
  const int64_t D = s.head_dim(), I = s.n_inner, V = s.vocab_size;
  Monos m{};
  m[tm::NC] = N * C, m[tm::NI] = N * I, m[tm::BHTT] = B * H * T * T, m[tm::NV] = N * V, m[tm::VC] = V * C;
  m[tm::N] = N, m[tm::BHT] = B * H * T, m[tm::TD] = T * D, m[tm::NKVD] = N * KV * D, m[tm::BTT] = B * T * T;
  m[tm::TT] = T * T, m[tm::CC] = C * C, m[tm::CI] = C * I, m[tm::NPC] = s.max_seq * C;
  m[tm::CKVD] = C * KV * D, m[tm::KVD] = KV * D, m[tm::C] = C, m[tm::I] = I, m[tm::V] = V, m[tm::T] = T;
  m[tm::D] = D, m[tm::TC] = T * C, m[tm::NH] = N * H, m[tm::BKVTT] = B * KV * T * T, m[tm::HTT] = H * T * T;
  m[tm::B] = B, m[tm::One] = 1;
  return m;
}

uint64_t bytes_of(const tm::OrderExpr& e, const Monos& m, const ModelSpec& s, const TorchStep& st) {
  const int64_t B = st.batch, T = st.seq, H = s.n_head, D = s.head_dim();
  switch (e.kind) {
    case tm::OrderKind::lse32: return uint64_t(B * H * ((T + 31) / 32 * 32) * 4);
    case tm::OrderKind::effws: return uint64_t(B * H * ((T + 127) / 128 * 128) * D * 4 + B * H * T / 4);
    case tm::OrderKind::cudnnws: return uint64_t(B * T * H * D * 4 + B * H * T * 4 + 256);
    case tm::OrderKind::cudnnws_gqa: return uint64_t(2 * B * T * H * D * 4 + B * H * T * 4 + 256);
    case tm::OrderKind::product: break;
  }
  int64_t v = 0;
  for (const tm::OrderTerm& t : e.terms) v += int64_t(t.bytes) * m[t.mono];
  return uint64_t(v);
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t last_pow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// Reduce.cuh's setReductionConfig for summing R rows of F contiguous columns (float accumulation):
// the global staging buffer and the semaphores, {0, 0} when no reduction crosses thread blocks.
std::array<uint64_t, 2> staging_bytes(int64_t R, int64_t F) {
  int64_t vec = 4;
  while (vec > 1 && F % vec) vec /= 2;
  const int64_t dim0 = F / vec, mt = 512 / vec;
  const int64_t d0 = dim0 < mt ? last_pow2(dim0) : mt, d1 = R < mt ? last_pow2(R) : mt;
  int64_t bw = std::min<int64_t>(d0, 32);
  const int64_t bh = std::min(d1, mt / bw);
  bw = std::min(d0, mt / bh);
  if (R < std::min<int64_t>(bh * 16, 256)) return {0, 0};
  const int64_t grid = cdiv(dim0, bw), target = kNumSm * (kThreadsPerSm / (bw * bh)), vpt = cdiv(R, bh);
  if (vpt < 256 || grid > target) return {0, 0};
  const int64_t c = std::max(cdiv(vpt, 256), std::min(cdiv(target, grid), cdiv(vpt, 16)));
  if (c <= 1) return {0, 0};
  return {uint64_t(4 * F * c * bw * vec), uint64_t(4 * grid)};
}

// cub's radix-sort storage for N indices: 83,455 B at 4096, 150,015 B at 8192 (the traces), linear.
uint64_t sort_temp_bytes(int64_t N) { return uint64_t(83455 + (150015 - 83455) * (N - 4096) / 4096); }

// ------------------------------------------------------------------ the run

struct Events {
  std::vector<int64_t> ev;
  int64_t blocks = 0;
  int64_t alloc(uint64_t bytes) {
    ev.push_back(int64_t(bytes));
    return blocks++;
  }
  void free(int64_t block) { ev.push_back(-block); }
};

// Module._apply's order: each parameter and buffer (bytes); `optimized`: a parameter AdamW updates.
struct Tensor {
  uint64_t bytes;
  bool optimized;
};

std::vector<Tensor> model_tensors(const ModelSpec& s) {
  const uint64_t C = uint64_t(s.n_embd), F = uint64_t(s.n_inner), V = uint64_t(s.vocab_size);
  std::vector<Tensor> t;
  auto p = [&](uint64_t elements) { t.push_back({4 * elements, true}); };
  p(V * C);
  if (s.arch == Arch::gpt2) {
    p(uint64_t(s.max_seq) * C);
    for (int64_t l = 0; l < s.n_layer; ++l) {
      p(C), p(C), p(3 * C * C), p(3 * C), p(C * C), p(C), p(C), p(C), p(C * F), p(F), p(F * C), p(C);
    }
    p(C), p(C);
    return t;
  }
  const uint64_t kv = uint64_t(s.n_kv_head * s.head_dim());
  for (int64_t l = 0; l < s.n_layer; ++l) {
    p(C * C), p(kv * C), p(kv * C), p(C * C), p(F * C), p(F * C), p(C * F), p(C), p(C);
  }
  p(C);
  t.push_back({uint64_t(s.head_dim() / 2) * 4, false});  // the rotary embedding's inv_freq
  t.push_back({uint64_t(s.head_dim() / 2) * 4, false});  // and original_inv_freq
  if (!s.tied_embeddings) p(V * C);
  return t;
}

struct Threads {
  bool workspace[2] = {false, false}, lt[2] = {false, false};  // forward's thread, autograd's
};

struct StepContext {
  const ModelSpec& spec;
  const TorchStep& step;
  const Monos& monos;
  std::span<const tm::OrderExpr> exprs;
};

// One item and what the CUDA run allocates around it (the rules R5-R8 of tools/cuda_allocation_rules.py).
int64_t emit_item(Events& e, const StepContext& cx, const Gen& g, bool backward, Threads& th) {
  const uint64_t bytes = bytes_of(cx.exprs[size_t(g.expr)], cx.monos, cx.spec, cx.step);
  const int64_t N = cx.step.batch * cx.step.seq;
  const int64_t indices = (g.flags & tm::kEmbeddingGrad) ? N : (g.flags & tm::kEmbeddingPositionsGrad) ? cx.step.seq : 0;
  const bool sort = indices > kEmbeddingSortAbove;
  int64_t sorted = 0, orig = 0;
  if (sort) {
    sorted = e.alloc(8 * uint64_t(indices)), orig = e.alloc(8 * uint64_t(indices));
    const int64_t iota = e.alloc(8 * uint64_t(indices)), tmp = e.alloc(sort_temp_bytes(indices));
    e.free(tmp), e.free(iota);
  }
  MEMFIT_CHECK(bytes > 0, "framework", "an allocation of 0 bytes in the order table");
  const int64_t block = e.alloc(bytes);
  const int t = backward ? 1 : 0;
  if ((g.flags & tm::kGemmOutput) && !th.workspace[t]) {
    th.workspace[t] = true;
    e.alloc(cx.step.cublas_workspace_bytes);
  }
  if ((g.flags & tm::kAddmmOutput) && !th.lt[t]) {
    th.lt[t] = true;
    e.alloc(kCublasLtWorkspace);
  }
  if (g.flags & tm::kSoftmaxBackward) e.free(e.alloc(bytes));
  if (g.flags & (tm::kSumRowsFloat | tm::kSumRowsHalf)) {
    const auto [buffer, semaphores] = staging_bytes(N, int64_t(bytes) / ((g.flags & tm::kSumRowsFloat) ? 4 : 2));
    if (buffer) {
      const int64_t a = e.alloc(buffer), b = e.alloc(semaphores);
      e.free(b), e.free(a);
    }
  }
  if (sort) {
    const uint64_t C = uint64_t(cx.spec.n_embd), V = bytes / (4 * C), n = uint64_t(indices);
    const uint64_t segments = std::min(n, V), partials = n / 10 + segments;
    const int64_t offsets = e.alloc(8 * n), count = e.alloc(8), tmp = e.alloc(8 * n), cub = e.alloc(kCubTemp);
    e.free(cub), e.free(tmp);
    const int64_t per = e.alloc(8 * segments), per_offsets = e.alloc(8 * segments);
    e.free(e.alloc(kCubTemp));
    const int64_t pcount = e.alloc(8), poffsets = e.alloc(8 * partials), pgrads = e.alloc(4 * C * partials);
    for (int64_t b : {pgrads, poffsets, pcount, per_offsets, per, count, offsets, orig, sorted}) e.free(b);
  }
  return block;
}

void emit_step(Events& e, const StepContext& cx, const Layout& lay, const std::vector<Tensor>& tensors, bool first,
               Threads& th) {
  const int64_t ids = e.alloc(8 * uint64_t(cx.step.batch * cx.step.seq));
  const std::vector<Gen> items = step_items(lay);
  std::vector<std::vector<int64_t>> dies_after(items.size());
  std::vector<int64_t> at_end, block(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t d = items[i].death;
    MEMFIT_CHECK(d < 0 || (d >= int64_t(i) && d < int64_t(items.size())), "framework",
                 "the order table frees allocation {} before it is made", i);
    (d < 0 ? at_end : dies_after[size_t(d)]).push_back(int64_t(i));
  }
  const int64_t forward_items = lay.size(true);
  for (size_t i = 0; i < items.size(); ++i) {
    block[i] = emit_item(e, cx, items[i], int64_t(i) >= forward_items, th);
    for (int64_t j : dies_after[i]) e.free(block[size_t(j)]);
  }
  if (first)  // AdamW's state, made at the first step: exp_avg and exp_avg_sq of each parameter
    for (const Tensor& t : tensors)
      if (t.optimized) e.alloc(t.bytes), e.alloc(t.bytes);
  std::vector<int64_t> roots;  // torch._foreach_sqrt(exp_avg_sqs), freed in reverse order
  for (const Tensor& t : tensors)
    if (t.optimized) roots.push_back(e.alloc(t.bytes));
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) e.free(*it);
  for (int64_t j : at_end) e.free(block[size_t(j)]);  // zero_grad's gradients, the loss
  e.free(ids);
}

const tm::OrderVariant& order_variant(const ModelSpec& spec, const TorchStep& step,
                                      std::span<const tm::OrderExpr>& exprs) {
  MEMFIT_CHECK(step.cuda, "framework", "the allocation order is a CUDA run's: give a GPU hardware preset");
  MEMFIT_CHECK(step.hopper, "framework",
               "the allocation order's CUDA rules are an H100's or H200's (cuDNN attention, 132 SMs): give "
               "--hardware h100-80gb or h200-141gb");
  MEMFIT_CHECK(step.cublas_workspace_bytes > 0, "framework", "the hardware preset has no cuBLAS workspace size");
  MEMFIT_CHECK(!spec.qkv_bias && (spec.arch == Arch::llama || spec.tied_embeddings), "framework",
               "q/k/v biases and an untied GPT-2 have no allocation order");
  MEMFIT_CHECK(step.batch >= 1 && step.seq >= 1 && step.seq <= spec.max_seq && spec.n_layer >= 1, "framework",
               "no allocation order for {} layers at {} x {}", spec.n_layer, step.batch, step.seq);
  MEMFIT_CHECK(step.attention == TorchAttention::eager || !step.autocast_bf16 || spec.head_dim() <= 128, "framework",
               "bf16 sdpa with head size {} (> 128) takes another kernel than cuDNN's: not modelled", spec.head_dim());
  const tm::Variant v = tm::variant_of(spec, step);
  const bool llama = spec.arch == Arch::llama;
  exprs = llama ? tm::llama_order_exprs() : tm::gpt2_order_exprs();
  for (const tm::OrderVariant& o : llama ? tm::llama_order_variants() : tm::gpt2_order_variants())
    if (o.variant == v) return o;
  throw Error("framework", "no allocation order for this combination of attention, checkpointing and autocast");
}

}  // namespace

std::vector<int64_t> pytorch_cuda_allocation_events(const ModelSpec& spec, const TorchStep& step) {
  std::span<const tm::OrderExpr> exprs;
  const tm::OrderVariant& ov = order_variant(spec, step, exprs);
  const std::vector<Item>& items = item_table(spec.arch == Arch::llama);
  const OrderPhase forward = parse_phase(ov.forward, items), backward = parse_phase(ov.backward, items);
  const Layout lay{{&forward, &backward}, spec.n_layer};
  const Monos m = monos_of(spec, step);
  const StepContext cx{spec, step, m, exprs};
  const std::vector<Tensor> tensors = model_tensors(spec);
  Events e;
  for (const Tensor& t : tensors) e.alloc(t.bytes);  // model.cuda()
  Threads th;
  for (int s = 0; s < 2; ++s) emit_step(e, cx, lay, tensors, s == 0, th);
  return std::move(e.ev);
}

TorchReserve predict_pytorch_reserved(const ModelSpec& spec, const TorchStep& step) {
  const std::vector<int64_t> ev = pytorch_cuda_allocation_events(spec, step);
  const AllocatorReplay r = replay_caching_allocator(ev);
  TorchReserve out;
  out.max_memory_reserved = r.peak_reserved;
  out.max_memory_allocated = r.peak_allocated;
  out.segments = r.segments;
  for (int64_t x : ev) out.allocations += x > 0;
  return out;
}

}  // namespace memfit
