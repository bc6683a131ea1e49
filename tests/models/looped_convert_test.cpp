// DiT -> looped conversion (models/looped_convert.h): at full rank with every
// block linear targeted the looped model computes the DiT's function; at a
// lower rank the reconstruction error is nonzero and printed; the shared
// weights are the mean (or the chosen layer); a depth that does not add up is
// a one-line error naming the keys.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "base/error.h"
#include "models/dit.h"
#include "models/looped.h"
#include "models/looped_convert.h"
#include "support/test_support.h"

namespace perftrain::models {
namespace {

DiTConfig tiny_dit() {
  DiTConfig c = dit_config("DiT-T/2");  // depth 6
  c.hidden = 64;  // two heads of 32: small enough for a loaded 2-core machine
  c.heads = 2;
  c.image_size = 8;
  c.num_classes = 10;
  return c;
}

// The DiT with every trainable tensor drawn at random (the reference's
// zero-initialised modulations and final layer would make every output 0).
std::unique_ptr<DiT> random_dit(const DiTConfig& cfg) {
  auto dit = std::make_unique<DiT>(cfg, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  dit->transform([&](const std::string& name, const at::Tensor& t) {
    return name == "pos_embed" ? t : at::randn(t.sizes(), gen) * 0.08;
  });
  return dit;
}

DiTConfig looped_from(const DiTConfig& src, int64_t prelude, int64_t coda, int64_t group, int64_t rank,
                      const std::string& targets) {
  DiTConfig c = src;
  c.family = "looped";
  c.name = "Looped-T/2";
  c.loop_block = "dit";
  c.prelude = prelude;
  c.coda = coda;
  c.shared_group = group;
  c.loops = (src.depth - prelude - coda) / group;
  c.lora_rank = rank;
  c.lora_targets = targets;
  c.lora_bias = true;
  c.depth = c.looped_depth();
  return c;
}

std::unique_ptr<LoopedDiT> load(const LoopedConversion& conv, const DiTConfig& cfg) {
  auto m = std::make_unique<LoopedDiT>(cfg, 3);
  std::map<std::string, at::Tensor> by_name(conv.state.begin(), conv.state.end());
  size_t used = 0;
  at::NoGradGuard no_grad;
  for (auto& [name, t] : m->state()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    EXPECT_EQ(it->second.sizes(), t.sizes()) << name;
    t.copy_(it->second);
    ++used;
  }
  EXPECT_EQ(used, by_name.size()) << "every converted tensor has a place in the looped model";
  return m;
}

struct Batch {
  at::Tensor x, t;
  Condition cond;
};
Batch batch(const DiTConfig& cfg) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Batch b;
  b.x = at::randn({3, cfg.in_channels, cfg.image_size, cfg.image_size}, gen);
  b.t = at::rand({3}, gen) * 999;
  b.cond.labels = at::randint(cfg.num_classes, {3}, gen, at::kLong);
  return b;
}

double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

TEST(LoopedConvert, FullRankWithEveryLinearTargetedComputesTheDiTsFunction) {
  const DiTConfig src = tiny_dit();
  const auto dit = random_dit(src);
  const DiTConfig cfg = looped_from(src, 1, 1, 1, src.hidden, "attn,mlp,adaln");
  const LoopedConversion conv = convert_to_looped(dit->state(), src, cfg, "mean");
  const auto looped = load(conv, cfg);
  const Batch b = batch(src);
  at::NoGradGuard no_grad;
  const at::Tensor want = dit->forward(b.x, b.t, b.cond), got = looped->forward(b.x, b.t, b.cond);
  ASSERT_GT(want.norm().item<double>(), 0);
  EXPECT_LT(relative_difference(got, want), 1e-5);
  for (const ReconstructionError& e : conv.errors) {
    EXPECT_TRUE(e.adapter) << e.tensor << " has no adapter";
    EXPECT_LT(e.relative, 1e-5) << "blocks." << e.layer << " " << e.tensor;
  }
  EXPECT_EQ(conv.errors.size(), 4u * 5) << "4 loops x 5 targets";
}

TEST(LoopedConvert, LowerRankLosesSomethingAndSaysHowMuch) {
  const DiTConfig src = tiny_dit();
  const auto dit = random_dit(src);
  const DiTConfig cfg = looped_from(src, 1, 1, 1, 4, "attn,mlp");
  const LoopedConversion conv = convert_to_looped(dit->state(), src, cfg, "mean");
  double worst = 0;
  bool modulation_lost = false;
  for (const ReconstructionError& e : conv.errors) {
    worst = std::max(worst, e.relative);
    modulation_lost = modulation_lost || (e.tensor == "adaLN_modulation.1.weight" && !e.adapter && e.relative > 0);
  }
  EXPECT_GT(worst, 0.1) << "rank 4 of 64 drops much of a random difference";
  EXPECT_TRUE(modulation_lost) << "adaLN is not targeted: its per-layer differences are reported as lost";
  const std::string table = format_reconstruction(conv);
  EXPECT_NE(table.find("attn.qkv"), std::string::npos) << table;
  EXPECT_NE(table.find("blocks.4 loop 3"), std::string::npos) << table;
  EXPECT_NE(table.find("worst"), std::string::npos) << table;
  std::string notes;
  for (const auto& n : conv.notes) notes += n + "\n";
  EXPECT_NE(notes.find("adaLN_modulation.1.weight"), std::string::npos) << notes;
  EXPECT_NE(notes.find("truncated SVD"), std::string::npos) << notes;
  // The loss shows in the output too.
  const auto looped = load(conv, cfg);
  const Batch b = batch(src);
  at::NoGradGuard no_grad;
  EXPECT_GT(relative_difference(looped->forward(b.x, b.t, b.cond), dit->forward(b.x, b.t, b.cond)), 1e-3);
}

TEST(LoopedConvert, SharedWeightsAreTheMeanOrTheChosenLayer) {
  const DiTConfig src = tiny_dit();
  const auto dit = random_dit(src);
  const DiTConfig cfg = looped_from(src, 0, 2, 2, 0, "attn");  // blocks 0..3 as 2 loops of a group of 2
  std::map<std::string, at::Tensor> s;
  for (const auto& [n, t] : dit->state()) s[n] = t;
  auto get = [](const LoopedConversion& c, const std::string& name) {
    for (const auto& [n, t] : c.state)
      if (n == name) return t;
    throw std::runtime_error("no " + name);
  };
  const LoopedConversion mean = convert_to_looped(dit->state(), src, cfg, "mean");
  EXPECT_TRUE(at::allclose(get(mean, "shared.1.mlp.fc1.weight"),
                           (s["blocks.1.mlp.fc1.weight"] + s["blocks.3.mlp.fc1.weight"]) / 2, 1e-6, 1e-7));
  EXPECT_TRUE(at::equal(get(mean, "coda.1.attn.qkv.bias"), s["blocks.5.attn.qkv.bias"]));
  EXPECT_TRUE(at::equal(get(mean, "y_embedder.embedding_table.weight"), s["y_embedder.embedding_table.weight"]));
  const LoopedConversion chosen = convert_to_looped(dit->state(), src, cfg, "layer:2");
  EXPECT_TRUE(at::equal(get(chosen, "shared.0.attn.proj.weight"), s["blocks.2.attn.proj.weight"]));
  EXPECT_TRUE(at::equal(get(chosen, "shared.1.attn.proj.weight"), s["blocks.3.attn.proj.weight"]));
}

TEST(LoopedConvert, ADepthThatDoesNotAddUpIsAOneLineErrorNamingTheKeys) {
  const DiTConfig src = tiny_dit();
  DiTConfig cfg = looped_from(src, 1, 1, 1, 4, "attn");
  cfg.loops = 3;  // 1 + 3 + 1 != 6
  const std::string e = perftrain::testing::error_of<UsageError>([&] { check_looped_conversion(src, cfg, "mean"); });
  EXPECT_NE(e.find("model.loops"), std::string::npos) << e;
  EXPECT_NE(e.find("depth 6"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  cfg.loops = 4;
  EXPECT_THROW(check_looped_conversion(src, cfg, "layer:6"), UsageError);
  EXPECT_THROW(check_looped_conversion(src, cfg, "median"), UsageError);
  EXPECT_NO_THROW(check_looped_conversion(src, cfg, "layer:5"));
}

}  // namespace
}  // namespace perftrain::models
