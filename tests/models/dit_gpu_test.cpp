// On the GPU: the DiT forward and backward against the same model on the CPU
// in fp32, both in fp32 (TF32 off) and under bf16 autocast, plain and through
// the fused ops. Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "models/dit.h"
#include "compat/compat.h"
#include "support/tensor_checks.h"

namespace perftrain::models {
namespace {

using perftrain::testing::rel_err;

// Output and weight gradients of (out * gout).sum() on `device`.
std::pair<at::Tensor, std::vector<at::Tensor>> run(DiT& model, const at::Device& device, bool bf16,
                                                   const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                                                   const at::Tensor& gout, const DiTExecution& exec = {}) {
  at::Tensor out;
  {
    compat::AutocastGuard autocast(device.type(), at::kBFloat16, bf16);
    out = model.forward(x.to(device), t.to(device), y.to(device), exec);
  }
  (out.to(at::kFloat) * gout.to(device)).sum().backward();
  std::vector<at::Tensor> grads;
  for (auto& p : model.parameters()) {
    grads.push_back(p.grad().cpu());
    p.mutable_grad() = at::Tensor();
  }
  return {out.to(at::kFloat).cpu(), grads};
}

// Moves the CPU model's weights away from adaLN-Zero (so that every path
// carries signal) and copies them into the GPU model.
void perturb_and_copy(DiT& cpu, DiT& gpu, at::Generator& gen) {
  cpu.transform([&](const std::string& n, const at::Tensor& w) {
    return n == "pos_embed" ? w : w + 0.05 * at::randn(w.sizes(), gen, at::kFloat);
  });
  auto state = cpu.state();
  size_t i = 0;
  gpu.transform([&](const std::string&, const at::Tensor&) { return state[i++].second.to(at::kCUDA); });
}

TEST(DiTGpu, MatchesCpuInFp32AndBf16) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::globalContext().setAllowTF32CuBLAS(false);
  DiTConfig c;
  c.depth = 3, c.hidden = 96, c.heads = 3, c.patch = 2, c.image_size = 10, c.in_channels = 3, c.num_classes = 7;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  DiT cpu(c, 4), gpu(c, 4);
  perturb_and_copy(cpu, gpu, gen);

  const int64_t B = 5;
  auto x = at::randn({B, 3, 10, 10}, gen, at::kFloat);
  auto t = at::rand({B}, gen, at::kFloat) * 999;
  auto y = at::randint(0, 8, {B}, gen, at::kLong);
  auto gout = at::randn({B, 6, 10, 10}, gen, at::kFloat);
  auto [ref_out, ref_grads] = run(cpu, at::kCPU, false, x, t, y, gout);
  auto [out32, grads32] = run(gpu, at::Device(at::kCUDA, 0), false, x, t, y, gout);
  auto [out16, grads16] = run(gpu, at::Device(at::kCUDA, 0), true, x, t, y, gout);

  // fp32 on both: different kernels, same math: 1e-4 relative.
  EXPECT_LT(rel_err(out32, ref_out), 1e-4);
  // bf16 operands (8 bits of mantissa) through a few layers: a few 1e-3.
  EXPECT_LT(rel_err(out16, ref_out), 2e-2);
  const auto names = cpu.named_parameters();
  for (size_t k = 0; k < ref_grads.size(); ++k) {
    EXPECT_LT(rel_err(grads32[k], ref_grads[k]), 1e-3) << names[k].first;
    EXPECT_LT(rel_err(grads16[k], ref_grads[k]), 5e-2) << names[k].first;
  }
  at::globalContext().setAllowTF32CuBLAS(true);
}

// The fused path (patch embedding as a product, blocks chained through the
// fused ops, the last residual fused with the final layer's norm) and its
// recompute variant (block by block, final layer through adaln_layernorm)
// against the plain model on the CPU in fp32: same output and weight
// gradients within bf16 tolerance.
TEST(DiTGpu, FusedPathMatchesCpu) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  DiTConfig c;
  c.depth = 3, c.hidden = 96, c.heads = 3, c.patch = 2, c.image_size = 16, c.in_channels = 4, c.num_classes = 7;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  DiT cpu(c, 4), gpu(c, 4);
  perturb_and_copy(cpu, gpu, gen);

  const int64_t B = 6;
  auto x = at::randn({B, 4, 16, 16}, gen, at::kFloat);
  auto t = at::rand({B}, gen, at::kFloat) * 999;
  auto y = at::randint(0, 8, {B}, gen, at::kLong);
  auto gout = at::randn({B, 8, 16, 16}, gen, at::kFloat);
  auto [ref_out, ref_grads] = run(cpu, at::kCPU, false, x, t, y, gout);
  const auto names = cpu.named_parameters();
  for (const bool recompute : {false, true}) {
    for (const bool gelu_recompute : {false, true}) {
      // With recompute, backward runs each block again on autograd's thread:
      // the plan must reach it as it was at forward time.
      DiTExecution exec;
      exec.fused_kernels = true, exec.recompute = recompute, exec.gelu_recompute = gelu_recompute;
      const std::string what =
          "recompute " + std::to_string(recompute) + ", gelu_recompute " + std::to_string(gelu_recompute);
      auto [out16, grads16] = run(gpu, at::Device(at::kCUDA, 0), true, x, t, y, gout, exec);
      EXPECT_LT(rel_err(out16, ref_out), 2e-2) << what;
      for (size_t k = 0; k < ref_grads.size(); ++k)
        EXPECT_LT(rel_err(grads16[k], ref_grads[k]), 5e-2) << names[k].first << ", " << what;
    }
  }
}

}  // namespace
}  // namespace perftrain::models
