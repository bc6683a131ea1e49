// Micro-benchmark (GPU, kernels library only): qk_norm_rope's forward and
// backward kernels, the vector path (a lane moves 8 or 4 consecutive elements
// of a head) against the pair kernel it falls back to (a warp per (row, head),
// one pair a lane), at the single-stream shapes, bf16, in two layouts:
// "block", the single-stream block's (q | k read in place from the
// projection's rows of 3D, out and dx dense [rows, 2D], the incoming gradient
// as cuDNN's dq and dk apart, [rows, D] each), and "packed" (every operand in
// rows of 3D, the Python op's; its v copy is not timed). Per call: the median
// of 9 windows of 10 back-to-back calls after 10 warm-up ones, CUDA events.
// GB/s count DRAM bytes: forward rows * (4D * 2 + 8H) (q and k read, written,
// rstd), backward rows * (6D * 2 + 8H) (the gradient and x's q and k read, dx
// written, rstd); cos/sin and weights stay in L2. "copy" is cudaMemcpyAsync of
// the forward's bytes (2D * 2 per row each way), a bandwidth reference. The
// last columns compare the two paths' results: the largest |vector - pair| of
// out and of dx (they may differ by a rounding: the sums of squares are added
// in another order) and whether the weight partials' sums agree.
//   qk_norm_rope_bench [rows tokens heads head_dim]...
//   (default: the SS-B/2 step, 73728 rows of 288 tokens, 12 heads of 64; then
//   head dims 72, 96 and 128 on the same rows)
// Build: cmake --build build --target qk_norm_rope_bench (binary in
// build/bench/kernels/). On the GPU machine: MODE=lab LAB=qk_norm_rope_bench
// bash tools/gpu_run.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/qk_norm_rope.h"

namespace {

using bf16 = __nv_bfloat16;
namespace k = perftrain::kernels;

#define CHECK(x)                                                                      \
  do {                                                                                \
    const cudaError_t e = (x);                                                        \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// Pseudo-random N(mean, std)-ish values from the index (sum of 4 uniforms).
__device__ float hash_normal(uint64_t i, uint32_t seed) {
  float s = 0.f;
  for (uint32_t r = 0; r < 4; ++r) {
    uint64_t x = i * 4 + r + (uint64_t(seed) << 40);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    s += float(x >> 40) / float(1 << 24);
  }
  return (s - 2.f) * 1.7320508f;  // variance 4/12 -> 1
}

template <typename T>
__global__ void fill(T* p, int64_t n, uint32_t seed, float std, float mean) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = hash_normal(uint64_t(i), seed) * std + mean;
    if constexpr (sizeof(T) == 2)
      p[i] = __float2bfloat16_rn(v);
    else
      p[i] = v;
  }
}

// max |a - b| over n bf16 pairs, in fp32 (atomicMax on the bits of a non-negative float).
__global__ void max_diff(const bf16* a, const bf16* b, int64_t n, unsigned* out) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
    m = d != d ? INFINITY : fmaxf(m, d);
  }
  atomicMax(out, __float_as_uint(m));
}

template <typename T>
void fill_dev(T* p, int64_t n, uint32_t seed, float std, float mean = 0.f) {
  fill<T><<<1024, 256>>>(p, n, seed, std, mean);
  CHECK(cudaGetLastError());
}

float device_max_diff(const bf16* a, const bf16* b, int64_t n) {
  unsigned* d;
  CHECK(cudaMalloc(&d, sizeof(unsigned)));
  CHECK(cudaMemset(d, 0, sizeof(unsigned)));
  max_diff<<<1024, 256>>>(a, b, n, d);
  unsigned h = 0;
  CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  float f;
  std::memcpy(&f, &h, sizeof f);
  return f;
}

