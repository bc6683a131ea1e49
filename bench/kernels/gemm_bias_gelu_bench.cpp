// Micro-benchmark (GPU, libtorch): fc1 with bias and GELU through our own
// Hopper product (ops::try_gemm_bias_gelu_sm90) against cuBLASLt's
// GELU_AUX_BIAS product (the fallback where ours cannot run) and its plain
// BIAS product (the same FLOPs, one output, no GELU), on DiT's fc1 shapes at
// batch 256, side by side in one process: per call, the median of 9 windows
// of 10 back-to-back calls after 10 warm-up ones (cuBLASLt's first call also
// times its candidate algorithms), CUDA events, fresh random inputs. Also the
// largest difference between our pre/act and cuBLASLt's (theirs take a bf16
// bias, ours the fp32 one).
// Then the single-stream FFN's gate-up product with SwiGLU in the same
// kernel's epilogue (ops::try_gemm_swiglu_sm90: gate_up and h) against what
// runs without it: the product (ops::linear's, cuBLASLt) then ops::swiglu's
// kernel, and the product alone; and the largest differences (gate_up; h,
// which ours computes from the fp32 products).
// Then fc2's backward product through GELU with fc1's bias gradient, the
// three forms ops::gelu_mlp times on a shape's first backward: our kernel
// (ops::try_gemm_dgelu_sm90: dpre and db1 from its column partials),
// cuBLASLt's DGELU epilogue then the column-sum pass db1 takes there, and
// the split form (the plain product, then the fused GELU backward with
// db1); the plain product alone beside them; and the largest differences
// from the split form (dpre; db1 relative to its largest).
//   bench_gemm_bias_gelu [m n k]...     (default: DiT-S/2, B/2, XL/2 at b256, and
//                                        SS-B/2 b256, SS-XL/2 b128 for SwiGLU, and for
//                                        DGELU DiT-S/2, B/2, XL/2 b256, L/2 b128, XL/2 b32 512 px)
//   bench_gemm_bias_gelu swiglu [m f k]...   (SwiGLU only)
//   bench_gemm_bias_gelu dgelu [m n k]...    (DGELU only; n = 4D, k = D)
// Build: cmake --build build --target bench_gemm_bias_gelu (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=bench_gemm_bias_gelu [LAB_ARGS="65536 3072 768"].
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gemm_lt.h"
#include "ops/column_sums.h"
#include "ops/cublaslt_workspace.h"
#include "ops/gelu_backward.h"
#include "ops/gemm_bias_gelu.h"
#include "ops/linear.h"
#include "ops/swiglu.h"

#include "torch_timing.h"

namespace {

using perftrain::kernels::GemmEpilogue;

// "ms (TFLOP/s)" for a table cell.
std::string ms_and_tflops(double ms, double flop) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f (%.0f)", ms, flop / ms * 1e-9);
  return buf;
}

// The SwiGLU table: for each [m, f, k], ours against product + swiglu.
void swiglu_table(const std::vector<std::vector<int64_t>>& shapes) {
  const auto opts = at::TensorOptions().device(at::kCUDA);
  std::printf("\n| m | F | k | ours gate_up + h ms (TFLOP/s) | product + swiglu ms (TFLOP/s) | product alone ms | "
              "max |gate_up diff| | max |h diff| |\n|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t m = s[0], f = s[1], k = s[2];
    const at::Tensor a = at::randn({m, k}, opts).to(at::kBFloat16);
    const at::Tensor w = (at::randn({2 * f, k}, opts) / std::sqrt(double(k))).to(at::kBFloat16);
    const auto bf = opts.dtype(at::kBFloat16);
    const at::Tensor gate_up = at::empty({m, 2 * f}, bf), h = at::empty({m, f}, bf);
    const at::Tensor gate_up_lt = at::empty({m, 2 * f}, bf);
    at::Tensor h_lt;
    const double ours = median_ms([&] { return perftrain::ops::try_gemm_swiglu_sm90(a, w, gate_up, h); });
    const double product_swiglu = median_ms([&] {
      perftrain::ops::detail::linear_forward_product(a, w, at::Tensor(), gate_up_lt);
      h_lt = perftrain::ops::swiglu(gate_up_lt);
      return true;
    });
    const double product = median_ms([&] {
      perftrain::ops::detail::linear_forward_product(a, w, at::Tensor(), gate_up_lt);
      return true;
    });
    const auto cell = [flop = 2.0 * m * 2 * f * k](double ms) { return ms_and_tflops(ms, flop); };
    const double dgu = (gate_up.to(at::kFloat) - gate_up_lt.to(at::kFloat)).abs().max().item<double>();
    const double dh = (h.to(at::kFloat) - h_lt.to(at::kFloat)).abs().max().item<double>();
    std::printf("| %lld | %lld | %lld | %s | %s | %s | %.3g | %.3g |\n", (long long)m, (long long)f, (long long)k,
                cell(ours).c_str(), cell(product_swiglu).c_str(), cell(product).c_str(), dgu, dh);
  }
}

