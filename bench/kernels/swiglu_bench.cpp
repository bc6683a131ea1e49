// Micro-benchmark (GPU, libtorch): the single-stream MLP's gate, silu(x Wg^T)
// * (x Wu^T), three ways, at the single-stream shapes (rows = B*T, width D,
// F = 8/3 D rounded up to 64 as models::DiTConfig::mlp_hidden makes it):
//   (a) two products (ATen mm: x Wg^T, x Wu^T) then ATen's silu(g) * u, as
//       nn::SwiGLU's plain forward does;
//   (b) ONE product against [Wg; Wu] ([2F, D], ATen mm) then our
//       swiglu_forward kernel on the packed [M, 2F] result (ops::swiglu);
//   (c) the same product through cuBLASLt (ops::try_gemm_lt, DEFAULT
//       epilogue) then our kernel: the model's fused path.
// Beside them, each piece alone: the Lt product, our forward kernel and its
// backward kernel (with their GB/s: 6F and 10F bytes per bf16 row), and
// ATen's elementwise backward (silu_backward and a product, from a separate
// g and u) for comparison. "kernel share" = our forward kernel / (c): the most
// that moving SwiGLU into the product's epilogue could save of the forward
// (an epilogue still writes F per row, so the saving is less: the [M, 2F]
// write and read the epilogue avoids). Per call: the median of 9 windows of
// 10 back-to-back calls after 10 warm-up ones, CUDA events, bf16, fresh
// random inputs; the last column is max |(c) - (a)| (two bf16 roundings in
// (a), one in ours).
//   swiglu_bench [m d]...     (default: m 8192, 32768, 65536 x d 384, 768, 1024, 1152)
// Build: cmake --build build --target swiglu_bench (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=swiglu_bench [LAB_ARGS="65536 1152"].
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "kernels/gemm_lt.h"
#include "kernels/swiglu.h"
#include "ops/cublaslt_workspace.h"

#include "torch_timing.h"

namespace {

using bf16 = __nv_bfloat16;
using perftrain::kernels::GemmEpilogue;

int64_t mlp_hidden(int64_t d) { return (int64_t(d * 8.0 / 3.0 + 0.5) + 63) / 64 * 64; }

std::string ms_gbs(double ms, double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f (%.0f)", ms, bytes / ms * 1e-6);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  if (!perftrain::compat::cuda_available()) {
    std::printf("swiglu_bench: no CUDA device\n");
    return 77;
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int i = 1; i + 1 < argc; i += 2) shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1])});
  if (argc > 1 && (argc - 1) % 2 != 0) {
    std::printf("usage: %s [m d]...\n", argv[0]);
    return 2;
  }
  if (shapes.empty())
    for (int64_t m : {8192, 32768, 65536})
      for (int64_t d : {384, 768, 1024, 1152}) shapes.push_back({m, d});
  const c10::cuda::CUDAGuard guard(0);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  std::printf(
      "| m | d | F | (a) 2 mm + silu*mul ms | (b) 1 mm + ours ms | (c) Lt + ours ms | Lt product ms | "
      "ours fwd ms (GB/s) | kernel share of (c) | ours bwd ms (GB/s) | ATen bwd ms | max |(c)-(a)| |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [m, d] : shapes) {
    const int64_t f = mlp_hidden(d);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const at::Tensor x = at::randn({m, d}, opts);
    const double w_std = 1.0 / std::sqrt(double(d));
    const at::Tensor wg = at::randn({f, d}, opts) * w_std, wu = at::randn({f, d}, opts) * w_std;
    const at::Tensor wgu = at::cat({wg, wu}, 0);  // [2F, D]
    at::Tensor g = at::empty({m, f}, opts), u = at::empty({m, f}, opts), out_a = at::empty({m, f}, opts);
    at::Tensor gu = at::empty({m, 2 * f}, opts), out = at::empty({m, f}, opts);
    const auto* gu_p = static_cast<const bf16*>(gu.data_ptr());
    auto ours_fwd = [&] {
      perftrain::kernels::swiglu_forward<bf16>(gu_p, static_cast<bf16*>(out.data_ptr()), m, int(f), stream);
      return true;
    };
    const double a = median_ms([&] {
      at::mm_out(g, x, wg.t());
      at::mm_out(u, x, wu.t());
      out_a = at::silu(g) * u;
      return true;
    });
    const double b = median_ms([&] {
      at::mm_out(gu, x, wgu.t());
      return ours_fwd();
    });
    auto lt = [&] { return perftrain::ops::try_gemm_lt(x, false, wgu, true, gu, GemmEpilogue::kDefault); };
    const double c = median_ms([&] { return lt() && ours_fwd(); });
    const double lt_only = median_ms(lt);
    const double fwd = median_ms(ours_fwd);
    // (c)'s result against (a)'s (gu holds the Lt product from the last call).
    ours_fwd();
    const double diff = (out.to(at::kFloat) - out_a.to(at::kFloat)).abs().max().item<double>();
    const at::Tensor dout = at::randn({m, f}, opts);
    at::Tensor dgu = at::empty({m, 2 * f}, opts);
    const double bwd = median_ms([&] {
      perftrain::kernels::swiglu_backward<bf16>(static_cast<const bf16*>(dout.data_ptr()), gu_p,
                                                static_cast<bf16*>(dgu.data_ptr()), m, int(f), stream);
      return true;
    });
    const double aten_bwd = median_ms([&] {
      const at::Tensor dg = at::silu_backward(dout * u, g), du = dout * at::silu(g);
      return dg.defined() && du.defined();
    });
    std::printf("| %lld | %lld | %lld | %.3f | %.3f | %.3f | %.3f | %s | %.0f%% | %s | %.3f | %.3g |\n", (long long)m,
                (long long)d, (long long)f, a, b, c, lt_only, ms_gbs(fwd, 6.0 * m * f).c_str(), 100.0 * fwd / c,
                ms_gbs(bwd, 10.0 * m * f).c_str(), aten_bwd, diff);
    std::fflush(stdout);
  }
  return 0;
}
