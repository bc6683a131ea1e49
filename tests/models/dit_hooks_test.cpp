// Which of DiT's modules fire their hooks on each execution path, as
// docs/guide/model-views.md lists them (CPU: the fused ops run their
// references).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "models/dit.h"

namespace perftrain::models {
namespace {

std::multiset<std::string> fired(const DiT& model, const DiTExecution& exec, bool backward) {
  std::multiset<std::string> names;
  auto h = model.add_forward_hook(
      [&](const std::string& name, const nn::Module&, at::TensorList, at::TensorList) { names.insert(name); });
  const auto& c = model.config();
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, c.in_channels, c.image_size, c.image_size});
  const at::Tensor t = at::rand({2}) * 999;
  const at::Tensor y = at::randint(0, c.num_classes, {2});
  const at::Tensor out = model.forward(x, t, y, exec);
  if (backward) out.square().mean().backward();
  return names;
}

DiTConfig tiny() {
  DiTConfig c = dit_config("DiT-S/2");
  c.depth = 2;
  c.hidden = 64;
  c.heads = 2;
  c.image_size = 8;
  c.num_classes = 10;
  return c;
}

TEST(DiTHooks, EveryModuleFiresOnThePlainPath) {
  DiT model(tiny(), 1);
  const auto names = fired(model, {}, false);
  for (const std::string n : {"", "x_embedder", "t_embedder", "t_embedder.mlp.0", "t_embedder.mlp.2", "y_embedder",
                              "blocks.0", "blocks.1.attn", "blocks.1.attn.qkv", "blocks.1.attn.proj", "blocks.0.mlp.fc1",
                              "blocks.0.mlp.fc2", "blocks.0.adaLN_modulation", "blocks.0.adaLN_modulation.1",
                              "final_layer", "final_layer.linear", "final_layer.adaLN_modulation.1"})
    EXPECT_EQ(names.count(n), 1u) << n;
  EXPECT_EQ(names.count("x_embedder.proj"), 0u);
  EXPECT_EQ(names.count("t_embedder.mlp"), 0u);
}

TEST(DiTHooks, FusedChainedBlocksDoNotFire) {
  DiT model(tiny(), 1);
  DiTExecution exec;
  exec.fused_kernels = true;
  const auto names = fired(model, exec, false);
  EXPECT_EQ(names, (std::multiset<std::string>{"", "x_embedder", "t_embedder", "t_embedder.mlp.0", "t_embedder.mlp.2",
                                               "y_embedder"}));
}

TEST(DiTHooks, FusedRecomputeFiresBlocksAgainInBackward) {
  DiT model(tiny(), 1);
  model.transform([](const std::string&, const at::Tensor& t) { return t; });  // trainable tensors require grad
  DiTExecution exec;
  exec.fused_kernels = true;
  exec.recompute = true;
  const auto forward_only = fired(model, exec, false);
  EXPECT_EQ(forward_only.count("blocks.0"), 1u);
  EXPECT_EQ(forward_only.count("blocks.0.attn"), 0u);
  EXPECT_EQ(forward_only.count("final_layer"), 1u);
  const auto with_backward = fired(model, exec, true);
  EXPECT_EQ(with_backward.count("blocks.1"), 2u) << "the recompute in backward runs the block again";
}

}  // namespace
}  // namespace perftrain::models
