// What quantised frozen weights cost on the CPU (kernels/quant). For each linear shape of a
// TinyLlama-1.1B layer (hidden 2048, intermediate 5632, 4 KV heads of 64) it times, with the
// threads OMP_NUM_THREADS gives:
//   - quantise: bf16 -> NF4 codes + absmax + double quantisation (a load-time cost), ns/element;
//   - dequantise: NF4 (double-quantised) -> bf16, the whole weight, GB/s of bf16 written;
//   - forward y = x W^T and input grad dx = dy W of m tokens through CpuQuantLinear, for several
//     tile heights, against the same product on a plain bf16 W (one oneDNN matmul): the ratio
//     is what dequantising tile by tile adds, and the tile bytes are what the plan holds.
// Expect the ratio to fall as m grows (dequantisation is O(rows cols), the product O(m rows
// cols)) and to rise for very small tiles (one oneDNN call per tile).
//   quant_bench [m=1024] [repeats=5]        (quant_bench smoke: tiny shapes, one repeat)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/quant/blockwise.hpp"
#include "kernels/quant/cpu_quant_linear.hpp"

using Clock = std::chrono::steady_clock;
using namespace memfit;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// On a shared host the wall clock counts the time other processes held the cores; with
// QUANT_BENCH_CPU_TIME=1 the bench times the process's CPU time instead (meaningful with one
// thread: a waiting OpenMP thread spins, which counts as CPU time).
bool use_cpu_time() {
  static const bool on = [] {
    const char* v = std::getenv("QUANT_BENCH_CPU_TIME");
    return v && *v == '1';
  }();
  return on;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

template <class F>
double best_of(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    if (use_cpu_time()) {
      const double c0 = cpu_seconds();
      f();
      best = std::min(best, cpu_seconds() - c0);
      continue;
    }
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16_t> v(n);
  for (auto& x : v) x = round_to_bf16(dist(gen));
  return v;
}

void bench_shape(const char* name, int64_t m, int64_t rows, int64_t cols, int repeats, const DnnlEnv& env) {
  const int64_t numel = rows * cols;
  const auto w = random_bf16(size_t(numel), 1, 0.02f);
  const QuantSpec spec{QuantKind::nf4, 64, true};
  const QuantStorage storage = quant_storage(spec, numel);
  std::vector<uint8_t> codes(storage.codes), absmax_codes(storage.absmax);
  std::vector<float> absmax(size_t(quant_blocks(numel, spec.block))), absmax2(storage.absmax2 / 4);
  float offset = 0.0f;
  const double quantise_s = best_of(repeats, [&] {
    quantize_4bit<bf16_t>(w, spec, codes, absmax);
    offset = double_quantize_absmax(absmax, absmax_codes, absmax2);
  });
  const QuantizedWeight qw{spec, rows, cols, codes, {}, absmax_codes, absmax2, offset};
  std::vector<bf16_t> full(static_cast<size_t>(numel));
  const double dequantise_s = best_of(repeats, [&] { dequantize_range<bf16_t>(qw, 0, numel, full); });
  std::printf("%-10s [%lld, %lld]: quantise %.2f ns/elem, dequantise %.2f GB/s bf16, %.3f bits/param\n", name,
              (long long)rows, (long long)cols, quantise_s * 1e9 / double(numel),
              double(numel) * 2 / dequantise_s / 1e9, double(storage.total()) * 8 / double(numel));

  // Plain bf16 products on the expanded weight: the floor.
  const auto x = random_bf16(size_t(m * cols), 2, 1.0f), dy = random_bf16(size_t(m * rows), 3, 1.0f);
  std::vector<bf16_t> y(size_t(m * rows));
  std::vector<float> dx(size_t(m * cols));
  using dt = dnnl::memory::data_type;
  DnnlMatmulSpec fwd_spec, grad_spec;
  fwd_spec.src = dnnl_matrix(m, cols, false, dt::bf16);
  fwd_spec.wei = dnnl_matrix(cols, rows, true, dt::bf16);  // W [rows, cols] read as W^T
  fwd_spec.dst = dnnl_matrix(m, rows, false, dt::bf16);
  grad_spec.src = dnnl_matrix(m, rows, false, dt::bf16);
  grad_spec.wei = dnnl_matrix(rows, cols, false, dt::bf16);
  grad_spec.dst = dnnl_matrix(m, cols, false, dt::f32);
  DnnlMatmul plain_fwd(env, fwd_spec), plain_grad(env, grad_spec);
  std::vector<std::byte> plain_scratch(std::max(plain_fwd.scratch_bytes(), plain_grad.scratch_bytes()));
  plain_fwd.bind(x.data(), full.data(), nullptr, y.data(), plain_scratch.data());
  plain_grad.bind(dy.data(), full.data(), nullptr, dx.data(), plain_scratch.data());
  const double plain_fwd_s = best_of(repeats, [&] { plain_fwd.execute(); });
  const double plain_grad_s = best_of(repeats, [&] { plain_grad.execute(); });

  for (int64_t tile_rows : {int64_t(256), (int64_t(4) << 20) / cols / 16 * 16, rows}) {
    if (tile_rows > rows) continue;
    CpuQuantLinear product(env, QuantLinearShape{m, rows, cols, tile_rows, DType::bf16, GradTiles::columns});
    CpuQuantLinear by_rows(env, QuantLinearShape{m, rows, cols, tile_rows, DType::bf16, GradTiles::rows});
    std::vector<bf16_t> tile(size_t(product.tile_elements()));
    std::vector<std::byte> scratch(std::max(product.scratch_bytes(), by_rows.scratch_bytes()));
    // Interleaved, so that a shared host's load moves both alike.
    double fwd_s = 1e30, grad_s = 1e30, rows_s = 1e30;
    for (int r = 0; r < repeats; ++r) {
      fwd_s = std::min(fwd_s, best_of(1, [&] { product.forward<bf16_t>(x, qw, tile, scratch, y); }));
      grad_s = std::min(grad_s, best_of(1, [&] { product.input_grad<bf16_t>(dy, qw, tile, scratch, dx); }));
      rows_s = std::min(rows_s, best_of(1, [&] { by_rows.input_grad<bf16_t>(dy, qw, tile, scratch, dx); }));
    }
    std::printf("  m %lld tile %5lld rows (%7.1f KiB): forward %.2f ms (plain %.2f, x%.2f), input grad by columns "
                "%.2f ms (plain %.2f, x%.2f), by rows %.2f ms (x%.2f)\n",
                (long long)m, (long long)tile_rows, double(tile.size() * 2) / 1024, fwd_s * 1e3, plain_fwd_s * 1e3,
                fwd_s / plain_fwd_s, grad_s * 1e3, plain_grad_s * 1e3, grad_s / plain_grad_s, rows_s * 1e3,
                rows_s / plain_grad_s);
  }
}


// The layouts oneDNN's products may take inside a quantised linear (y = x W^T over a tile of h
// of W's n rows, and dx += dy[:, r:r+h] W_tile), timed interleaved in one process: the tile's
// columns of y (or dy) as a strided view of the whole matrix, as a dense [m, h] buffer, and the
// tile prepacked in the weights layout oneDNN chooses (format any). Which implementation runs
// (oneDNN's name) is printed beside each time.
struct LayoutCase {
  std::string name;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  std::unordered_map<int, dnnl::memory> args;
  std::vector<double> times;
  double best() const { return *std::min_element(times.begin(), times.end()); }
  double median() const {
    std::vector<double> t = times;
    std::nth_element(t.begin(), t.begin() + long(t.size() / 2), t.end());
    return t[t.size() / 2];
  }
};

LayoutCase layout_case(const DnnlEnv& env, std::string name, const dnnl::memory::desc& src,
                       const dnnl::memory::desc& wei, const dnnl::memory::desc& dst, bool accumulate,
                       void* a, void* b, void* c) {
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  LayoutCase lc;
  lc.name = std::move(name);
  lc.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, env.engine);
  lc.prim = dnnl::matmul(lc.pd);
  lc.args[DNNL_ARG_SRC] = dnnl::memory(lc.pd.src_desc(), env.engine, a);
  lc.args[DNNL_ARG_WEIGHTS] = dnnl::memory(lc.pd.weights_desc(), env.engine, b);
  lc.args[DNNL_ARG_DST] = dnnl::memory(lc.pd.dst_desc(), env.engine, c);
  return lc;
}

