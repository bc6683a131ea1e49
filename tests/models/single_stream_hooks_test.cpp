// Which of the single-stream DiT's modules fire their hooks on the plain
// path (the one the NaN locator re-runs and perftrain summary traces): every
// module with a forward, with class tokens and with condition features, and
// a backward hook sees the gradients of each block's output.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "models/dit_config.h"
#include "models/single_stream.h"

namespace perftrain::models {
namespace {

DiTConfig tiny(int64_t cond_dim) {
  DiTConfig c = model_config("SS-S/2");
  c.depth = 2, c.hidden = 64, c.heads = 2, c.image_size = 8, c.in_channels = 4, c.num_classes = 5;
  c.cond_tokens = 3, c.cond_dim = cond_dim;
  return c;
}

struct Fired {
  std::multiset<std::string> forward, backward;
};

Fired fire(const SingleStreamDiT& model, const DiTConfig& c, const DiTExecution& exec = {}) {
  Fired f;
  auto fh = model.add_forward_hook(
      [&](const std::string& name, const nn::Module&, at::TensorList, at::TensorList) { f.forward.insert(name); });
  auto bh = model.add_backward_hook([&](const std::string& name, const nn::Module&, nn::GradOf which, size_t,
                                        const at::Tensor&) {
    if (which == nn::GradOf::kOutput) f.backward.insert(name);
  });
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, c.in_channels, c.image_size, c.image_size});
  const at::Tensor t = at::rand({2}) * 999;
  Condition cond;
  if (c.cond_dim > 0) {
    cond.features = at::randn({2, c.cond_tokens, c.cond_dim});
    cond.lengths = at::tensor({int64_t(1), int64_t(3)});
  } else {
    cond.labels = at::randint(0, c.num_classes, {2});
  }
  model.forward(x, t, cond, exec).square().mean().backward();
  return f;
}

TEST(SingleStreamHooks, EveryModuleFiresOnThePlainPath) {
  for (const int64_t cond_dim : {int64_t(0), int64_t(6)}) {
    const DiTConfig c = tiny(cond_dim);
    SingleStreamDiT model(c, 1);
    model.transform([](const std::string&, const at::Tensor& t) { return t; });  // trainable tensors require grad
    const Fired f = fire(model, c);
    for (const std::string n :
         {"", "x_embedder", "t_embedder", "t_embedder.mlp.0", "t_embedder.mlp.2", "blocks.0", "blocks.1",
          "blocks.0.attn_norm", "blocks.0.attn", "blocks.0.attn.qkv", "blocks.0.attn.q_norm", "blocks.0.attn.k_norm",
          "blocks.0.attn.proj", "blocks.0.attn_post_norm", "blocks.0.ffn_norm", "blocks.1.ffn", "blocks.1.ffn.gate",
          "blocks.1.ffn.up", "blocks.1.ffn.down", "blocks.1.ffn_post_norm", "blocks.1.adaLN_modulation",
          "final_layer", "final_layer.adaLN_modulation", "final_layer.linear"})
      EXPECT_EQ(f.forward.count(n), 1u) << n << " (cond_dim " << cond_dim << ")";
    if (cond_dim > 0) {
      EXPECT_EQ(f.forward.count("cond_embedder"), 1u);
      EXPECT_EQ(f.forward.count("cond_embedder.norm"), 1u);
      EXPECT_EQ(f.forward.count("cond_embedder.linear"), 1u);
    } else {
      EXPECT_EQ(f.forward.count("y_embedder"), 1u);
    }
    for (const std::string n : {"", "blocks.0", "blocks.1", "blocks.0.attn", "blocks.1.ffn", "final_layer"})
      EXPECT_EQ(f.backward.count(n), 1u) << "backward " << n << " (cond_dim " << cond_dim << ")";
  }
}

TEST(SingleStreamHooks, RecomputeFiresBlocksAgainInBackward) {
  const DiTConfig c = tiny(0);
  SingleStreamDiT model(c, 1);
  model.transform([](const std::string&, const at::Tensor& t) { return t; });
  DiTExecution exec;
  exec.recompute = true;
  const Fired f = fire(model, c, exec);
  EXPECT_EQ(f.forward.count("blocks.1"), 2u) << "the recompute in backward runs the block again";
  EXPECT_EQ(f.forward.count("final_layer"), 1u);
}

}  // namespace
}  // namespace perftrain::models