double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 10; ++i) fn();
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int win = 0; win < 9; ++win) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < 10; ++i) fn();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / 10);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("qk_norm_rope_bench: no CUDA device\n");
    return 77;
  }
  struct Shape {
    int rows, tokens, heads, hd;
  };
  std::vector<Shape> shapes;
  if (argc > 1 && (argc - 1) % 4 != 0) {
    std::printf("usage: %s [rows tokens heads head_dim]...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i + 3 < argc; i += 4)
    shapes.push_back({std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2]), std::atoi(argv[i + 3])});
  if (shapes.empty()) shapes = {{73728, 288, 12, 64}, {73728, 288, 12, 72}, {73728, 288, 8, 96}, {73728, 288, 6, 128}};
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "| layout | rows | tokens | heads | hd | V | fwd vector ms (GB/s) | fwd pair ms (GB/s) | fwd speed-up | copy ms "
      "(GB/s) | bwd vector ms (GB/s) | bwd pair ms (GB/s) | bwd speed-up | max |out v-p| | max |dx v-p| | max |dw "
      "v-p| |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes)
    for (const bool packed : {false, true}) {
      const int64_t d = int64_t(s.heads) * s.hd, n = int64_t(s.rows) * 3 * d, half = s.hd / 2;
      bf16 *qkv, *out, *out2, *dq, *dk, *dx, *dx2;
      float *qw, *kw, *cs, *sn, *rstd, *rstd2, *parts, *parts2;
      const int tiles = k::qk_norm_rope_backward_tiles(s.rows, s.heads, prop.multiProcessorCount);
      const int64_t np = k::qk_norm_rope_backward_partials(tiles, s.hd);
      for (bf16** p : {&qkv, &out, &out2, &dq, &dk, &dx, &dx2}) CHECK(cudaMalloc(p, n * sizeof(bf16)));
      for (bf16* p : {out, out2, dx, dx2}) CHECK(cudaMemset(p, 0, n * sizeof(bf16)));  // packed: v never written
      for (float** p : {&qw, &kw}) CHECK(cudaMalloc(p, s.hd * sizeof(float)));
      for (float** p : {&cs, &sn}) CHECK(cudaMalloc(p, int64_t(s.tokens) * half * sizeof(float)));
      for (float** p : {&rstd, &rstd2}) CHECK(cudaMalloc(p, int64_t(s.rows) * 2 * s.heads * sizeof(float)));
      for (float** p : {&parts, &parts2}) CHECK(cudaMalloc(p, np * sizeof(float)));
      fill_dev(qkv, n, 1, 1.5f, 0.1f);
      fill_dev(dq, n, 2, 1.f);
      fill_dev(dk, n, 7, 1.f);
      fill_dev(qw, s.hd, 3, 0.5f, 1.f);
      fill_dev(kw, s.hd, 4, 0.5f, 1.f);
      fill_dev(cs, int64_t(s.tokens) * half, 5, 0.5f);  // not unit pairs: the kernels do not care
      fill_dev(sn, int64_t(s.tokens) * half, 6, 0.5f);
      const int64_t wo = packed ? 3 * d : 2 * d;  // out's and dx's row stride
      const k::QkRows<const bf16> x{qkv, qkv + d, 3 * d};
      const k::QkRows<const bf16> g = packed ? k::QkRows<const bf16>{dq, dq + d, 3 * d} : k::QkRows<const bf16>{dq, dk, d};
      auto rows_of = [&](bf16* p) { return k::QkRows<bf16>{p, p + d, wo}; };
      auto a = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
      const int v = k::qk_norm_rope_vector_elems(s.hd, 2, a(qkv) | a(out) | a(dq) | a(dk) | a(dx) | uintptr_t(2 * d),
                                                 a(qw) | a(kw) | a(cs) | a(sn));
      auto fwd = [&](bool vec, bf16* o, float* r) {
        k::qk_norm_rope_forward<bf16>(x, qw, kw, cs, sn, rows_of(o), r, s.rows, s.tokens, s.heads, s.hd, 1e-6f, nullptr,
                                      vec);
      };
      auto bwd = [&](bool vec, bf16* o, float* p) {
        k::qk_norm_rope_backward<bf16>(g, x, rstd, qw, kw, cs, sn, rows_of(o), p, s.rows, s.tokens, s.heads, s.hd, tiles,
                                       nullptr, vec);
      };
      const double fwd_v = median_ms([&] { fwd(true, out, rstd); });
      const double fwd_p = median_ms([&] { fwd(false, out2, rstd2); });
      const int64_t qk_bytes = int64_t(s.rows) * 2 * d * 2;
      const double copy = median_ms([&] { CHECK(cudaMemcpyAsync(out2, qkv, qk_bytes, cudaMemcpyDeviceToDevice)); });
      fwd(true, out, rstd);
      fwd(false, out2, rstd2);
      const double bwd_v = median_ms([&] { bwd(true, dx, parts); });
      const double bwd_p = median_ms([&] { bwd(false, dx2, parts2); });
      bwd(true, dx, parts);
      bwd(false, dx2, parts2);
      CHECK(cudaDeviceSynchronize());
      const int64_t on = int64_t(s.rows) * wo;
      const float d_out = device_max_diff(out, out2, on), d_dx = device_max_diff(dx, dx2, on);
      std::vector<float> hp(np), hp2(np);
      CHECK(cudaMemcpy(hp.data(), parts, np * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hp2.data(), parts2, np * sizeof(float), cudaMemcpyDeviceToHost));
      double d_dw = 0, dw_scale = 0;
      for (int plane = 0; plane < 2; ++plane)
        for (int c = 0; c < s.hd; ++c) {
          double xs = 0, ys = 0;
          for (int t = 0; t < tiles; ++t) {
            xs += hp[(int64_t(plane) * tiles + t) * s.hd + c];
            ys += hp2[(int64_t(plane) * tiles + t) * s.hd + c];
          }
          d_dw = std::max(d_dw, std::fabs(xs - ys));
          dw_scale = std::max(dw_scale, std::fabs(ys));
        }
      const double fb = double(s.rows) * (4.0 * d * 2 + 8.0 * s.heads);
      const double bb = double(s.rows) * (6.0 * d * 2 + 8.0 * s.heads);
      auto gbs = [](double bytes, double ms) { return bytes / ms * 1e-6; };
      std::printf("| %s | %d | %d | %d | %d | %d | %.3f (%.0f) | %.3f (%.0f) | %.2fx | %.3f (%.0f) | %.3f (%.0f) | "
                  "%.3f (%.0f) | %.2fx | %.3g | %.3g | %.3g of %.3g |\n",
                  packed ? "packed" : "block", s.rows, s.tokens, s.heads, s.hd, v, fwd_v, gbs(fb, fwd_v), fwd_p,
                  gbs(fb, fwd_p), fwd_p / fwd_v, copy, gbs(2.0 * qk_bytes, copy), bwd_v, gbs(bb, bwd_v), bwd_p,
                  gbs(bb, bwd_p), bwd_p / bwd_v, d_out, d_dx, d_dw, dw_scale);
      std::fflush(stdout);
      for (void* p : std::vector<void*>{qkv, out, out2, dq, dk, dx, dx2, qw, kw, cs, sn, rstd, rstd2, parts, parts2})
        CHECK(cudaFree(p));
    }
  return 0;
}
