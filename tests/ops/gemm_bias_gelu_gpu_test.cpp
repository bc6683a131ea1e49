// Our own Hopper fc1 product (kernels/gemm_bias_gelu_sm90) against float64
// on fresh random inputs, into NaN-poisoned outputs: pre = A W^T + b within
// bf16 rounding and act = gelu_tanh(pre) within bf16 and tanh.approx, fp32
// and bf16 biases; DiT's shapes (K = 384, 768, 1152) and the smallest tiles;
// every element written; the ops wrapper declines what the kernel does not
// take. Skips without an sm_90 GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "compat/compat.h"
#include "ops/gemm_bias_gelu.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

bool on_sm90() {
  if (!compat::cuda_available()) return false;
  const cudaDeviceProp* p = at::cuda::getCurrentDeviceProperties();
  return p->major == 9 && p->minor == 0;
}

at::Tensor nan_bf16(int64_t m, int64_t n) {
  return at::full({m, n}, std::numeric_limits<double>::quiet_NaN(),
                  at::TensorOptions().device(kCuda).dtype(at::kBFloat16));
}

// |got - ref| <= rtol |ref| + atol everywhere, and no NaN left.
void expect_close(const at::Tensor& got, const at::Tensor& ref, double rtol, double atol, const std::string& what) {
  const at::Tensor g = got.to(at::kDouble);
  EXPECT_FALSE(g.isnan().any().item<bool>()) << what << ": an element was not written (NaN)";
  const at::Tensor bad = (g - ref).abs() > ref.abs() * rtol + atol;
  EXPECT_EQ(bad.sum().item<int64_t>(), 0) << what << ": max |got - ref| " << (g - ref).abs().max().item<double>()
                                          << " (ref max " << ref.abs().max().item<double>() << ")";
}

struct Shape {
  int64_t m, n, k;
};

std::string name(const Shape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

TEST(GemmBiasGeluGpu, MatchesFloat64OnPoisonedOutputs) {
  if (!on_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  const c10::cuda::CUDAGuard guard(kCuda);
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(90);
  const auto opts = at::TensorOptions().device(kCuda);
  for (const Shape s : {Shape{128, 256, 64}, Shape{256, 512, 384}, Shape{384, 1536, 384}, Shape{1024, 3072, 768},
                        Shape{256, 4608, 1152}}) {
    for (const at::ScalarType bias_dtype : {at::kFloat, at::kBFloat16}) {
      const std::string where = name(s) + " bias " + c10::toString(bias_dtype) + ": ";
      // Unit-variance rows in, pre of order 1 out: GELU's curved part is exercised.
      const at::Tensor a = at::randn({s.m, s.k}, g, opts).to(at::kBFloat16);
      const at::Tensor w = (at::randn({s.n, s.k}, g, opts) / std::sqrt(double(s.k))).to(at::kBFloat16);
      const at::Tensor b = at::randn({s.n}, g, opts).mul(0.5).to(bias_dtype);
      const at::Tensor pre = nan_bf16(s.m, s.n), act = nan_bf16(s.m, s.n);
      ASSERT_TRUE(try_gemm_bias_gelu_sm90(a, w, b, pre, act)) << where << "the wrapper declined";
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;

      const at::Tensor ref = at::matmul(a.to(at::kDouble), w.to(at::kDouble).t()) + b.to(at::kDouble);
      // pre: fp32 accumulation, then one bf16 rounding (2^-8 relative).
      expect_close(pre, ref, 1.0 / 128, 1e-3, where + "pre");
      // act from the fp32 pre: bf16 rounding and tanh.approx (~2^-11 relative).
      expect_close(act, at::gelu(ref, "tanh"), 1.0 / 64, 2e-3, where + "act");
    }
  }
}

TEST(GemmBiasGeluGpu, WrapperDeclinesWhatTheKernelDoesNotTake) {
  if (!on_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  const c10::cuda::CUDAGuard guard(kCuda);
  const auto bf = at::TensorOptions().device(kCuda).dtype(at::kBFloat16);
  const at::Tensor a = at::randn({128, 64}, bf), w = at::randn({256, 64}, bf), b = at::randn({256}, bf);
  const at::Tensor pre = nan_bf16(128, 256), act = nan_bf16(128, 256);
  EXPECT_FALSE(try_gemm_bias_gelu_sm90(a.narrow(0, 0, 64), w, b, pre.narrow(0, 0, 64), act.narrow(0, 0, 64)))
      << "m % 128";
  EXPECT_FALSE(try_gemm_bias_gelu_sm90(a, w.narrow(0, 0, 128), b.narrow(0, 0, 128), pre.narrow(1, 0, 128),
                                       act.narrow(1, 0, 128)))
      << "n % 256";
  EXPECT_FALSE(try_gemm_bias_gelu_sm90(a.to(at::kHalf), w.to(at::kHalf), b, pre, act)) << "fp16 inputs";
  EXPECT_FALSE(try_gemm_bias_gelu_sm90(a, w, b, pre.t(), act)) << "a transposed output";
  EXPECT_TRUE(pre.isnan().all().item<bool>() && act.isnan().all().item<bool>())
      << "a declined call launched something";
}

}  // namespace
}  // namespace perftrain::ops
