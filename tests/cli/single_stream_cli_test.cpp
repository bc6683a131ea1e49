// The single-stream family as a user runs it: listed by `perftrain models`,
// trained by name, resumed, and sampled with guidance from its checkpoint.
#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;

perftrain::testing::CommandResult run(const std::string& args) {
  return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args);
}

TEST(SingleStreamCli, ModelsListsTheFamily) {
  const auto r = run("models");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* name : {"SS-S/2", "SS-B/2", "SS-L/2", "SS-XL/2", "SS-XL/1"})
    EXPECT_NE(r.output.find(name), std::string::npos) << name;
  EXPECT_NE(r.output.find("598833216"), std::string::npos) << r.output;  // SS-XL/2, the reference's count
  const auto j = run("models --json");
  EXPECT_NE(j.output.find("\"single-stream\""), std::string::npos);
}

TEST(SingleStreamCli, TrainsResumesAndSamplesWithGuidance) {
  TempDir tmp;
  const std::string base = "train --model SS-T/2 --device cpu --steps 3 --run-name r --runs-dir " + tmp.path() +
                           " --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.cond_tokens=2"
                           " --set log.sample_per_class=1 --set diffusion.sample_steps=1 --set log.sample_classes=2";
  auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("SS-T/2"), std::string::npos) << r.output;
  EXPECT_NE(perftrain::testing::read_raw(tmp.path() + "/r/config.toml").find("family = 'single-stream'"),
            std::string::npos);
  r = run("train --resume " + tmp.path() + "/r --steps 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("done: steps 4-5"), std::string::npos) << r.output;
  r = run("sample --ckpt " + tmp.path() + "/r --out " + tmp.file("grid.png") +
          " --classes 3 --per-class 2 --steps 2 --cfg-scale 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("guidance 3"), std::string::npos) << r.output;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("grid.png")).substr(1, 3), "PNG");
  // A bad family is a usage error naming the key.
  r = run("train --device cpu --runs-dir " + tmp.path() + " --set model.family=mmdit");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("family 'mmdit' (expected dit, single-stream or looped)"), std::string::npos) << r.output;
}

}  // namespace
