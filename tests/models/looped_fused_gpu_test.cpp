// On the GPU: the looped DiT's fused schedule under bf16 autocast against the
// same model's plain forward on the CPU in fp32 (the tolerances of the DiT's
// fused GPU test: bf16 operands through a few layers), chained and under
// recompute: LoRA on every target with a group of two and reinject add;
// a routed loop; single-stream blocks with LoRA.
// Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compat/compat.h"
#include "models/looped.h"
#include "support/tensor_checks.h"

namespace perftrain::models {
namespace {

using perftrain::testing::rel_err;

DiTConfig small(const std::string& loop_block, const std::function<void(DiTConfig&)>& change) {
  DiTConfig c = model_config("Looped-S/2");
  c.hidden = 96, c.heads = 3, c.patch = 2, c.image_size = 16, c.in_channels = 4, c.num_classes = 7;
  c.loop_block = loop_block;
  c.prelude = 1, c.coda = 1, c.shared_group = 1, c.loops = 2;  // a few applications, as DiTGpu's depth 3
  if (loop_block == "single_stream") c.heads = 4, c.hidden = 128, c.cond_tokens = 2;
  change(c);
  c.depth = c.looped_depth();
  return c;
}

struct Result {
  at::Tensor out, aux;
  std::vector<at::Tensor> grads;  // on the CPU
};

Result run(LoopedDiT& m, const at::Device& device, bool bf16, const at::Tensor& x, const at::Tensor& t,
           const at::Tensor& y, const at::Tensor& gout, const DiTExecution& exec) {
  Result r;
  ForwardOutput o;
  {
    compat::AutocastGuard autocast(device.type(), at::kBFloat16, bf16);
    Condition cond;
    cond.labels = y.to(device);
    o = m.forward_train(x.to(device), t.to(device), cond, exec);
  }
  at::Tensor loss = (o.out.to(at::kFloat) * gout.to(device)).sum();
  if (o.aux_loss.defined()) loss = loss + o.aux_loss;
  loss.backward();
  r.out = o.out.to(at::kFloat).cpu();
  if (o.aux_loss.defined()) r.aux = o.aux_loss.cpu();
  for (auto& p : m.parameters()) {
    r.grads.push_back(p.grad().cpu());
    p.mutable_grad() = at::Tensor();
  }
  return r;
}

// cpu's weights moved away from adaLN-Zero and zero adapters (routers
// scaled up: their scores well apart, so that bf16 does not change the kept
// tokens), copied into gpu.
void perturb_and_copy(LoopedDiT& cpu, LoopedDiT& gpu, at::Generator& gen) {
  cpu.transform([&](const std::string& n, const at::Tensor& w) {
    if (n == "pos_embed") return w;
    if (n.rfind("routers.", 0) == 0) return at::randn(w.sizes(), gen, at::kFloat);
    return w + 0.05 * at::randn(w.sizes(), gen, at::kFloat);
  });
  auto state = cpu.state();
  size_t i = 0;
  gpu.transform([&](const std::string&, const at::Tensor&) { return state[i++].second.to(at::kCUDA); });
}

void expect_fused_matches_cpu(const DiTConfig& cfg, double x_scale) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  LoopedDiT cpu(cfg, 4), gpu(cfg, 4);
  perturb_and_copy(cpu, gpu, gen);
  const int64_t B = 6;
  const at::Tensor x = x_scale * at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const at::Tensor t = at::rand({B}, gen, at::kFloat) * 999;
  const at::Tensor y = at::randint(0, cfg.num_classes + 1, {B}, gen, at::kLong);
  const at::Tensor gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const Result ref = run(cpu, at::kCPU, false, x, t, y, gout, {});
  const auto names = cpu.named_parameters();
  for (const bool recompute : {false, true}) {
    DiTExecution exec;
    exec.fused_kernels = true, exec.recompute = recompute;
    const std::string what = cfg.name + (recompute ? " recompute" : " chained");
    const Result got = run(gpu, at::Device(at::kCUDA, 0), true, x, t, y, gout, exec);
    EXPECT_LT(rel_err(got.out, ref.out), 2e-2) << what;
    ASSERT_EQ(got.aux.defined(), ref.aux.defined()) << what;
    if (ref.aux.defined()) EXPECT_LT(rel_err(got.aux, ref.aux), 2e-2) << what << " aux";
    for (size_t k = 0; k < ref.grads.size(); ++k)
      EXPECT_LT(rel_err(got.grads[k], ref.grads[k]), 5e-2) << names[k].first << ", " << what;
  }
}

TEST(LoopedFusedGpu, LoraGroupOfTwoReinjectAddMatchesCpu) {
  expect_fused_matches_cpu(small("dit", [](DiTConfig& c) {
    c.shared_group = 2, c.lora_rank = 4, c.lora_targets = "attn,mlp,adaln", c.lora_bias = true, c.reinject = "add";
  }), 1.0);
}

// Only loop 0 routed (capacity 0.5 to 1 over 2 loops) and no prelude: its
// router reads the embedded tokens, and with small inputs their positions
// decide the scores, the same kept tokens in bf16 as in fp32 (reinject
// concat, a bf16 product before the router, is checked on the CPU).
TEST(LoopedFusedGpu, RoutedLoopWithLoraMatchesCpu) {
  expect_fused_matches_cpu(small("dit", [](DiTConfig& c) {
    c.prelude = 0, c.loops = 2, c.lora_rank = 4, c.route_capacity = 0.5, c.route_capacity_end = 1.0;
  }), 1e-2);
}

TEST(LoopedFusedGpu, SingleStreamLoraReinjectAddMatchesCpu) {
  expect_fused_matches_cpu(small("single_stream", [](DiTConfig& c) {
    c.lora_rank = 4, c.lora_targets = "attn,mlp,adaln", c.reinject = "add";
  }), 1.0);
}

}  // namespace
}  // namespace perftrain::models
