// fp8 against bf16 for one linear layer's three products at DiT-XL/2's
// shapes (issue 39), torch-free, through kernels::gemm_lt (cuBLASLt, the
// algorithm tuned as in training: 8 candidates) and kernels/fp8_cast:
//   forward  Y [M, N]  = X W^T        bf16 x bf16 -> bf16   | E4M3 x E4M3 -> bf16, fast accumulation
//   dgrad    dX [M, K] = dY W         bf16 x bf16 -> bf16   | E5M2 dY x E4M3 W^T -> bf16
//   wgrad    dW [N, K] = dY^T X       bf16 x bf16 -> fp32   | E5M2 dY^T x E4M3 X^T -> fp32
// and the casts the fp8 layer adds per step (X and dY cast-transposed, W
// cast-transposed), with their GB/s. "layer" sums the three products (fp8:
// plus the casts). A sanity line compares the fp8 forward with the bf16 one
// on the first 64 rows (relative L2; fp8's rounding gives a few percent).
// Where K is a norm's width (K <= 8192): X as the training step makes it,
// residual_adaln (fp32 stream, bf16 y and h, xhat kept) writing bf16 h then
// X's cast-transpose, against residual_adaln writing X's E4M3 codes in place
// of h (kernels/fp8_cast.h, Fp8RowOut) then fp8_transpose for X^T. Where K
// is wider than N (fc2: X is GELU's output): a GELU pass writing bf16 act
// then X's cast-transpose, against the cast-transpose's GELU prologue; and
// for fc1's dY of that shape, a GELU-backward pass writing bf16 d(pre), its
// E5M2 cast-transpose and the bias's column sums, against the cast-transpose's
// GELU-backward prologue with its column partials and their reduction
// (ops/fp8_linear_gelu); db beside dY's cast (its column partials, against
// the column sums of dY apart: ops/fp8_linear's backward); and likewise for a SwiGLU of that width (the
// single-stream FFN's h and d(gate_up): kernels/swiglu's forward or backward
// then the cast-transpose, against the SwiGLU prologues, ops/fp8_linear_swiglu);
// for GELU and SwiGLU also the row kernel's prologue alone (codes, no
// transpose), as a forward under no-grad casts.
// Inputs: uniform in [-1, 1] (X, dY) and [-1/sqrt(K), 1/sqrt(K)] (W), the
// scales mapping those bounds to the format's max. Per call: the median of
// 7 windows of 20 back-to-back calls (check_util.h).
//   fp8_gemm_bench [M K N]...   (default: 65536 x 1152 -> 3456, 1152 -> 4608, 4608 -> 1152)
// Build: cmake --build build --target fp8_gemm_bench (binary in
// build/bench/kernels/). On the GPU machine:
//   MODE=lab LAB=fp8_gemm_bench bash tools/gpu_run.sh
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "check_util.h"
#include "kernels/column_sums.h"
#include "kernels/device_info.h"
#include "kernels/fp8_cast.h"
#include "kernels/gemm_lt.h"
#include "kernels/residual_adaln.h"
#include "kernels/swiglu.h"

namespace {

using perftrain::kernels::Fp8CastArgs;
using perftrain::kernels::Fp8Format;
using perftrain::kernels::Fp8Source;
using perftrain::kernels::GemmArgs;
using perftrain::kernels::GemmContext;
using perftrain::kernels::GemmDtype;
using bf16 = __nv_bfloat16;

__global__ void fill_uniform(bf16* x, int64_t n, float bound, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((float(h) / 4294967296.0f * 2.f - 1.f) * bound);
  }
}

