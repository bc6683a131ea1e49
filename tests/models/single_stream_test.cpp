// The single-stream DiT: against its plain-PyTorch reference
// (bench/reference_single_stream.py) on the same weights and inputs, outputs
// and every gradient, with class tokens and with condition features (masked
// and unmasked, odd token counts); parameter names, shapes and counts; the
// key padding mask (padded condition tokens change nothing).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "models/single_stream.h"
#include "nn/rotary.h"
#include "support/test_support.h"

namespace perftrain::models {
namespace {

using perftrain::testing::run_command;
using perftrain::testing::TempDir;

std::string reference_cmd(const DiTConfig& c, const std::string& sub) {
  char flags[512];
  std::snprintf(flags, sizeof flags,
                " --depth %lld --hidden %lld --heads %lld --patch %lld --image-size %lld --in-channels %lld"
                " --num-classes %lld --class-dropout %g --cond-tokens %lld --cond-dim %lld %s",
                (long long)c.depth, (long long)c.hidden, (long long)c.heads, (long long)c.patch,
                (long long)c.image_size, (long long)c.in_channels, (long long)c.num_classes, c.class_dropout,
                (long long)c.cond_tokens, (long long)c.cond_dim, c.learn_sigma ? "--learn-sigma" : "--no-learn-sigma");
  return std::string(PERFTRAIN_PYTHON) + " " + PERFTRAIN_SOURCE_DIR + "/bench/reference_single_stream.py " + sub +
         flags;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return (a64 - b64).norm().item<double>() / std::max(b64.norm().item<double>(), 1e-30);
}

DiTConfig small(int64_t patch, int64_t image, int64_t cond_tokens, int64_t cond_dim) {
  DiTConfig c = model_config("SS-S/2");
  c.depth = 2, c.hidden = 64, c.heads = 4, c.patch = patch, c.image_size = image;
  c.in_channels = 3, c.num_classes = 5, c.cond_tokens = cond_tokens, c.cond_dim = cond_dim;
  return c;
}

// A model with every weight perturbed (the zero-initialised adaLN and final
// layers would make most gradients zero).
std::unique_ptr<SingleStreamDiT> perturbed(const DiTConfig& cfg, uint64_t seed) {
  auto model = std::make_unique<SingleStreamDiT>(cfg, seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  model->transform([&](const std::string&, const at::Tensor& t) { return t + 0.1 * at::randn(t.sizes(), gen, at::kFloat); });
  return model;
}

// lengths: per-sample valid condition tokens, or empty for none.
void compare_with_reference(const DiTConfig& cfg, uint64_t seed, std::vector<int64_t> lengths = {}) {
  TempDir tmp;
  auto model = perturbed(cfg, seed);
  io::save_safetensors(tmp.file("w.safetensors"), model->state());

  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 2);
  const int64_t B = 3;
  auto x = at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  auto t = at::rand({B}, gen, at::kFloat) * 999;
  auto gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  io::NamedTensors inputs{{"x", x}, {"t", t}, {"gout", gout}};
  Condition cond;
  at::Tensor cond_g;
  if (cfg.cond_dim == 0) {
    cond.labels = at::randint(0, cfg.num_classes + 1, {B}, gen, at::kLong);  // the null class too
    inputs.emplace_back("y", cond.labels);
  } else {
    cond.features = at::randn({B, cfg.cond_tokens, cfg.cond_dim}, gen, at::kFloat);
    inputs.emplace_back("cond", cond.features);
    cond_g = cond.features.clone().set_requires_grad(true);
    if (!lengths.empty()) {
      cond.lengths = at::tensor(lengths, at::kLong);
      inputs.emplace_back("cond_len", cond.lengths);
    }
  }
  io::save_safetensors(tmp.file("in.safetensors"), inputs);

  auto xg = x.clone().set_requires_grad(true);
  Condition c2 = cond;
  if (cond_g.defined()) c2.features = cond_g;
  auto out = model->forward(xg, t, c2);
  ASSERT_EQ(out.sizes(), gout.sizes());
  (out * gout).sum().backward();

  const std::string cmd = reference_cmd(cfg, "check") + " --weights " + tmp.file("w.safetensors") + " --inputs " +
                          tmp.file("in.safetensors") + " --out " + tmp.file("out.safetensors");
  ASSERT_EQ(run_command(cmd), 0) << cmd;
  auto ref = io::SafetensorsFile::open(tmp.file("out.safetensors"));
  const double tol = 2e-5;
  EXPECT_LT(rel_err(out, ref.get("out")), tol);
  EXPECT_LT(rel_err(xg.grad(), ref.get("grad.x")), tol);
  if (cond_g.defined()) EXPECT_LT(rel_err(cond_g.grad(), ref.get("grad.cond")), tol);
  int compared = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(ref.contains("grad." + name)) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().max().item<double>(), 0) << name;
    EXPECT_LT(rel_err(p.grad(), ref.get("grad." + name)), tol) << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(model->named_parameters().size()));
}

TEST(SingleStreamReference, ClassTokensPatch2MatchPyTorch) {
  DiTConfig c = small(2, 8, 2, 0);  // 16 image + 2 class tokens, learned sigma
  compare_with_reference(c, 3);
}

TEST(SingleStreamReference, MaskedFeaturesPatch1OddTokensMatchPyTorch) {
  DiTConfig c = small(1, 3, 5, 7);  // 9 image + 5 condition tokens
  c.learn_sigma = false;
  compare_with_reference(c, 5, {2, 5, 0});  // partly padded, full, the null condition
}

