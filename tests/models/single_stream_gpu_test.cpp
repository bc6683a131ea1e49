// On the GPU: the single-stream DiT's fused path (chained blocks through
// rms_adaln, residual_rms_adaln, qk_norm_rope, cuDNN attention with the key
// mask as its bias, stacked_linear, swiglu; block by block under recompute;
// swiglu_linear under gelu_recompute) and its plain path, in fp32 and under
// bf16 autocast, against the plain model on the CPU in fp32 on the same
// random weights: output and every gradient, with class tokens and masked
// features, odd token counts and the benchmark's block shape.
// Prints each case's largest error. Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/single_stream.h"
#include "ops/attention_paths.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::models {
namespace {

using perftrain::testing::rel_err;

struct Result {
  at::Tensor out, dx, dcond;
  std::vector<at::Tensor> grads;
};

// Output and gradients of (out * gout).sum() on `device`, all on the CPU in fp32.
Result run(SingleStreamDiT& m, const at::Device& device, bool bf16, const at::Tensor& x, const at::Tensor& t,
           const Condition& cond, const at::Tensor& gout, const DiTExecution& exec = {}) {
  Result r;
  // Fresh leaves (x.to(kCPU) would be x itself).
  const at::Tensor xl = x.to(device).detach().clone().set_requires_grad(true);
  Condition c;
  if (cond.labels.defined()) c.labels = cond.labels.to(device);
  if (cond.features.defined()) c.features = cond.features.to(device).detach().clone().set_requires_grad(true);
  if (cond.lengths.defined()) c.lengths = cond.lengths.to(device);
  at::Tensor out;
  {
    compat::AutocastGuard autocast(device.type(), at::kBFloat16, bf16);
    out = m.forward(xl, t.to(device), c, exec);
  }
  (out.to(at::kFloat) * gout.to(device)).sum().backward();
  r.out = out.to(at::kFloat).cpu();
  r.dx = xl.grad().cpu();
  if (c.features.defined()) r.dcond = c.features.grad().cpu();
  for (auto& p : m.parameters()) {
    r.grads.push_back(p.grad().cpu().to(at::kFloat));
    p.mutable_grad() = at::Tensor();
  }
  return r;
}

struct Case {
  std::string name;
  DiTConfig cfg;
  std::vector<int64_t> lengths;  // per-sample valid condition tokens, or empty
};

DiTConfig small(int64_t hidden, int64_t heads, int64_t patch, int64_t image, int64_t cond_tokens, int64_t cond_dim) {
  DiTConfig c = model_config("SS-S/2");
  c.depth = 3, c.hidden = hidden, c.heads = heads, c.patch = patch, c.image_size = image;
  c.in_channels = 4, c.num_classes = 7, c.cond_tokens = cond_tokens, c.cond_dim = cond_dim;
  return c;
}

void expect_matches_cpu(const Case& k) {
  const DiTConfig& cfg = k.cfg;
  const at::Device cuda(at::kCUDA, 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  SingleStreamDiT cpu(cfg, 4), gpu(cfg, 4, cuda);
  // Away from adaLN-Zero (so that every path carries signal), copied to the GPU model.
  cpu.transform([&](const std::string&, const at::Tensor& w) { return w + 0.05 * at::randn(w.sizes(), gen, at::kFloat); });
  const auto state = cpu.state();
  size_t i = 0;
  gpu.transform([&](const std::string&, const at::Tensor&) { return state[i++].second.to(cuda); });
  ASSERT_EQ(i, state.size());

  const int64_t B = int64_t(std::max<size_t>(k.lengths.size(), 4));
  const at::Tensor x = at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const at::Tensor t = at::rand({B}, gen, at::kFloat) * 999;
  const at::Tensor gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  Condition cond;
  if (cfg.cond_dim == 0) {
    cond.labels = at::randint(0, cfg.num_classes + 1, {B}, gen, at::kLong);  // the null class too
  } else {
    cond.features = at::randn({B, cfg.cond_tokens, cfg.cond_dim}, gen, at::kFloat);
    if (!k.lengths.empty()) cond.lengths = at::tensor(k.lengths, at::kLong);
  }
  const Result ref = run(cpu, at::kCPU, false, x, t, cond, gout);
  const auto names = cpu.named_parameters();
  ops::reset_attention_paths();  // this case's paths only

  struct Variant {
    bool fused, bf16, recompute, swiglu_again = false;  // swiglu_again: speed.gelu_recompute
  };
  for (const Variant v : {Variant{false, false, false}, Variant{true, false, false}, Variant{true, false, true},
                          Variant{false, true, false}, Variant{true, true, false}, Variant{true, true, true},
                          Variant{true, true, false, true}, Variant{true, false, true, true}}) {
    DiTExecution exec;
    exec.fused_kernels = v.fused, exec.recompute = v.recompute, exec.gelu_recompute = v.swiglu_again;
    const std::string what = k.name + (v.fused ? ", fused" : ", plain") + (v.bf16 ? ", bf16" : ", fp32") +
                             (v.recompute ? ", recompute" : "") + (v.swiglu_again ? ", SwiGLU again" : "");
    at::globalContext().setAllowTF32CuBLAS(false);  // the plain fp32 path exact; ops::linear's fp32 is TF32 anyway
    const Result got = run(gpu, cuda, v.bf16, x, t, cond, gout, exec);
    at::globalContext().setAllowTF32CuBLAS(true);
    // fp32: the plain path 1e-4 (as DiT); the fused products are TF32 (10
    // mantissa bits): a few 1e-4 through three blocks. bf16: 8 bits.
    const double tol_out = v.bf16 ? 2e-2 : (v.fused ? 5e-3 : 1e-4);
    const double tol_grad = v.bf16 ? 5e-2 : (v.fused ? 1e-2 : 1e-3);
    double worst = 0;
    std::string worst_name = "out";
    const auto check = [&](const at::Tensor& a, const at::Tensor& b, const std::string& n, double tol) {
      const double e = rel_err(a, b);
      EXPECT_LT(e, tol) << what << ": " << n;
      if (e > worst) worst = e, worst_name = n;
    };
    check(got.out, ref.out, "out", tol_out);
    check(got.dx, ref.dx, "grad x", tol_grad);
    if (ref.dcond.defined()) check(got.dcond, ref.dcond, "grad cond", tol_grad);
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    for (size_t j = 0; j < ref.grads.size(); ++j) check(got.grads[j], ref.grads[j], names[j].first, tol_grad);
    std::cout << what << ": out " << rel_err(got.out, ref.out) << ", worst " << worst_name << " " << worst << "\n";
  }
  EXPECT_FALSE(ops::cudnn_attention_refused()) << "cuDNN attention fell back to SDPA";
  // bf16 attention ran cuDNN on the block's layout (q, k from QK-norm + RoPE's
  // q | k, v read in place from the projection's output), never ATen's
  // SDPA: that would mean the three inputs' strides were not taken.
  for (const std::string& line : ops::attention_paths_used())
    EXPECT_FALSE(line.find("scaled_dot_product") != std::string::npos && line.find("bf16") != std::string::npos)
        << line;
}

TEST(SingleStreamGpuModel, ClassTokensOddTokensMatchCpu) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_matches_cpu({"class tokens, 64 image + 3 class tokens, head dim 64", small(128, 2, 1, 8, 3, 0), {}});
}

TEST(SingleStreamGpuModel, MaskedFeaturesMatchCpu) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_matches_cpu(
      {"masked features, 16 image + 5 condition tokens, head dim 64", small(128, 2, 2, 8, 5, 24), {2, 5, 0, 3}});
}

TEST(SingleStreamGpuModel, MaskedFeaturesHeadDim96MatchCpu) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_matches_cpu(
      {"masked features, 25 image + 6 condition tokens, head dim 96", small(192, 2, 2, 10, 6, 16), {6, 1, 4, 0}});
}

// The benchmark's block shape (SS-B/2 with 32 condition tokens: 256 image +
// 32 condition = 288 tokens, 768 wide, 12 heads of 64), three blocks: the key
// bias made once per forward for all blocks, and cuDNN reading q and k from
// QK-norm + RoPE's q | k and v from the projection's output in place, its dq,
// dk, dv used where it wrote them, at the width the timings are taken at.
TEST(SingleStreamGpuModel, MaskedFeaturesBenchShapeMatchesCpu) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_matches_cpu({"masked features, 256 image + 32 condition tokens, 768 wide, head dim 64",
                      small(768, 12, 2, 32, 32, 48), {32, 7, 0, 19}});
}

}  // namespace
}  // namespace perftrain::models
