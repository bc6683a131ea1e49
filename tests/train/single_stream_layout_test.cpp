// The single-stream DiT's fused path reads two groups of weights as one
// matrix (ops::stacked_linear): all blocks' adaLN modulations [4D, D], and
// each block's [gate; up] [2F, D]. It gets a view instead of a copy only where
// the device optimizer's bf16 copies of those weights lie back to back in that
// order (train/device_optimizer.cpp groups copies by shape, in parameter
// order). These tests build the real model and the real optimizer (on the
// CPU: the layout is the same on every device) and check, on the copies the
// step's ComputeWeightsScope hands out, that the stacked reads are views
// where the layout promises one and always hold the right weights (the copy
// fallback where it does not).
#include <gtest/gtest.h>

#include <ATen/ops/cat.h>

#include <string>
#include <vector>

#include "models/diffusion_model.h"
#include "ops/compute_weights.h"
#include "ops/stacked_linear.h"
#include "train/device_optimizer.h"

namespace perftrain::train {
namespace {

struct Stacked {
  bool view = false;   // one view of the copies' buffer
  bool right = false;  // equal to the concatenation of the parts, in order
};

Stacked read_stacked(const std::vector<at::Tensor>& masters) {
  std::vector<at::Tensor> copies;
  for (const auto& m : masters) copies.push_back(ops::compute_weight(m, at::kBFloat16));
  const at::Tensor s = ops::detail::stacked_rows(copies);
  Stacked r;
  r.view = s.data_ptr() == copies[0].data_ptr() && s.is_alias_of(copies[0]);
  r.right = s.equal(at::cat(copies, 0)) && s.equal(at::cat(masters, 0).to(at::kBFloat16));
  return r;
}

struct Layout {
  Stacked adaln;                  // all blocks' adaLN weights
  std::vector<Stacked> gate_up;   // per block
};

Layout layout_of(const models::DiTConfig& cfg) {
  auto model = models::make_diffusion_model(cfg, 3);
  const auto named = model->named_parameters();
  auto param = [&](const std::string& name) {
    for (const auto& [n, t] : named)
      if (n == name) return t;
    ADD_FAILURE() << "no parameter " << name;
    return at::Tensor();
  };
  DeviceOptimizerOptions o;
  o.bf16_shadows = true;
  DeviceOptimizer opt(named, {}, o);
  const ops::ComputeWeights copies = opt.compute_weights();
  const ops::ComputeWeightsScope scope(&copies);  // as the step runner holds around forward and backward
  Layout l;
  std::vector<at::Tensor> adaln;
  for (int64_t i = 0; i < cfg.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    adaln.push_back(param(b + "adaLN_modulation.weight"));
    l.gate_up.push_back(read_stacked({param(b + "ffn.gate.weight"), param(b + "ffn.up.weight")}));
  }
  l.adaln = read_stacked(adaln);
  return l;
}

models::DiTConfig ss(int64_t depth, int64_t hidden, int64_t heads, double mlp_ratio = 4.0) {
  models::DiTConfig c = models::model_config("SS-S/2");
  c.depth = depth, c.hidden = hidden, c.heads = heads, c.mlp_ratio = mlp_ratio;
  c.image_size = 8, c.in_channels = 4, c.num_classes = 5, c.cond_tokens = 3;
  c.validate();
  return c;
}

// The named configs' widths (multiples of 64): every stacked read is a view.
TEST(SingleStreamLayout, AdaLNAndGateUpCopiesAreReadAsOneView) {
  for (const int64_t hidden : {int64_t(128), int64_t(384)}) {
    const Layout l = layout_of(ss(5, hidden, 2));
    EXPECT_TRUE(l.adaln.view) << "hidden " << hidden << ": the blocks' adaLN copies are not back to back";
    EXPECT_TRUE(l.adaln.right) << "hidden " << hidden;
    for (size_t i = 0; i < l.gate_up.size(); ++i) {
      EXPECT_TRUE(l.gate_up[i].view) << "hidden " << hidden << ", block " << i << ": gate and up not back to back";
      EXPECT_TRUE(l.gate_up[i].right) << "hidden " << hidden << ", block " << i;
    }
  }
}

// Where the layout cannot promise adjacency the read is a copy, and still
// the right weights: D = 102 puts each [4D, D] copy (41616 elements) on a
// 64-element boundary with a gap after it; mlp_ratio 6 makes F = 4D, so the
// [4D, D] group interleaves gate, up and adaLN of each block.
TEST(SingleStreamLayout, NonAdjacentCopiesAreReadAsACopyOfTheRightWeights) {
  {
    const Layout l = layout_of(ss(3, 102, 3));
    EXPECT_FALSE(l.adaln.view) << "D = 102: a gap between the adaLN copies, yet read as a view";
    EXPECT_TRUE(l.adaln.right);
    for (const auto& g : l.gate_up) EXPECT_TRUE(g.right);
  }
  {
    const models::DiTConfig c = ss(3, 96, 2, 6.0);
    ASSERT_EQ(c.mlp_hidden(), 4 * c.hidden);
    const Layout l = layout_of(c);
    EXPECT_FALSE(l.adaln.view) << "F = 4D: gate and up lie between the adaLN copies";
    EXPECT_TRUE(l.adaln.right);
    for (size_t i = 0; i < l.gate_up.size(); ++i) {
      EXPECT_TRUE(l.gate_up[i].view) << "block " << i;
      EXPECT_TRUE(l.gate_up[i].right) << "block " << i;
    }
  }
}

}  // namespace
}  // namespace perftrain::train