// The DGELU table: for each [m, n, k] (n = 4D, k = D), the three forms.
void dgelu_table(const std::vector<std::vector<int64_t>>& shapes) {
  using namespace perftrain::ops;
  const auto opts = at::TensorOptions().device(at::kCUDA);
  std::printf("\n| m | n | k | ours dpre + db1 ms (TFLOP/s) | cuBLASLt DGELU + db1 sums ms (TFLOP/s) | "
              "split: product + GELU pass with db1 ms (TFLOP/s) | product alone ms | max |dpre diff| | "
              "max |db1 diff| / max |db1| |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const at::Tensor dy = (at::randn({m, k}, opts) * 0.1).to(at::kBFloat16);
    const at::Tensor w2 = (at::randn({k, n}, opts) / std::sqrt(double(n))).to(at::kBFloat16);
    const at::Tensor pre = (at::randn({m, n}, opts) * 1.5).to(at::kBFloat16);
    const auto bf = opts.dtype(at::kBFloat16), f32 = opts.dtype(at::kFloat);
    const at::Tensor dpre = at::empty({m, n}, bf), dpre_lt = at::empty({m, n}, bf);
    at::Tensor dpre_split = at::empty({m, n}, bf);  // the GELU pass takes it by reference
    const at::Tensor db1 = at::empty({n}, f32), db1_lt = at::empty({n}, f32), db1_split = at::empty({n}, f32);
    const double ours = median_ms([&] { return try_gemm_dgelu_sm90(dy, w2, pre, dpre, db1); });
    const double lt = median_ms([&] {
      if (!try_gemm_lt(dy, false, w2, false, dpre_lt, GemmEpilogue::kDGelu, at::Tensor(), pre)) return false;
      column_sums_into({dpre_lt}, {db1_lt});
      return true;
    });
    const double split = median_ms([&] {
      detail::linear_input_grad(dy, w2, dpre_split);
      gelu_tanh_backward_(dpre_split, pre, db1_split);
      return true;
    });
    const at::Tensor plain = at::empty({m, n}, bf);
    const double product = median_ms([&] {
      detail::linear_input_grad(dy, w2, plain);
      return true;
    });
    const auto cell = [flop = 2.0 * m * n * k](double ms) { return ms_and_tflops(ms, flop); };
    const double dd = (dpre.to(at::kFloat) - dpre_split.to(at::kFloat)).abs().max().item<double>();
    const double db = ((db1 - db1_split).abs().max() / db1_split.abs().max()).item<double>();
    std::printf("| %lld | %lld | %lld | %s | %s | %s | %s | %.3g | %.3g |\n", (long long)m, (long long)n, (long long)k,
                cell(ours).c_str(), cell(lt).c_str(), cell(split).c_str(), cell(product).c_str(), dd, db);
  }
}

// [m n k] triples from argv[first...].
std::vector<std::vector<int64_t>> shape_args(int argc, char** argv, int first) {
  std::vector<std::vector<int64_t>> shapes;
  for (int i = first; i + 2 < argc; i += 3)
    shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2])});
  return shapes;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::vector<int64_t>> shapes = {{65536, 1536, 384}, {65536, 3072, 768}, {65536, 4608, 1152}};
  std::vector<std::vector<int64_t>> swiglu_shapes = {{256 * 288, 2048, 768}, {128 * 288, 3072, 1152}};
  std::vector<std::vector<int64_t>> dgelu_shapes = {
      {65536, 1536, 384}, {65536, 3072, 768}, {65536, 4608, 1152}, {32768, 4096, 1024}, {32768, 4608, 1152}};
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "swiglu" || mode == "dgelu") {
    shapes.clear();
    (mode == "swiglu" ? dgelu_shapes : swiglu_shapes).clear();
    if (argc > 2) (mode == "swiglu" ? swiglu_shapes : dgelu_shapes) = shape_args(argc, argv, 2);
  } else if (argc > 1) {
    shapes = shape_args(argc, argv, 1);
    swiglu_shapes.clear();
    dgelu_shapes.clear();
  }
  const c10::cuda::CUDAGuard guard(0);
  const auto opts = at::TensorOptions().device(at::kCUDA);
  if (!shapes.empty())
    std::printf("| m | n | k | ours ms (TFLOP/s) | cuBLASLt GELU_AUX_BIAS ms (TFLOP/s) | cuBLASLt BIAS ms (TFLOP/s) | "
                "max |pre diff| | max |act diff| |\n|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const at::Tensor a = at::randn({m, k}, opts).to(at::kBFloat16);
    const at::Tensor w = (at::randn({n, k}, opts) / std::sqrt(double(k))).to(at::kBFloat16);
    const at::Tensor b = at::randn({n}, opts) * 0.5, b16 = b.to(at::kBFloat16);
    const auto bf = opts.dtype(at::kBFloat16);
    const at::Tensor pre = at::empty({m, n}, bf), act = at::empty({m, n}, bf);
    const at::Tensor pre_lt = at::empty({m, n}, bf), act_lt = at::empty({m, n}, bf);
    const double ours = median_ms([&] { return perftrain::ops::try_gemm_bias_gelu_sm90(a, w, b, pre, act); });
    const double lt_gelu = median_ms([&] {
      return perftrain::ops::try_gemm_lt(a, false, w, true, act_lt, GemmEpilogue::kGeluAuxBias, b16, pre_lt);
    });
    const at::Tensor plain = at::empty({m, n}, bf);
    const double lt_bias =
        median_ms([&] { return perftrain::ops::try_gemm_lt(a, false, w, true, plain, GemmEpilogue::kBias, b16); });
    const auto cell = [flop = 2.0 * m * n * k](double ms) { return ms_and_tflops(ms, flop); };
    const double dpre = (pre.to(at::kFloat) - pre_lt.to(at::kFloat)).abs().max().item<double>();
    const double dact = (act.to(at::kFloat) - act_lt.to(at::kFloat)).abs().max().item<double>();
    std::printf("| %lld | %lld | %lld | %s | %s | %s | %.3g | %.3g |\n", (long long)m, (long long)n, (long long)k,
                cell(ours).c_str(), cell(lt_gelu).c_str(), cell(lt_bias).c_str(), dpre, dact);
  }
  if (!swiglu_shapes.empty()) swiglu_table(swiglu_shapes);
  if (!dgelu_shapes.empty()) dgelu_table(dgelu_shapes);
  return 0;
}