struct Buffers {
  std::vector<void*> p;
  void* get(size_t bytes) {
    void* q = nullptr;
    if (cudaMalloc(&q, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    p.push_back(q);
    return q;
  }
  ~Buffers() {
    for (void* q : p) cudaFree(q);
  }
};

float* device_scalar(Buffers& b, float v) {
  auto* p = static_cast<float*>(b.get(sizeof(float)));
  cudaMemcpy(p, &v, sizeof(float), cudaMemcpyHostToDevice);
  return p;
}

// One tensor's bf16 values, its scale and scale_inv, its fp8 copy and transpose.
struct Operand {
  bf16* x;
  float *scale, *scale_inv, *amax;
  uint8_t *q, *q_t;
  int64_t rows, cols;
  Fp8Format format;
};

Operand make_operand(Buffers& b, int64_t rows, int64_t cols, float bound, Fp8Format f, uint32_t seed) {
  Operand o{};
  o.rows = rows;
  o.cols = cols;
  o.format = f;
  o.x = static_cast<bf16*>(b.get(rows * cols * sizeof(bf16)));
  fill_uniform<<<1024, 256>>>(o.x, rows * cols, bound, seed);
  const float scale = perftrain::kernels::fp8_max(f) / bound;
  o.scale = device_scalar(b, scale);
  o.scale_inv = device_scalar(b, 1.f / scale);
  o.amax = device_scalar(b, 0.f);
  o.q = static_cast<uint8_t*>(b.get(rows * cols));
  o.q_t = static_cast<uint8_t*>(b.get(rows * cols));
  return o;
}

Fp8CastArgs cast_args(const Operand& o, perftrain::kernels::Fp8Prologue prologue) {
  Fp8CastArgs a;
  a.prologue = prologue;
  a.x = o.x;
  a.x_type = Fp8Source::kBF16;
  a.rows = o.rows;
  a.cols = o.cols;
  a.format = o.format;
  a.scale = o.scale;
  a.q = o.q;
  a.amax = o.amax;
  return a;
}

void cast_transpose(const Operand& o, cudaStream_t s,
                    perftrain::kernels::Fp8Prologue prologue = perftrain::kernels::Fp8Prologue::kNone,
                    const bf16* x2 = nullptr, float* col_partials = nullptr) {
  Fp8CastArgs a = cast_args(o, prologue);
  a.x2 = x2;
  a.col_partials = col_partials;
  a.q_t = o.q_t;
  perftrain::kernels::fp8_cast_transpose(a, s);
}

// The row kernel alone (q, no transpose): what a forward under no-grad casts.
void row_cast(const Operand& o, cudaStream_t s, perftrain::kernels::Fp8Prologue prologue) {
  perftrain::kernels::fp8_cast(cast_args(o, prologue), s);
}

GemmDtype fp8_type(Fp8Format f) { return f == Fp8Format::kE4M3 ? GemmDtype::kE4M3 : GemmDtype::kE5M2; }

// D [m, n] = A [m, k] B [n, k]^T in fp8 (both K-major).
GemmArgs fp8_product(int64_t m, int64_t n, int64_t k, const uint8_t* a, const Operand& oa, const uint8_t* b,
                     const Operand& ob, void* d, GemmDtype d_type, bool fast) {
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.b = b, g.trans_b = true, g.d = d, g.d_type = d_type;
  g.ab_type = fp8_type(oa.format);
  g.b_fp8_type = fp8_type(ob.format);
  g.a_scale_inv = oa.scale_inv;
  g.b_scale_inv = ob.scale_inv;
  g.fast_accum = fast;
  return g;
}

GemmArgs bf16_product(int64_t m, int64_t n, int64_t k, const void* a, bool ta, const void* b, bool tb, void* d,
                      GemmDtype d_type) {
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.trans_a = ta, g.b = b, g.trans_b = tb, g.d = d, g.d_type = d_type;
  return g;
}

// Relative L2 of fp8's forward against bf16's on the first 64 rows.
double forward_difference(const bf16* fp8_y, const bf16* bf16_y, int64_t n) {
  const int64_t count = 64 * n;
  std::vector<bf16> a(count), b(count);
  cudaMemcpy(a.data(), fp8_y, count * sizeof(bf16), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), bf16_y, count * sizeof(bf16), cudaMemcpyDeviceToHost);
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

// The norm that makes X (the step's residual_adaln, 256 tokens a sample where
// m allows) with X's cast-transpose, against the same norm writing X's codes
// with fp8_transpose: the ms of each and their difference.
int norm_paths(int64_t m, int64_t k, const Operand& x, cudaStream_t s) {
  if (k > perftrain::kernels::kResidualAdaLNMaxCols) return 0;
  Buffers b;
  const int tokens = m % 256 == 0 ? 256 : int(m), batch = int(m / tokens);
  auto* stream_x = static_cast<float*>(b.get(m * k * sizeof(float)));
  auto* x1 = static_cast<float*>(b.get(m * k * sizeof(float)));
  auto* xhat = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  auto* mod = static_cast<bf16*>(b.get(int64_t(batch) * 3 * k * sizeof(bf16)));
  auto* stats = static_cast<float*>(b.get(2 * m * sizeof(float)));
  CHECK(cudaMemsetAsync(stream_x, 0, m * k * sizeof(float), s));
  fill_uniform<<<1024, 256>>>(mod, int64_t(batch) * 3 * k, 0.5f, 7);
  auto norm = [&](bf16* h, const perftrain::kernels::Fp8RowOut& f) {
    perftrain::kernels::residual_adaln_forward<float, bf16, bf16>(stream_x, mod, 3 * k, x.x, nullptr, mod + k, 3 * k,
                                                                  mod + 2 * k, 3 * k, x1, h, stats, stats + m, xhat,
                                                                  batch, tokens, int(k), 1e-6f, s, f);
  };
  Operand from_h = x;  // X's cast made from the norm's h
  from_h.x = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  double unfused = 0, fused = 0;
  if (median_launch_ms([&] { norm(from_h.x, {}), cast_transpose(from_h, s); }, &unfused) != 0) return 1;
  if (median_launch_ms([&] { norm(nullptr, {x.q, x.scale, x.amax}), perftrain::kernels::fp8_transpose(x.q, m, k, x.q_t, s); },
                       &fused) != 0)
    return 1;
  std::printf("  X from its norm: bf16 h + cast-transpose %.3f ms, codes in the norm + fp8_transpose %.3f ms "
              "(%.3f ms saved)\n", unfused, fused, unfused - fused);
  return 0;
}

// GELU as a plain pass (ATen's bf16 gelu(x, "tanh"): 2 bytes read, 2 written).
__global__ void gelu_tanh_kernel(const bf16* pre, bf16* act, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(pre[i]);
    const float inner = 0.7978845608f * (x + 0.044715f * (x * x * x));
    act[i] = __float2bfloat16_rn(0.5f * x * (1.0f + tanhf(inner)));
  }
}

// GELU's backward as a plain pass (ATen's bf16 gelu_backward(d, pre, "tanh"): 4 bytes read, 2 written).
__global__ void gelu_tanh_backward_kernel(const bf16* d, const bf16* pre, bf16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(pre[i]), x_sq = x * x;
    const float t = tanhf(0.7978845608f * (x + 0.044715f * (x_sq * x)));
    const float g = 0.5f * (1.0f + t) + (0.5f * x) * (1.0f - t * t) * (0.7978845608f * (1.0f + 0.134145f * x_sq));
    out[i] = __float2bfloat16_rn(__bfloat162float(d[i]) * g);
  }
}

