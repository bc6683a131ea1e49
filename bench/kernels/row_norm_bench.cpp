// Micro-benchmark (GPU, libtorch for buffers and timing): the four row-norm
// kernels of kernels/row_norm.cuh, forward and backward, at the DiT and
// single-stream shapes, with the bandwidth each reaches against a plain
// device-to-device copy of the same bytes (the floor a memory-bound kernel
// can approach). PERFORMANCE.md's lever 3 says the residual/RMS kernels reach
// ~2.7 TB/s where DiT's LayerNorm ones reach ~3.8: this table shows each one
// alone, so a GPU session sees which kernel and which direction holds the gap.
// Types as the fused steps run them: the residual stream x (and x1, dx,
// dx1_ext) fp32, modulations bf16, y, h, the kept xhat and dh bf16; the ops
// keep xhat (16-bit beside an fp32 x), so the residual and RMS kernels write
// it forward and read it in place of x backward. Bytes per row, from the
// kernels' headers with those types (D = cols; statistics 4 bytes each):
//   adaln_layernorm      fwd x 4D -> h 2D, mean, rstd                      6D + 8
//                        bwd x 4D, dh 2D, mean, rstd -> dx 4D              10D + 8
//   residual_adaln       fwd x 4D, y 2D -> x1 4D, h 2D, xhat 2D            14D + 8
//                        bwd dx1 4D, dh 2D, xhat 2D, y 2D -> dx 4D, dy 2D  16D + 8
//   rms_adaln            fwd x 4D -> h 2D, xhat 2D, rstd                   8D + 4
//                        bwd dh 2D, xhat 2D, rstd -> dx 4D                 8D + 4
//   residual_rms_adaln   fwd x 4D, y 2D -> x1 4D, h 2D, xhat 2D            14D + 8
//                        bwd dx1 4D, dh 2D, xhat 2D, y 2D -> dx 4D, dy 2D  16D + 8
// (per-sample gate/shift/scale rows and the backward's fp32 partials are not
// counted: they are per sample or per tile, not per row). Per call: the
// median of 9 windows of 10 back-to-back calls after 10 warm-up ones, CUDA
// events (torch_timing.h), fresh random inputs; the backward includes its
// small column-reduce kernel, as the ops launch it.
//   row_norm_bench [batch tokens cols]...   (default: the target rows' shapes:
//     256 256 768, 256 288 768, 128 288 1152, 256 256 1152, 64 1024 768, 32 1152 1152)
// Build: cmake --build build --target row_norm_bench (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=row_norm_bench [LAB_ARGS="256 288 768"].
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "kernels/adaln_layernorm.h"
#include "kernels/device_info.h"
#include "kernels/residual_adaln.h"
#include "kernels/residual_rms_adaln.h"
#include "kernels/rms_adaln.h"

#include "torch_timing.h"

