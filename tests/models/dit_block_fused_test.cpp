// The DiT block's fused schedule pieces (models/fused/dit_block.h) run twice
// over ONE block, as a looped family would run a shared block: the block
// alone twice (fused::dit_block, the recompute path's piece) and the two
// steps chained (fused::dit_blocks_chained over the same block listed twice,
// both modulations from one stacked product), against the plain block
// applied twice; output, the input and condition gradients, and every
// parameter's gradient (summed over both uses). And the pieces run with
// weights other than the block's own (models/block_weights.h, as a looped
// model's per-loop weights): the result and the gradients are those of the
// block the weights come from. On the CPU, where each fused op runs its fp32
// reference.
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "models/fused/dit_block.h"
#include "ops/gated_residual.h"
#include "support/tensor_checks.h"

namespace perftrain::models {
namespace {

using perftrain::testing::rel_l2;
using perftrain::testing::seeded_cpu_generator;

struct Result {
  at::Tensor out, dx, dc;
  std::vector<at::Tensor> grads;  // the block's parameters, in order
};

// f(x, c) with fresh leaves, backward of (out * gout).sum(); the block's
// gradients taken and cleared.
Result run(DiTBlock& block, const at::Tensor& x, const at::Tensor& c, const at::Tensor& gout,
           const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& f) {
  const at::Tensor xl = x.clone().set_requires_grad(true), cl = c.clone().set_requires_grad(true);
  Result r;
  r.out = f(xl, cl);
  (r.out * gout).sum().backward();
  r.dx = xl.grad(), r.dc = cl.grad();
  for (auto& p : block.parameters()) {
    r.grads.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }
  return r;
}

TEST(DiTBlockFused, OneBlockTwiceMatchesThePlainBlockTwice) {
  DiTConfig cfg = dit_config("DiT-S/2");
  cfg.hidden = 64, cfg.heads = 4;
  auto gen = seeded_cpu_generator(13);
  DiTBlock block(cfg, gen);
  // Away from adaLN-Zero (an identity block), so that every path carries signal.
  block.transform([&](const std::string&, const at::Tensor& w) { return w + 0.1 * at::randn(w.sizes(), gen); });
  const int64_t B = 2, T = 13, D = cfg.hidden;
  const at::Tensor x = at::randn({B, T, D}, gen), c = at::randn({B, D}, gen), gout = at::randn({B, T, D}, gen);

  const Result plain = run(block, x, c, gout, [&](const at::Tensor& xl, const at::Tensor& cl) {
    return block.forward(block.forward(xl, cl), cl);
  });
  std::vector<std::pair<std::string, Result>> runs;
  for (const bool gelu_recompute : {false, true}) {
    DiTExecution exec;
    exec.fused_kernels = true, exec.gelu_recompute = gelu_recompute;
    runs.emplace_back("dit_block twice, gelu_recompute " + std::to_string(gelu_recompute),
                       run(block, x, c, gout, [&](const at::Tensor& xl, const at::Tensor& cl) {
                         const DiTBlockWeights w = weights_of(block);
                         return fused::dit_block(block, w, fused::dit_block(block, w, xl, cl, exec), cl, exec);
                       }));
  }
  runs.emplace_back("chained over the block twice", run(block, x, c, gout, [&](const at::Tensor& xl,
                                                                                const at::Tensor& cl) {
    const fused::DiTBlockSeq twice = fused::own_weights(std::vector<const DiTBlock*>{&block, &block});
    const auto mods = fused::dit_modulations(twice, at::silu(cl));
    return fused::dit_blocks_chained(twice, mods, xl, at::kFloat, true, [](const fused::GatedResidual& r) {
      return ops::gated_residual(r.x, r.gate, r.y, r.bias);
    });
  }));

  const auto names = block.named_parameters();
  ASSERT_EQ(names.size(), plain.grads.size());
  for (const auto& [what, got] : runs) {
    // The same math in fp32, summed in other orders.
    EXPECT_LT(rel_l2(got.out, plain.out), 1e-5) << what;
    EXPECT_LT(rel_l2(got.dx, plain.dx), 1e-5) << what << " dx";
    EXPECT_LT(rel_l2(got.dc, plain.dc), 1e-5) << what << " dc";
    for (size_t k = 0; k < plain.grads.size(); ++k) {
      EXPECT_GT(plain.grads[k].abs().max().item<double>(), 0) << names[k].first;
      EXPECT_LT(rel_l2(got.grads[k], plain.grads[k]), 1e-5) << names[k].first << ", " << what;
    }
  }
  // Twice is not once: the second application changed the output.
  EXPECT_GT(rel_l2(block.forward(x, c), plain.out), 1e-2);
}

// Block a run with block b's weights (a different-seeded block of the same
// shape) computes b's function, and the gradients land in b's parameters,
// none in a's: alone (dit_block) and chained after b's own application.
TEST(DiTBlockFused, AnotherBlocksWeightsRunThatBlocksFunction) {
  DiTConfig cfg = dit_config("DiT-S/2");
  cfg.hidden = 64, cfg.heads = 4;
  auto gen = seeded_cpu_generator(17);
  DiTBlock a(cfg, gen), b(cfg, gen);
  for (DiTBlock* blk : {&a, &b})
    blk->transform([&](const std::string&, const at::Tensor& w) { return w + 0.1 * at::randn(w.sizes(), gen); });
  const int64_t B = 2, T = 9, D = cfg.hidden;
  const at::Tensor x = at::randn({B, T, D}, gen), c = at::randn({B, D}, gen), gout = at::randn({B, T, D}, gen);
  const Result plain = run(b, x, c, gout, [&](const at::Tensor& xl, const at::Tensor& cl) {
    return b.forward(b.forward(xl, cl), cl);
  });
  DiTExecution exec;
  exec.fused_kernels = true;
  const fused::DiTBlockSeq seq = {{&b, weights_of(b), at::Tensor()}, {&a, weights_of(b), at::Tensor()}};
  const Result got = run(b, x, c, gout, [&](const at::Tensor& xl, const at::Tensor& cl) {
    const auto mods = fused::dit_modulations(seq, at::silu(cl));
    return fused::dit_blocks_chained(seq, mods, xl, at::kFloat, true, [](const fused::GatedResidual& r) {
      return ops::gated_residual(r.x, r.gate, r.y, r.bias);
    });
  });
  EXPECT_LT(rel_l2(got.out, plain.out), 1e-5);
  EXPECT_LT(rel_l2(got.dx, plain.dx), 1e-5);
  for (size_t k = 0; k < plain.grads.size(); ++k) EXPECT_LT(rel_l2(got.grads[k], plain.grads[k]), 1e-5) << k;
  for (const auto& p : a.parameters()) EXPECT_FALSE(p.grad().defined());
  const at::Tensor alone = fused::dit_block(a, weights_of(b), x, c, exec);
  EXPECT_LT(rel_l2(alone, b.forward(x, c)), 1e-5);
  EXPECT_GT(rel_l2(alone, a.forward(x, c)), 1e-2);
}

}  // namespace
}  // namespace perftrain::models
