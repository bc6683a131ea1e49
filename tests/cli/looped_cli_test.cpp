// The looped family as a user runs it: listed by `perftrain models` with the
// shared weights counted once, trained by name with the loop keys set on the
// command line, sampled from its checkpoint, and benched against its PyTorch
// reference (bench/reference_looped.py with the same loop keys).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "models/dit_config.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::contains;
using perftrain::testing::TempDir;

perftrain::testing::CommandResult run(const std::string& args) {
  return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args);
}

TEST(LoopedCli, ModelsListsTheFamilyWithSharedWeightsOnce) {
  const auto r = run("models");
  ASSERT_EQ(r.code, 0) << r.output;
  perftrain::models::DiTConfig b = perftrain::models::model_config("Looped-B/2");  // the listing's 32x32x4, 1000 classes
  for (const char* name : {"Looped-T/2", "Looped-B/2", "Looped-XL/8"}) EXPECT_TRUE(contains(r.output, name)) << name;
  EXPECT_TRUE(contains(r.output, " " + std::to_string(b.parameter_count()) + " ")) << r.output;
  const auto j = nlohmann::json::parse(run("models --json").output);
  EXPECT_EQ(j["Looped-B/2"]["loops"], 8);
  EXPECT_EQ(j["Looped-B/2"]["family"], "looped");
  EXPECT_DOUBLE_EQ(j["Looped-B/2"]["train_gflop_per_image"].get<double>(),
                   j["DiT-B/2"]["train_gflop_per_image"].get<double>());
  EXPECT_LT(j["Looped-B/2"]["params"].get<int64_t>(), j["DiT-B/2"]["params"].get<int64_t>() / 2);
}

TEST(LoopedCli, TrainsWithLoopKeysAndSamples) {
  TempDir tmp;
  const std::string base = "train --model Looped-T/2 --data synthetic --set data.synthetic_size=64 --batch-size 8 --device cpu --steps 3 --run-name r --runs-dir " + tmp.path() +
                           " --set model.hidden=32 --set model.heads=2 --set model.prelude=1 --set model.coda=1"
                           " --set model.loops=2 --set model.lora_rank=2 --set model.route_capacity=0.5"
                           " --set log.sample_per_class=1 --set diffusion.sample_steps=1 --set log.sample_classes=2";
  auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string config = perftrain::testing::read_raw(tmp.path() + "/r/config.toml");
  EXPECT_TRUE(contains(config, "family = 'looped'")) << config;
  EXPECT_TRUE(contains(config, "loops = 2")) << config;
  EXPECT_TRUE(contains(config, "depth = 4")) << config;
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.path() + "/r/metrics.jsonl"), "\"aux\""));
  r = run("sample --ckpt " + tmp.path() + "/r --out " + tmp.file("grid.png") + " --classes 2 --per-class 1 --steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("grid.png")).substr(1, 3), "PNG");
  // A bad loop key is a usage error naming it.
  r = run("train --model Looped-T/2 --device cpu --runs-dir " + tmp.path() + " --set model.lora_targets=attn,qkv");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "model.lora_targets")) << r.output;
}

TEST(LoopedCli, BenchAgainstTorchRunsTheLoopedReference) {
  if (perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) + " -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON;
  TempDir tmp;
  auto r = perftrain::testing::run_shell(
      std::string(PERFTRAIN_BINARY) + " bench --python " + std::string(PERFTRAIN_PYTHON) +
      " --device cpu --model Looped-T/2 --batch 2 --steps 2 --warmup 1 --variants eager-fp32 --image-size 8"
      " --set model.hidden=32 --set model.heads=2 --set model.loops=2 --set model.lora_rank=2"
      " --set model.route_capacity_end=0.5 --against-torch --torch-modes eager-fp32 --out " +
      tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("b/bench.json")));
  ASSERT_EQ(j["torch"].size(), 1u);
  const auto& t = j["torch"][0];
  EXPECT_TRUE(t["error"].is_null()) << t.dump(2) << "\n" << perftrain::testing::read_raw(t["log"].get<std::string>());
  EXPECT_GT(t["ms"].get<double>(), 0.0);
  EXPECT_EQ(j["config"]["family"], "looped");
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.file("b/bench.md")), "reference_looped.py"));
}

}  // namespace
