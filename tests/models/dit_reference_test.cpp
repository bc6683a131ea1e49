// The C++ DiT against the plain-PyTorch reference (bench/reference_dit.py,
// which mirrors facebookresearch/DiT): same weights and inputs in both, then
// outputs and every gradient compared; parameter names, shapes and counts
// compared for the registry configs.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rand.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

#include "base/error.h"
#include "io/safetensors.h"
#include "support/test_support.h"
#include "models/dit.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::models {
namespace {

using perftrain::testing::run_command;
using perftrain::testing::TempDir;

std::string reference_cmd(const DiTConfig& c, const std::string& sub) {
  char flags[512];
  std::snprintf(flags, sizeof flags,
                " --depth %lld --hidden %lld --heads %lld --patch %lld --image-size %lld --in-channels %lld"
                " --num-classes %lld --class-dropout %g %s",
                (long long)c.depth, (long long)c.hidden, (long long)c.heads, (long long)c.patch,
                (long long)c.image_size, (long long)c.in_channels, (long long)c.num_classes, c.class_dropout,
                c.learn_sigma ? "--learn-sigma" : "--no-learn-sigma");
  return std::string(PERFTRAIN_PYTHON) + " " + PERFTRAIN_SOURCE_DIR + "/bench/reference_dit.py " + sub + flags;
}

// Relative error ||a - b|| / ||b|| (b nonzero), in float64.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return (a64 - b64).norm().item<double>() / std::max(b64.norm().item<double>(), 1e-30);
}

void compare_with_reference(DiTConfig cfg, uint64_t seed) {
  TempDir tmp;
  DiT model(cfg, seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  // The reference initialisation zeroes the adaLN and final layers, which
  // would make most gradients zero: perturb every weight so all paths count.
  model.transform([&](const std::string& name, const at::Tensor& t) {
    if (name == "pos_embed") return t;
    return t + 0.05 * at::randn(t.sizes(), gen, at::kFloat);
  });
  io::save_safetensors(tmp.file("w.safetensors"), model.state());

  const int64_t B = 3;
  auto x = at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  auto t = at::rand({B}, gen, at::kFloat) * 999;
  // Labels include the null class when the model has one.
  auto y = at::randint(0, cfg.num_classes + (cfg.class_dropout > 0), {B}, gen, at::kLong);
  auto gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  io::save_safetensors(tmp.file("in.safetensors"), io::NamedTensors{{"x", x}, {"t", t}, {"y", y}, {"gout", gout}});

  auto xg = x.clone().set_requires_grad(true);
  auto out = model.forward(xg, t, y);
  (out * gout).sum().backward();

  const std::string cmd = reference_cmd(cfg, "check") + " --weights " + tmp.file("w.safetensors") +
                          " --inputs " + tmp.file("in.safetensors") + " --out " + tmp.file("out.safetensors");
  ASSERT_EQ(run_command(cmd), 0) << cmd;
  auto ref = io::SafetensorsFile::open(tmp.file("out.safetensors"));

  // fp32 on both sides, same op order up to library kernels: 1e-5 relative.
  const double tol = 1e-5;
  EXPECT_LT(rel_err(out, ref.get("out")), tol);
  EXPECT_LT(rel_err(xg.grad(), ref.get("grad.x")), tol);
  int compared = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(ref.contains("grad." + name)) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(rel_err(p.grad(), ref.get("grad." + name)), tol) << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(model.named_parameters().size()));
}

TEST(DiTReference, SmallModelWithLearnedSigmaMatchesPyTorch) {
  DiTConfig c;
  c.depth = 2, c.hidden = 64, c.heads = 4, c.patch = 2;
  c.image_size = 8, c.in_channels = 3, c.num_classes = 5, c.learn_sigma = true;
  compare_with_reference(c, 7);
}

TEST(DiTReference, OddShapesWithoutSigmaOrNullClassMatchPyTorch) {
  DiTConfig c;
  c.depth = 3, c.hidden = 48, c.heads = 3, c.patch = 3;  // 3x3 patches of a 9x9 input
  c.image_size = 9, c.in_channels = 1, c.num_classes = 7, c.learn_sigma = false, c.class_dropout = 0.0;
  compare_with_reference(c, 11);
}

TEST(DiTReference, NamesShapesAndCountsMatchForEveryRegistryConfig) {
  TempDir tmp;
  const std::string cmd = std::string(PERFTRAIN_PYTHON) + " " + PERFTRAIN_SOURCE_DIR +
                          "/bench/reference_dit.py params --all --json > " + tmp.file("params.json");
  ASSERT_EQ(run_command(cmd), 0) << cmd;
  std::ifstream in(tmp.file("params.json"));
  auto ref = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& name : dit_model_names()) {
    if (name.rfind("DiT-T", 0) == 0) continue;  // perftrain's own size, not in the reference
    ASSERT_TRUE(ref.contains(name)) << name;
    const auto c = dit_config(name);
    EXPECT_EQ(c.parameter_count(), ref[name]["params"].get<int64_t>()) << name;
    EXPECT_EQ(c.parameter_count(true), ref[name]["trainable"].get<int64_t>()) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 12);
  // Names and shapes, in state_dict order, for a model small enough to build.
  DiT s2(dit_config("DiT-S/2"), 0);
  EXPECT_EQ(s2.parameter_count(), dit_config("DiT-S/2").parameter_count());
  const auto& tensors = ref["DiT-S/2"]["tensors"];
  const auto state = s2.state();
  ASSERT_EQ(tensors.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(tensors[i][0].get<std::string>(), state[i].first);
    EXPECT_EQ(tensors[i][1].get<std::vector<int64_t>>(), state[i].second.sizes().vec()) << state[i].first;
  }
}

