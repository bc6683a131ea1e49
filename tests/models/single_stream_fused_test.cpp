// The single-stream DiT's fused path (DiTExecution::fused_kernels: chained
// blocks through rms_adaln, residual_rms_adaln, qk_norm_rope, qkv_attention
// with the key mask, stacked_linear and swiglu; block by block under
// recompute) on the CPU, where each op runs its fp32 reference: the same
// output and every gradient (input, condition features, all parameters) as
// the plain path on random weights, with class tokens and masked features,
// odd token counts, recompute on and off, gelu_recompute on.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "models/single_stream.h"

namespace perftrain::models {
namespace {

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  EXPECT_FALSE(a64.isnan().any().item<bool>()) << "NaN is always a failure";
  return (a64 - b64).norm().item<double>() / std::max(b64.norm().item<double>(), 1e-30);
}

DiTConfig small(int64_t patch, int64_t image, int64_t cond_tokens, int64_t cond_dim) {
  DiTConfig c = model_config("SS-S/2");
  c.depth = 3, c.hidden = 64, c.heads = 4, c.patch = patch, c.image_size = image;
  c.in_channels = 3, c.num_classes = 5, c.cond_tokens = cond_tokens, c.cond_dim = cond_dim;
  return c;
}

struct Result {
  at::Tensor out, dx, dcond;
  std::vector<at::Tensor> grads;
};

Result run(SingleStreamDiT& m, const at::Tensor& x, const at::Tensor& t, const Condition& cond,
           const at::Tensor& gout, const DiTExecution& exec) {
  Result r;
  const at::Tensor xl = x.clone().set_requires_grad(true);
  Condition c = cond;
  if (cond.features.defined()) c.features = cond.features.clone().set_requires_grad(true);
  r.out = m.forward(xl, t, c, exec);
  (r.out * gout).sum().backward();
  r.dx = xl.grad();
  if (c.features.defined()) r.dcond = c.features.grad();
  for (auto& p : m.parameters()) {
    r.grads.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }
  return r;
}

void expect_fused_matches_plain(const DiTConfig& cfg, uint64_t seed, std::vector<int64_t> lengths = {}) {
  SingleStreamDiT model(cfg, seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  // Away from adaLN-Zero, so that every path carries signal.
  model.transform([&](const std::string&, const at::Tensor& w) { return w + 0.1 * at::randn(w.sizes(), gen, at::kFloat); });
  const int64_t B = 3;
  const at::Tensor x = at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const at::Tensor t = at::rand({B}, gen, at::kFloat) * 999;
  const at::Tensor gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  Condition cond;
  if (cfg.cond_dim == 0) {
    cond.labels = at::randint(0, cfg.num_classes + 1, {B}, gen, at::kLong);
  } else {
    cond.features = at::randn({B, cfg.cond_tokens, cfg.cond_dim}, gen, at::kFloat);
    if (!lengths.empty()) cond.lengths = at::tensor(lengths, at::kLong);
  }
  ASSERT_TRUE(model.has_fused_path());
  const Result plain = run(model, x, t, cond, gout, {});
  const auto names = model.named_parameters();
  for (const int variant : {0, 1, 2}) {  // recompute off, on; gelu_recompute (SwiGLU made again in backward)
    const bool recompute = variant == 1;
    DiTExecution exec;
    exec.fused_kernels = true, exec.recompute = recompute, exec.gelu_recompute = variant == 2;
    const std::string what = variant == 2 ? "gelu_recompute on" : std::string("recompute ") + (recompute ? "on" : "off");
    const Result fused = run(model, x, t, cond, gout, exec);
    ASSERT_EQ(fused.out.sizes(), plain.out.sizes()) << what;
    // The same math in fp32, summed in other orders.
    const double tol = 1e-5;
    EXPECT_LT(rel_err(fused.out, plain.out), tol) << what;
    std::cout << what << ": out " << rel_err(fused.out, plain.out) << ", dx " << rel_err(fused.dx, plain.dx) << "\n";
    EXPECT_LT(rel_err(fused.dx, plain.dx), tol) << what << " dx";
    if (plain.dcond.defined()) EXPECT_LT(rel_err(fused.dcond, plain.dcond), tol) << what << " dcond";
    for (size_t k = 0; k < plain.grads.size(); ++k) {
      EXPECT_GT(plain.grads[k].abs().max().item<double>(), 0) << names[k].first;
      EXPECT_LT(rel_err(fused.grads[k], plain.grads[k]), tol) << names[k].first << ", " << what;
    }
  }
}

TEST(SingleStreamFused, ClassTokensOddTokensMatchThePlainPath) {
  expect_fused_matches_plain(small(1, 8, 3, 0), 3);  // 64 image + 3 class tokens
}

TEST(SingleStreamFused, MaskedFeaturesMatchThePlainPath) {
  expect_fused_matches_plain(small(1, 3, 5, 7), 5, {2, 5, 0});  // 9 image + 5 condition tokens, partly padded
}

TEST(SingleStreamFused, UnmaskedFeaturesPatch2MatchThePlainPath) {
  expect_fused_matches_plain(small(2, 6, 3, 10), 9);  // 9 image + 3 condition tokens
}

}  // namespace
}  // namespace perftrain::models