// db [n] of dY [m, n] bf16, two ways: the column sums of dY (with their
// chunk partials), or the reduction of the cast-transpose's tile partials.
struct BiasGradient {
  float *db, *sum_partials, *tile_partials;
  int chunks;
  int64_t m, n, tiles;
  BiasGradient(Buffers& b, int64_t rows, int64_t cols) : m(rows), n(cols) {
    chunks = perftrain::kernels::column_sums_chunks(m, int(n), 1, perftrain::kernels::multiprocessor_count());
    tiles = perftrain::kernels::fp8_cast_partial_rows(m);
    db = static_cast<float*>(b.get(n * sizeof(float)));
    sum_partials = static_cast<float*>(b.get(int64_t(chunks) * n * sizeof(float)));
    tile_partials = static_cast<float*>(b.get(tiles * n * sizeof(float)));
  }
  void column_sums(const bf16* dy, cudaStream_t s) {
    perftrain::kernels::column_sums<bf16>(&dy, &db, 1, m, int(n), n, sum_partials, chunks, s);
  }
  // The cast-transpose of `from` (with its prologue) writing the tile partials, then their reduction.
  void from_cast(const Operand& from, cudaStream_t s, perftrain::kernels::Fp8Prologue prologue, const bf16* x2) {
    cast_transpose(from, s, prologue, x2, tile_partials);
    perftrain::kernels::column_sums_reduce(tile_partials, &db, 1, int(tiles), int(n), s);
  }
};

