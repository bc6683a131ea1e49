// ops::qk_norm_rope against the plain path it replaces in
// SingleStreamAttention::forward: qkv viewed as [B, T, 3, H, hd], q and k
// through nn::rms_norm with their weights and nn::apply_rope with
// nn::rope_tables, q | k joined (the op reads q | k of the projection's
// qkv in place and leaves v); values and the gradients of qkv and both
// weights, in fp32 on the CPU, at odd token counts.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <string>
#include <vector>

#include "nn/rms_norm.h"
#include "nn/rotary.h"
#include "ops/qk_norm_rope.h"
#include "support/tensor_checks.h"

namespace perftrain::nn {
namespace {

TEST(QkNormRopeComposition, MatchesRmsNormThenApplyRope) {
  uint64_t seed = 1;
  struct Case {
    int64_t b, t, heads, hd;
  };
  for (const Case c : {Case{2, 5, 3, 64}, Case{1, 17, 2, 72}, Case{1, 9, 2, 96}, Case{2, 3, 1, 128}}) {
    at::Generator g = perftrain::testing::seeded_cpu_generator(seed++);
    const int64_t d = c.heads * c.hd;
    std::vector<std::array<int64_t, 3>> positions;
    for (int64_t i = 0; i < c.t; ++i) positions.push_back({i % 3, i / 4, i % 4});
    const auto [cos, sin] = rope_tables(positions, c.hd);
    const at::Tensor qkv0 = at::randn({c.b, c.t, 3 * d}, g), dout = at::randn({c.b, c.t, 2 * d}, g);
    const at::Tensor qw0 = at::randn({c.hd}, g) * 0.5 + 1, kw0 = at::randn({c.hd}, g) * 0.5 + 1;
    auto run = [&](bool fused) {
      const at::Tensor qkv = qkv0.clone().requires_grad_(true);
      const at::Tensor qw = qw0.clone().requires_grad_(true), kw = kw0.clone().requires_grad_(true);
      at::Tensor out;
      if (fused) {
        const auto qk = ops::qk_norm_rope(qkv.narrow(2, 0, 2 * d), c.heads, qw, kw, cos, sin);
        out = at::cat({qk[0], qk[1]}, 2);
      } else {
        const auto parts = qkv.view({c.b, c.t, 3, c.heads, c.hd}).permute({2, 0, 3, 1, 4}).unbind(0);
        const at::Tensor q = apply_rope(rms_norm(parts[0], qw), cos, sin);
        const at::Tensor k = apply_rope(rms_norm(parts[1], kw), cos, sin);
        out = at::stack({q, k}, 0).permute({1, 3, 0, 2, 4}).reshape({c.b, c.t, 2 * d});
      }
      std::vector<at::Tensor> res = {out.detach()};
      for (const at::Tensor& gr : torch::autograd::grad({out}, {qkv, qw, kw}, {dout})) res.push_back(gr);
      return res;
    };
    const auto fused = run(true), plain = run(false);
    const std::string where = "hd=" + std::to_string(c.hd) + " T=" + std::to_string(c.t) + " ";
    // fp32, norms over <= 128 terms, weight sums over <= 68 rows.
    perftrain::testing::expect_close(fused[0], plain[0], 1e-5, 1e-5, where + "out");
    perftrain::testing::expect_close(fused[1], plain[1], 1e-5, 1e-5, where + "dqkv");
    perftrain::testing::expect_close(fused[2], plain[2], 1e-4, 1e-5, where + "dq_weight");
    perftrain::testing::expect_close(fused[3], plain[3], 1e-4, 1e-5, where + "dk_weight");
  }
}

}  // namespace
}  // namespace perftrain::nn