TEST(SingleStreamReference, UnmaskedFeaturesMatchPyTorch) {
  DiTConfig c = small(2, 6, 3, 10);  // 9 image + 3 condition tokens
  compare_with_reference(c, 9);
}

TEST(SingleStreamModel, PaddedConditionTokensDoNotChangeTheOutput) {
  DiTConfig c = small(1, 3, 6, 5);
  auto model = perturbed(c, 13);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  auto x = at::randn({2, 3, 3, 3}, gen, at::kFloat);
  auto t = at::rand({2}, gen, at::kFloat) * 999;
  Condition a;
  a.features = at::randn({2, 6, 5}, gen, at::kFloat);
  a.lengths = at::tensor(std::vector<int64_t>{4, 1}, at::kLong);
  Condition b = a;
  b.features = a.features.clone();
  b.features.narrow(1, 4, 2).select(0, 0).copy_(at::randn({2, 5}, gen, at::kFloat) * 100);  // sample 0's padding
  b.features.narrow(1, 1, 5).select(0, 1).fill_(std::nan(""));                              // sample 1's padding
  at::NoGradGuard ng;
  const auto out_a = model->forward(x, t, a), out_b = model->forward(x, t, b);
  EXPECT_TRUE(out_a.equal(out_b));
  // A valid token does count, and so does the length.
  Condition d = a;
  d.features = a.features.clone();
  d.features.select(0, 0).select(0, 3).add_(1.0);
  EXPECT_GT((model->forward(x, t, d) - out_a).abs().max().item<double>(), 1e-4);
  Condition e = a;
  e.lengths = at::tensor(std::vector<int64_t>{3, 1}, at::kLong);
  EXPECT_GT((model->forward(x, t, e) - out_a).select(0, 0).abs().max().item<double>(), 1e-4);
}

TEST(SingleStreamModel, ShapesParameterCountsAndNamesMatchTheReference) {
  TempDir tmp;
  const std::string cmd = std::string(PERFTRAIN_PYTHON) + " " + PERFTRAIN_SOURCE_DIR +
                          "/bench/reference_single_stream.py params --all --json > " + tmp.file("p.json");
  ASSERT_EQ(run_command(cmd), 0) << cmd;
  std::ifstream in(tmp.file("p.json"));
  const auto ref = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& name : single_stream_model_names()) {
    const DiTConfig c = model_config(name);
    EXPECT_EQ(c.family, "single-stream");
    ASSERT_TRUE(ref.contains(name)) << name;
    EXPECT_EQ(c.parameter_count(), ref[name]["params"].get<int64_t>()) << name;
    EXPECT_EQ(c.parameter_count(true), c.parameter_count()) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 10);
  EXPECT_EQ(model_config("SS-S/2").mlp_hidden(), 1024);   // 8/3 * 384 = 1024
  EXPECT_EQ(model_config("SS-XL/2").mlp_hidden(), 3072);  // 8/3 * 1152 = 3072
  EXPECT_EQ(model_config("SS-B/2").mlp_hidden(), 2048);

  // Built models: the closed form, and the reference's names and shapes in order.
  for (const auto& c : {small(2, 8, 2, 0), small(1, 3, 5, 7)}) {
    SingleStreamDiT m(c, 0);
    EXPECT_EQ(m.parameter_count(), c.parameter_count()) << c.cond_dim;
    char flags[256];
    std::snprintf(flags, sizeof flags, " --json > %s", tmp.file("one.json").c_str());
    ASSERT_EQ(run_command(reference_cmd(c, "params") + flags), 0);
    std::ifstream one(tmp.file("one.json"));
    const auto state = nlohmann::json::parse(one)["SS-S/2"]["state"];
    const auto mine = m.state();
    ASSERT_EQ(state.size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(state[i][0].get<std::string>(), mine[i].first);
      EXPECT_EQ(state[i][1].get<std::vector<int64_t>>(), mine[i].second.sizes().vec()) << mine[i].first;
    }
    auto x = at::randn({2, c.in_channels, c.image_size, c.image_size});
    Condition cond;
    if (c.cond_dim == 0) cond.labels = at::tensor(std::vector<int64_t>{0, 5}, at::kLong);
    else cond.features = at::randn({2, c.cond_tokens, c.cond_dim});
    at::NoGradGuard ng;
    const auto out = m.forward(x, at::rand({2}) * 999, cond);
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, c.out_channels(), c.image_size, c.image_size}));
    EXPECT_EQ(out.abs().max().item<double>(), 0.0) << "zero-initialised final layer";
  }
}

TEST(SingleStreamModel, ConfigValidationAndFamilies) {
  EXPECT_EQ(model_config("DiT-S/2").family, "dit");
  EXPECT_THROW(model_config("SS-Q/2"), UsageError);
  DiTConfig c = model_config("SS-S/2");
  c.heads = 64;  // head dim 6: too small for the rotary split
  EXPECT_THROW(c.validate(), UsageError);
  c = model_config("SS-S/2");
  c.hidden = 396;  // not a multiple of 8: fine for single-stream (DiT's sin-cos needs it)
  c.heads = 6;
  EXPECT_NO_THROW(c.validate());
  EXPECT_THROW(DiT(model_config("SS-T/2"), 0), UsageError);
  EXPECT_EQ(nn::rope_axes(64), (std::array<int64_t, 3>{16, 24, 24}));
  EXPECT_EQ(nn::rope_axes(72), (std::array<int64_t, 3>{20, 26, 26}));
}

}  // namespace
}  // namespace perftrain::models