// fc1's dY where its output feeds GELU (dY [M, K], K = 4D): GELU's backward
// writing bf16 d(pre), its E5M2 cast-transpose and the bias's column sums,
// against the cast-transpose's GELU-backward prologue with column partials
// and their reduction (ops/fp8_linear_gelu).
int gelu_backward_paths(int64_t m, int64_t k, const Operand& x, cudaStream_t s) {
  Buffers b;
  auto* pre = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  auto* dact = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  fill_uniform<<<1024, 256>>>(pre, m * k, 3.0f, 13);
  fill_uniform<<<1024, 256>>>(dact, m * k, 1.0f, 17);
  Operand dy = x;  // x's shape and buffers, E5M2
  dy.format = Fp8Format::kE5M2;
  dy.x = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));  // d(pre) where written
  BiasGradient db(b, m, k);
  double unfused = 0, fused = 0;
  if (median_launch_ms(
          [&] {
            gelu_tanh_backward_kernel<<<1024, 256, 0, s>>>(dact, pre, dy.x, m * k);
            cast_transpose(dy, s);
            db.column_sums(dy.x, s);
          },
          &unfused) != 0)
    return 1;
  Operand from_dact = dy;
  from_dact.x = dact;
  if (median_launch_ms([&] { db.from_cast(from_dact, s, perftrain::kernels::Fp8Prologue::kGeluTanhBackward, pre); },
                       &fused) != 0)
    return 1;
  std::printf("  dY from GELU's backward: bf16 d(pre) + cast-transpose + column sums %.3f ms, the cast-transpose's "
              "GELU-backward prologue + partials %.3f ms (%.3f ms saved)\n", unfused, fused, unfused - fused);
  return 0;
}

// db of a linear with a bias (dY [M, N] bf16): dY's E5M2 cast-transpose then
// the column sums of dY, against the cast-transpose writing the column
// partials beside its codes and their reduction (ops/fp8_linear's backward).
int bias_gradient_paths(int64_t m, int64_t n, const Operand& dy, cudaStream_t s) {
  Buffers b;
  BiasGradient db(b, m, n);
  double apart = 0, fused = 0;
  if (median_launch_ms([&] { cast_transpose(dy, s), db.column_sums(dy.x, s); }, &apart) != 0 ||
      median_launch_ms([&] { db.from_cast(dy, s, perftrain::kernels::Fp8Prologue::kNone, nullptr); }, &fused) != 0)
    return 1;
  std::printf("  db beside dY's cast: cast-transpose + column sums %.3f ms, the cast-transpose's partials %.3f ms "
              "(%.3f ms saved)\n", apart, fused, apart - fused);
  return 0;
}

// Where X is SwiGLU's output h [M, K] (ffn.down's input): h from gate_up
// [M, 2K] by kernels/swiglu then its cast-transpose, against the SwiGLU
// prologue; d(gate_up) by kernels/swiglu's backward then its E5M2
// cast-transpose [M, 2K], against the SwiGLU-backward prologue.
int swiglu_paths(int64_t m, int64_t k, const Operand& x, cudaStream_t s) {
  Buffers b;
  auto* gate_up = static_cast<bf16*>(b.get(2 * m * k * sizeof(bf16)));
  auto* dh = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  fill_uniform<<<1024, 256>>>(gate_up, 2 * m * k, 3.0f, 19);
  fill_uniform<<<1024, 256>>>(dh, m * k, 1.0f, 23);
  Operand h = x;  // [M, K] E4M3
  h.x = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  Operand dgu = x;  // [M, 2K] E5M2
  dgu.format = Fp8Format::kE5M2;
  dgu.cols = 2 * k;
  dgu.x = static_cast<bf16*>(b.get(2 * m * k * sizeof(bf16)));
  dgu.q = static_cast<uint8_t*>(b.get(2 * m * k));
  dgu.q_t = static_cast<uint8_t*>(b.get(2 * m * k));
  double unfused = 0, fused = 0, unfused_bwd = 0, fused_bwd = 0, row = 0;
  Operand from_gate_up = h;
  from_gate_up.x = gate_up;
  from_gate_up.cols = k;
  if (median_launch_ms([&] { perftrain::kernels::swiglu_forward(gate_up, h.x, m, int(k), s), cast_transpose(h, s); },
                       &unfused) != 0 ||
      median_launch_ms([&] { cast_transpose(from_gate_up, s, perftrain::kernels::Fp8Prologue::kSwiglu); }, &fused) != 0 ||
      median_launch_ms([&] { row_cast(from_gate_up, s, perftrain::kernels::Fp8Prologue::kSwiglu); }, &row) != 0)
    return 1;
  Operand from_dh = dgu;
  from_dh.x = dh;
  from_dh.cols = k;
  if (median_launch_ms([&] { perftrain::kernels::swiglu_backward(dh, gate_up, dgu.x, m, int(k), s), cast_transpose(dgu, s); },
                       &unfused_bwd) != 0 ||
      median_launch_ms([&] { cast_transpose(from_dh, s, perftrain::kernels::Fp8Prologue::kSwigluBackward, gate_up); },
                       &fused_bwd) != 0)
    return 1;
  std::printf("  X from SwiGLU: bf16 h + cast-transpose %.3f ms, the SwiGLU prologue %.3f ms (%.3f ms saved); "
              "under no-grad the row kernel's %.3f ms\n", unfused, fused, unfused - fused, row);
  std::printf("  dY from SwiGLU's backward: bf16 d(gate_up) + cast-transpose %.3f ms, the SwiGLU-backward prologue "
              "%.3f ms (%.3f ms saved)\n", unfused_bwd, fused_bwd, unfused_bwd - fused_bwd);
  return 0;
}