TEST(DiT, ZeroInitialisedModelOutputsZeroAndIdentityBlocks) {
  DiTConfig c = dit_config("DiT-T/4");
  c.in_channels = 1, c.num_classes = 10;
  DiT model(c, 3);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto x = at::randn({2, 1, 32, 32}, gen, at::kFloat);
  auto out = model.forward(x, at::rand({2}, gen, at::kFloat) * 999, at::randint(0, 10, {2}, gen, at::kLong));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 2, 32, 32}));
  EXPECT_EQ(out.abs().max().item<float>(), 0.0f);  // final layer is zero-initialised
}

// The fused path's structure on the CPU (where each fused op is its fp32
// reference): the patch embedding as a product, the blocks chained, the
// stacked modulations and the last residual fused with the final layer's
// norm, and the recompute variant, give the plain model's output and
// gradients. (The CUDA kernels themselves: tests/models/dit_gpu_test.cpp.)
TEST(DiT, FusedPathMatchesThePlainModelInFp32) {
  DiTConfig c = dit_config("DiT-T/4");
  c.in_channels = 3, c.num_classes = 10, c.depth = 3;
  DiT plain(c, 3), fused(c, 3);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  // Away from adaLN-Zero, so that every path carries signal.
  auto perturb = [&gen](const std::string& n, const at::Tensor& w) {
    return n == "pos_embed" ? w : w + 0.05 * at::randn(w.sizes(), gen, at::kFloat);
  };
  plain.transform(perturb);
  const auto state = plain.state();
  size_t i = 0;
  fused.transform([&](const std::string&, const at::Tensor&) { return state[i++].second.clone(); });
  auto x = at::randn({2, 3, 32, 32}, gen, at::kFloat);
  auto t = at::rand({2}, gen, at::kFloat) * 999;
  auto y = at::randint(0, 10, {2}, gen, at::kLong);
  auto gout = at::randn({2, 6, 32, 32}, gen, at::kFloat);
  auto run = [&](DiT& m, const DiTExecution& exec) {
    const at::Tensor out = m.forward(x, t, y, exec);
    (out * gout).sum().backward();
    std::vector<at::Tensor> grads;
    for (auto& p : m.parameters()) {
      grads.push_back(p.grad().clone());
      p.mutable_grad() = at::Tensor();
    }
    return std::make_pair(out.detach(), grads);
  };
  const auto ref = run(plain, {});
  const auto names = plain.named_parameters();
  for (const bool recompute : {false, true}) {
    for (const bool gelu_recompute : {false, true}) {
      DiTExecution exec;
      exec.fused_kernels = true, exec.recompute = recompute, exec.gelu_recompute = gelu_recompute;
      const std::string what =
          "recompute " + std::to_string(recompute) + ", gelu_recompute " + std::to_string(gelu_recompute);
      const auto got = run(fused, exec);
      EXPECT_TRUE(got.first.allclose(ref.first, 1e-4, 1e-5)) << what;
      for (size_t k = 0; k < ref.second.size(); ++k)
        EXPECT_TRUE(got.second[k].allclose(ref.second[k], 1e-3, 1e-5)) << names[k].first << ", " << what;
    }
  }
  // Each weight is used once per step on both paths: the condition under
  // which the step runner leaves the weight gradients on a second stream.
  DiTExecution fused_exec;
  fused_exec.fused_kernels = true;
  for (DiT* m : {&plain, &fused}) {
    const DiTExecution exec = m == &fused ? fused_exec : DiTExecution{};
    EXPECT_TRUE(
        ops::leaves_used_more_than_once((m->forward(x, t, y, exec) * gout).sum(), m->named_parameters()).empty())
        << (m == &fused ? "fused" : "plain");
  }
}

TEST(DiT, SameSeedSameWeightsDifferentSeedDifferent) {
  DiTConfig c = dit_config("DiT-T/8");
  DiT a(c, 1), b(c, 1), d(c, 2);
  const auto sa = a.state(), sb = b.state(), sd = d.state();
  bool any_diff = false;
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(sa[i].second.equal(sb[i].second)) << sa[i].first;
    any_diff |= !sa[i].second.equal(sd[i].second);
  }
  EXPECT_TRUE(any_diff);
}

TEST(DiTConfig, RejectsUnknownNamesAndImpossibleShapes) {
  try {
    dit_config("DiT-XXL/2");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DiT-XL/2"), std::string::npos) << "should list the known models";
  }
  // Every family's names, from the one registry, whichever lookup failed.
  for (const char* bad : {"DiT-Q/2", "SS-Q/2", "Looped-Q/2", "Looped-B/1"}) {
    try {
      model_config(bad);
      FAIL() << bad;
    } catch (const UsageError& e) {
      for (const auto& name : model_names())
        EXPECT_NE(std::string(e.what()).find(" " + name), std::string::npos) << bad << " should list " << name;
    }
  }
  EXPECT_EQ(model_names().size(),
            dit_model_names().size() + single_stream_model_names().size() + looped_model_names().size());
  DiTConfig c = dit_config("DiT-S/2");
  c.image_size = 33;
  EXPECT_THROW(c.validate(), UsageError);
  c = dit_config("DiT-S/2");
  c.heads = 5;
  EXPECT_THROW(c.validate(), UsageError);
}

}  // namespace
}  // namespace perftrain::models