namespace {

using bf16 = __nv_bfloat16;
namespace k = perftrain::kernels;

struct Shape {
  int batch, tokens, cols;
};

template <typename T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Every buffer one shape needs, filled with fresh random values (the
// statistics too: the backward only reads them).
struct Buffers {
  Buffers(const Shape& s) {
    const int64_t rows = int64_t(s.batch) * s.tokens, d = s.cols;
    const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    const auto b16 = f32.dtype(at::kBFloat16);
    x = at::randn({rows, d}, f32), x1 = at::empty({rows, d}, f32), dx = at::empty({rows, d}, f32);
    dx1 = at::randn({rows, d}, f32);
    y = at::randn({rows, d}, b16), h = at::empty({rows, d}, b16), xhat = at::randn({rows, d}, b16);
    dh = at::randn({rows, d}, b16), dy = at::empty({rows, d}, b16);
    mod = at::randn({s.batch, 3, d}, b16) * 0.1;  // gate, shift, scale rows of a sample, stride 3D
    dmod = at::empty({3, s.batch, d}, b16);  // dgate, dshift, dscale, each [batch, D] contiguous
    weight = at::randn({2, d}, f32) * 0.1 + 1.0;  // post and pre weights
    mean = at::randn({rows}, f32), rstd = at::rand({rows}, f32) + 0.5, y_rstd = at::rand({rows}, f32) + 0.5;
    dweight = at::empty({2, s.batch, d}, f32);
  }
  at::Tensor x, x1, dx, dx1, y, h, xhat, dh, dy, mod, dmod, weight, mean, rstd, y_rstd, dweight;
  const bf16* gate() const { return ptr<bf16>(mod); }
  // The gradient planes: 0 gate, 1 shift, 2 scale.
  bf16* dplane(int i) const { return ptr<bf16>(dmod) + i * dmod.size(1) * dmod.size(2); }
  const bf16* shift() const { return ptr<bf16>(mod) + mod.size(2); }
  const bf16* scale() const { return ptr<bf16>(mod) + 2 * mod.size(2); }
  int64_t mod_stride() const { return 3 * mod.size(2); }
};

// fp32 scratch of the given floats (the backward's partials).
at::Tensor scratch(int64_t floats) {
  return at::empty({floats}, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
}

struct Row {
  const char* op;
  const char* dir;
  double bytes_per_row_d, bytes_per_row_const;  // bytes per row = a * D + b
  std::function<void()> run;
};

std::vector<Row> rows_for(const Shape& s, Buffers& b, cudaStream_t st, int sms) {
  const int B = s.batch, T = s.tokens, D = s.cols;
  const float eps = 1e-6f;
  std::vector<Row> out;
  const int ln_tiles = k::adaln_layernorm_backward_tiles(B, T, sms);
  const at::Tensor ln_part = scratch(2 * int64_t(B) * ln_tiles * D);
  out.push_back({"adaln_layernorm", "fwd", 6, 8, [&b, B, T, D, st, eps] {
                   k::adaln_layernorm_forward<float, bf16, bf16>(ptr<float>(b.x), b.shift(), b.mod_stride(), b.scale(),
                                                                 b.mod_stride(), ptr<bf16>(b.h), ptr<float>(b.mean),
                                                                 ptr<float>(b.rstd), B, T, D, eps, st);
                 }});
  out.push_back({"adaln_layernorm", "bwd", 10, 8, [&b, B, T, D, st, ln_tiles, ln_part] {
                   k::adaln_layernorm_backward<float, bf16, bf16>(
                       ptr<bf16>(b.dh), ptr<float>(b.x), b.scale(), b.mod_stride(), ptr<float>(b.mean),
                       ptr<float>(b.rstd), ptr<float>(b.dx), b.dplane(1), b.dplane(2), ptr<float>(ln_part), B, T, D,
                       ln_tiles, st);
                 }});
  out.push_back({"residual_adaln", "fwd", 14, 8, [&b, B, T, D, st, eps] {
                   k::residual_adaln_forward<float, bf16, bf16>(
                       ptr<float>(b.x), b.gate(), b.mod_stride(), ptr<bf16>(b.y), nullptr, b.shift(), b.mod_stride(),
                       b.scale(), b.mod_stride(), ptr<float>(b.x1), ptr<bf16>(b.h), ptr<float>(b.mean),
                       ptr<float>(b.rstd), ptr<bf16>(b.xhat), B, T, D, eps, st);
                 }});
  const int ra_tiles = k::residual_adaln_backward_tiles(B, T, D, false, sms);
  const at::Tensor ra_part = scratch(k::residual_adaln_backward_partials(B, ra_tiles, D, false));
  out.push_back({"residual_adaln", "bwd", 16, 8, [&b, B, T, D, st, ra_tiles, ra_part] {
                   k::residual_adaln_backward<float, bf16, bf16>(
                       ptr<float>(b.dx1), ptr<bf16>(b.dh), nullptr, ptr<bf16>(b.xhat), ptr<bf16>(b.y), nullptr,
                       b.gate(), b.mod_stride(), b.scale(), b.mod_stride(), ptr<float>(b.mean), ptr<float>(b.rstd),
                       ptr<float>(b.dx), ptr<bf16>(b.dy), b.dplane(0), b.dplane(1), b.dplane(2), nullptr, ptr<float>(ra_part), B, T,
                       D, ra_tiles, st);
                 }});
  out.push_back({"rms_adaln", "fwd", 8, 4, [&b, B, T, D, st, eps] {
                   k::rms_adaln_forward<float, bf16, bf16>(ptr<float>(b.x), ptr<float>(b.weight), b.scale(),
                                                           b.mod_stride(), ptr<bf16>(b.h), ptr<float>(b.rstd),
                                                           ptr<bf16>(b.xhat), B, T, D, eps, st);
                 }});
  const int rm_tiles = k::rms_adaln_backward_tiles(B, T, D, sms);
  const at::Tensor rm_part = scratch(k::rms_adaln_backward_partials(B, rm_tiles, D));
  out.push_back({"rms_adaln", "bwd", 8, 4, [&b, B, T, D, st, rm_tiles, rm_part] {
                   k::rms_adaln_backward<float, bf16, bf16>(
                       ptr<bf16>(b.dh), nullptr, ptr<bf16>(b.xhat), ptr<float>(b.weight), b.scale(), b.mod_stride(),
                       ptr<float>(b.rstd), ptr<float>(b.dx), b.dplane(2), ptr<float>(b.dweight),
                       ptr<float>(rm_part), B, T, D, rm_tiles, st);
                 }});
  out.push_back({"residual_rms_adaln", "fwd", 14, 8, [&b, B, T, D, st, eps] {
                   const float* w = ptr<float>(b.weight);
                   k::residual_rms_adaln_forward<float, bf16, bf16>(
                       ptr<float>(b.x), b.gate(), b.mod_stride(), ptr<bf16>(b.y), w, w + D, b.scale(), b.mod_stride(),
                       ptr<float>(b.x1), ptr<bf16>(b.h), ptr<float>(b.y_rstd), ptr<float>(b.rstd), ptr<bf16>(b.xhat),
                       B, T, D, eps, st);
                 }});
  const int rr_tiles = k::residual_rms_adaln_backward_tiles(B, T, D, sms);
  const at::Tensor rr_part = scratch(k::residual_rms_adaln_backward_partials(B, rr_tiles, D));
  out.push_back({"residual_rms_adaln", "bwd", 16, 8, [&b, B, T, D, st, rr_tiles, rr_part] {
                   const float* w = ptr<float>(b.weight);
                   float* dw = ptr<float>(b.dweight);
                   k::residual_rms_adaln_backward<float, bf16, bf16>(
                       ptr<float>(b.dx1), ptr<bf16>(b.dh), nullptr, ptr<bf16>(b.xhat), ptr<bf16>(b.y), w, w + D,
                       b.gate(), b.mod_stride(), b.scale(), b.mod_stride(), ptr<float>(b.y_rstd), ptr<float>(b.rstd),
                       ptr<float>(b.dx), ptr<bf16>(b.dy), b.dplane(0), b.dplane(2), dw, dw + int64_t(B) * D,
                       ptr<float>(rr_part), B, T, D, rr_tiles, st);
                 }});
  return out;
}

// GB/s of a device-to-device copy moving `bytes` in all (half read, half written).
double copy_gbs(double bytes) {
  const int64_t n = int64_t(bytes / 8);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor src = at::randn({n}, opts);
  at::Tensor dst = at::empty({n}, opts);
  const cudaStream_t st = at::cuda::getCurrentCUDAStream();
  const double ms = median_ms([&] {
    return cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), size_t(n) * 4, cudaMemcpyDeviceToDevice, st) ==
           cudaSuccess;
  });
  return 8.0 * n / ms * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  if (!perftrain::compat::cuda_available()) {
    std::printf("row_norm_bench: no CUDA device\n");
    return 77;
  }
  if (argc > 1 && (argc - 1) % 3 != 0) {
    std::printf("usage: %s [batch tokens cols]...\n", argv[0]);
    return 2;
  }
  std::vector<Shape> shapes;
  for (int i = 1; i + 2 < argc; i += 3) shapes.push_back({std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2])});
  if (shapes.empty())
    shapes = {{256, 256, 768}, {256, 288, 768}, {128, 288, 1152}, {256, 256, 1152}, {64, 1024, 768}, {32, 1152, 1152}};
  const c10::cuda::CUDAGuard guard(0);
  const int sms = perftrain::kernels::multiprocessor_count();
  std::printf("| batch x tokens | D | op | dir | ms | GB/s | copy GB/s (same bytes) | of copy |\n"
              "|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    Buffers b(s);
    const cudaStream_t st = at::cuda::getCurrentCUDAStream();
    const double rows = double(s.batch) * s.tokens;
    for (const Row& r : rows_for(s, b, st, sms)) {
      const double bytes = rows * (r.bytes_per_row_d * s.cols + r.bytes_per_row_const);
      const double ms = median_ms([&] {
        r.run();
        return true;
      });
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) {
        std::printf("row_norm_bench: %s %s: %s\n", r.op, r.dir, cudaGetErrorString(err));
        return 1;
      }
      const double gbs = bytes / ms * 1e-6, floor = copy_gbs(bytes);
      std::printf("| %d x %d | %d | %s | %s | %.3f | %.0f | %.0f | %.0f%% |\n", s.batch, s.tokens, s.cols, r.op, r.dir,
                  ms, gbs, floor, 100.0 * gbs / floor);
      std::fflush(stdout);
    }
  }
  return 0;
}