// Where X is GELU's output (fc2's input, K = 4D): GELU writing bf16 act then
// X's cast-transpose, against the cast-transpose's GELU prologue reading pre
// (ops/fp8_linear_gelu): the ms of each and their difference.
int gelu_paths(int64_t m, int64_t k, const Operand& x, cudaStream_t s) {
  Buffers b;
  auto* pre = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  fill_uniform<<<1024, 256>>>(pre, m * k, 3.0f, 11);
  Operand from_act = x;
  from_act.x = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  Operand from_pre = x;
  from_pre.x = pre;
  double unfused = 0, fused = 0, row = 0;
  if (median_launch_ms([&] { gelu_tanh_kernel<<<1024, 256, 0, s>>>(pre, from_act.x, m * k), cast_transpose(from_act, s); },
                       &unfused) != 0)
    return 1;
  if (median_launch_ms([&] { cast_transpose(from_pre, s, perftrain::kernels::Fp8Prologue::kGeluTanh); }, &fused) != 0 ||
      median_launch_ms([&] { row_cast(from_pre, s, perftrain::kernels::Fp8Prologue::kGeluTanh); }, &row) != 0)
    return 1;
  std::printf("  X from GELU: bf16 act + cast-transpose %.3f ms, the cast-transpose's GELU prologue %.3f ms "
              "(%.3f ms saved); under no-grad the row kernel's %.3f ms\n", unfused, fused, unfused - fused, row);
  return 0;
}