void bench_layouts(const char* name, int64_t m, int64_t n, int64_t k, int64_t h, int repeats, const DnnlEnv& env) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using md = dnnl::memory::desc;
  const auto x = random_bf16(size_t(m * k), 2, 1.0f), dy = random_bf16(size_t(m * n), 3, 1.0f);
  const auto tile = random_bf16(size_t(h * k), 4, 0.02f);
  std::vector<bf16_t> y(size_t(m * n)), ydense(size_t(m * h)), dydense(size_t(m * h));
  std::vector<bf16_t> packed_f(size_t(h * k) * 2), packed_g(size_t(h * k) * 2);
  std::vector<float> dx(size_t(m * k));
  auto* X = const_cast<bf16_t*>(x.data());
  auto* DY = const_cast<bf16_t*>(dy.data());
  auto* T = const_cast<bf16_t*>(tile.data());
  const md x_md({m, k}, dt::bf16, {k, 1}), tile_t({k, h}, dt::bf16, {1, k}), tile_ab({h, k}, dt::bf16, {k, 1});
  const md y_strided({m, h}, dt::bf16, {n, 1}), y_dense({m, h}, dt::bf16, {h, 1});
  const md dy_strided({m, h}, dt::bf16, {n, 1}), dx_md({m, k}, dt::f32, {k, 1});
  std::vector<LayoutCase> cases;
  cases.push_back(layout_case(env, "fwd strided y", x_md, tile_t, y_strided, false, X, T, y.data()));
  cases.push_back(layout_case(env, "fwd dense y", x_md, tile_t, y_dense, false, X, T, ydense.data()));
  cases.push_back(layout_case(env, "fwd dense y, packed W", x_md, md({k, h}, dt::bf16, tag::any), y_dense, false, X,
                              packed_f.data(), ydense.data()));
  cases.push_back(layout_case(env, "grad strided dy", dy_strided, tile_ab, dx_md, true, DY, T, dx.data()));
  cases.push_back(layout_case(env, "grad dense dy", y_dense, tile_ab, dx_md, true, dydense.data(), T, dx.data()));
  cases.push_back(layout_case(env, "grad dense dy, packed W", y_dense, md({h, k}, dt::bf16, tag::any), dx_md, true,
                              dydense.data(), packed_g.data(), dx.data()));
  for (int i : {2, 5}) {
    const bool fwd = i == 2;
    const size_t need = cases[size_t(i)].pd.weights_desc().get_size();
    if (need > packed_f.size() * 2) std::printf("  packed weights need %zu bytes\n", need);
    dnnl::memory plain(fwd ? tile_t : tile_ab, env.engine, T);
    dnnl::reorder(plain, cases[size_t(i)].args[DNNL_ARG_WEIGHTS]).execute(env.stream, plain,
                                                                        cases[size_t(i)].args[DNNL_ARG_WEIGHTS]);
  }
  double copy_best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    for (auto& c : cases) c.times.push_back(best_of(1, [&] { c.prim.execute(env.stream, c.args); }));
    copy_best = std::min(copy_best, best_of(1, [&] {
      for (int64_t i = 0; i < m; ++i) std::memcpy(y.data() + i * n, ydense.data() + i * h, size_t(h) * 2);
    }));
  }
  const double flops = 2.0 * double(m) * double(h) * double(k);
  std::printf("%s: m %lld, h %lld of n %lld, k %lld (copy of [m, h] %.3f ms)\n", name, (long long)m, (long long)h,
              (long long)n, (long long)k, copy_best * 1e3);
  for (auto& c : cases)
    std::printf("  %-24s best %8.3f ms %7.1f GFLOP/s x%.2f, median %8.3f ms x%.2f of strided  %s\n", c.name.c_str(),
                c.best() * 1e3, flops / c.best() / 1e9, c.best() / cases[c.name.starts_with("fwd") ? 0 : 3].best(),
                c.median() * 1e3, c.median() / cases[c.name.starts_with("fwd") ? 0 : 3].median(), c.pd.impl_info_str());
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::strcmp(argv[1], "smoke") == 0;
  const int64_t m = smoke ? 8 : argc > 1 ? std::atoll(argv[1]) : 1024;
  const int repeats = smoke ? 1 : argc > 2 ? std::atoi(argv[2]) : 5;
  const DnnlEnv env = DnnlEnv::make_cpu();
  if (argc > 1 && std::strcmp(argv[1], "layouts") == 0) {
    const int64_t mm = argc > 2 ? std::atoll(argv[2]) : 1024;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
    bench_layouts("q of qkv", mm, 2560, 2048, 2048, reps, env);
    bench_layouts("k of qkv", mm, 2560, 2048, 256, reps, env);
    bench_layouts("gate tile", mm, 5632, 2048, 2048, reps, env);
    bench_layouts("down tile", mm, 2048, 5632, 736, reps, env);
    return 0;
  }
  if (smoke) {
    bench_shape("smoke", m, 96, 64, repeats, env);
    return 0;
  }
  bench_shape("q_proj", m, 2048, 2048, repeats, env);
  bench_shape("k_proj", m, 256, 2048, repeats, env);
  bench_shape("gate_proj", m, 5632, 2048, repeats, env);
  bench_shape("down_proj", m, 2048, 5632, repeats, env);
  return 0;
}