int run_shape(int64_t m, int64_t k, int64_t n, const GemmContext& ctx) {
  Buffers b;
  Operand x = make_operand(b, m, k, 1.f, Fp8Format::kE4M3, 1);
  Operand w = make_operand(b, n, k, 1.f / std::sqrt(float(k)), Fp8Format::kE4M3, 2);
  Operand dy = make_operand(b, m, n, 1.f, Fp8Format::kE5M2, 3);
  auto* y_bf16 = static_cast<bf16*>(b.get(m * n * sizeof(bf16)));
  auto* y_fp8 = static_cast<bf16*>(b.get(m * n * sizeof(bf16)));
  auto* dx = static_cast<bf16*>(b.get(m * k * sizeof(bf16)));
  auto* dw = static_cast<float*>(b.get(n * k * sizeof(float)));
  for (const Operand* o : {&x, &w, &dy}) cast_transpose(*o, ctx.stream);
  CHECK(cudaDeviceSynchronize());

  const GemmArgs bf[3] = {bf16_product(m, n, k, x.x, false, w.x, true, y_bf16, GemmDtype::kBF16),
                          bf16_product(m, k, n, dy.x, false, w.x, false, dx, GemmDtype::kBF16),
                          bf16_product(n, k, m, dy.x, true, x.x, false, dw, GemmDtype::kF32)};
  const GemmArgs f8[3] = {fp8_product(m, n, k, x.q, x, w.q, w, y_fp8, GemmDtype::kBF16, true),
                          fp8_product(m, k, n, dy.q, dy, w.q_t, w, dx, GemmDtype::kBF16, false),
                          fp8_product(n, k, m, dy.q_t, dy, x.q_t, x, dw, GemmDtype::kF32, false)};
  const char* names[3] = {"forward", "dgrad", "wgrad"};
  double bf_total = 0, f8_total = 0;
  std::printf("\nM=%lld K=%lld N=%lld (%.2f GFLOP a product)\n", (long long)m, (long long)k, (long long)n,
              2.0 * m * n * k * 1e-9);
  std::printf("  %-8s %10s %10s %9s %9s %8s\n", "product", "bf16 ms", "fp8 ms", "bf16 TF/s", "fp8 TF/s", "speedup");
  for (int i = 0; i < 3; ++i) {
    double t_bf = 0, t_f8 = 0;
    try {
      if (median_launch_ms([&] { perftrain::kernels::gemm_lt(bf[i], ctx); }, &t_bf) != 0) return 1;
      if (median_launch_ms([&] { perftrain::kernels::gemm_lt(f8[i], ctx); }, &t_f8) != 0) return 1;
    } catch (const std::exception& e) {
      std::printf("  %-8s refused: %s\n", names[i], e.what());
      return 1;
    }
    const double flop = 2.0 * m * n * k;
    std::printf("  %-8s %10.3f %10.3f %9.0f %9.0f %7.2fx\n", names[i], t_bf, t_f8, flop / t_bf * 1e-9,
                flop / t_f8 * 1e-9, t_bf / t_f8);
    bf_total += t_bf;
    f8_total += t_f8;
  }
  double casts = 0;
  for (const Operand* o : {&x, &w, &dy}) {
    double t = 0;
    if (median_launch_ms([&] { cast_transpose(*o, ctx.stream); }, &t) != 0) return 1;
    const double bytes = double(o->rows) * o->cols * 4;  // 2 read, 1 + 1 written
    std::printf("  cast-transpose %s [%lld, %lld]: %.3f ms, %.0f GB/s\n", o == &x ? "X" : o == &w ? "W" : "dY",
                (long long)o->rows, (long long)o->cols, t, bytes / t * 1e-6);
    casts += t;
  }
  std::printf("  layer: bf16 %.3f ms, fp8 %.3f ms (products %.3f + casts %.3f): %.2fx\n", bf_total,
              f8_total + casts, f8_total, casts, bf_total / (f8_total + casts));
  std::printf("  fp8 forward against bf16 (first 64 rows): relative L2 %.4f\n", forward_difference(y_fp8, y_bf16, n));
  if (bias_gradient_paths(m, n, dy, ctx.stream) != 0) return 1;
  if (k > n)  // fc2's or down's shape: X is GELU's or SwiGLU's output
    return gelu_paths(m, k, x, ctx.stream) | gelu_backward_paths(m, k, x, ctx.stream) | swiglu_paths(m, k, x, ctx.stream);
  return norm_paths(m, k, x, ctx.stream);
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc - 1) % 3 != 0) {
    std::printf("usage: %s [M K N]...\n", argv[0]);
    return 2;
  }
  if (skip_without_sm90("fp8_gemm_bench")) return kSkipCode;
  std::vector<std::array<int64_t, 3>> shapes;
  for (int i = 1; i + 2 < argc; i += 3)
    shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2])});
  if (shapes.empty()) shapes = {{65536, 1152, 3456}, {65536, 1152, 4608}, {65536, 4608, 1152}};
  GemmContext ctx;
  if (cublasLtCreate(&ctx.handle) != CUBLAS_STATUS_SUCCESS) return 1;
  ctx.workspace_bytes = size_t(32) << 20;  // as ops::kCublasLtWorkspaceBytes
  CHECK(cudaMalloc(&ctx.workspace, ctx.workspace_bytes));
  ctx.tune_candidates = 8;  // as training's default (ops::kDefaultGemmTuneCandidates)
  int rc = 0;
  for (const auto& s : shapes) rc |= run_shape(s[0], s[1], s[2], ctx);
  cudaFree(ctx.workspace);
  cublasLtDestroy(ctx.handle);
  return rc;
}
