// The program as a user runs it: exit codes (0 ok, 1 runtime error, 2 usage
// error), one-line messages that name the problem, no stack dumps.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "io/safetensors.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;

using Result = perftrain::testing::CommandResult;

Result run(const std::string& args) { return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args); }

// A usage (2) or runtime (1) error with a short message containing `expect`.
void expect_error(const std::string& args, int code, const std::string& expect) {
  auto r = run(args);
  EXPECT_EQ(r.code, code) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(expect), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << "stack dump: " << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
}

const std::string kTiny =
    " --device cpu --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.patch=8"
    " --set log.sample_per_class=1 --set diffusion.sample_steps=1 --set log.sample_classes=2";

TEST(Cli, ModelsListsTheRegistry) {
  auto r = run("models");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("DiT-XL/2"), std::string::npos);
  EXPECT_NE(r.output.find("675129632"), std::string::npos) << r.output;
}

TEST(Cli, BadUsageExitsTwoWithAClearMessage) {
  TempDir tmp;
  const std::string runs = " --runs-dir " + tmp.path();
  expect_error("train --model DiT-Q/2" + runs, 2, "known models: DiT-XL/2");
  expect_error("train" + runs + kTiny + " --batch-size 0", 2, "train.batch_size must be positive");
  expect_error("train" + runs + kTiny + " --lr -0.1", 2, "train.lr must be positive");
  expect_error("train" + runs + kTiny + " --set model.patch=3", 2, "does not divide image_size");
  expect_error("train" + runs + kTiny + " --set train.bogus=1", 2, "unknown key train.bogus");
  expect_error("train" + runs + kTiny + " --data-path " + tmp.path() + "/nowhere", 2,
               "apt-get install dataset-fashion-mnist");
  expect_error("train --no-such-flag", 2, "--no-such-flag");
  expect_error("frobnicate", 2, "frobnicate");
  expect_error("sample --ckpt " + tmp.path() + "/missing", 2, "does not exist");
  perftrain::testing::write_raw(tmp.file("bad.toml"), "[train]\nsteps = \"x\"\n");
  expect_error("train --config " + tmp.file("bad.toml") + runs, 2, "train.steps must be an integer");
}

// A switch that refuses a misspelt value stops the command before it writes
// anything (it is otherwise first read inside the first step).
TEST(Cli, BadSwitchValueExitsTwoBeforeWritingARun) {
  TempDir tmp;
  const std::string train = std::string(PERFTRAIN_BINARY) + " train --runs-dir " + tmp.path() + kTiny;
  for (const std::string& env : {std::string("PERFTRAIN_ATTN_BWD=cuDNN"), std::string("PERFTRAIN_ATTN_FWD=yes"),
                                 std::string("PERFTRAIN_FC1_SCHEDULE=coop")}) {
    const auto r = perftrain::testing::run_shell(env + " " + train);
    EXPECT_EQ(r.code, 2) << env << "\n" << r.output;
    EXPECT_NE(r.output.find(env.substr(0, env.find('='))), std::string::npos) << r.output;
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << env << ": a run was started";
  }
}

TEST(Cli, CorruptFilesExitOneNamingTheFile) {
  TempDir tmp;
  perftrain::testing::write_raw(tmp.file("shard.safetensors"), std::string("\x10\x00\x00\x00\x00\x00\x00\x00{\"la", 12));
  expect_error("train --data latents --data-path " + tmp.file("shard.safetensors") + " --runs-dir " + tmp.path() + kTiny,
               1, "shard.safetensors");
  perftrain::testing::write_raw(tmp.file("w.safetensors"), "not a safetensors file at all");
  expect_error("sample --ckpt " + tmp.file("w.safetensors"), 1, "w.safetensors");
}

TEST(Cli, TrainsSamplesAndResumesOnTheCpu) {
  TempDir tmp;
  const std::string base = "train --data synthetic --set data.synthetic_size=64 --steps 4 --batch-size 4 --run-name r "
                           "--runs-dir " + tmp.path() + kTiny;
  auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("done: steps 1-4"), std::string::npos) << r.output;
  // A second fresh run into the same directory would clobber it: refused.
  expect_error(base, 2, "--resume");
  r = run("train --resume " + tmp.path() + "/r --steps 6");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("done: steps 5-6"), std::string::npos) << r.output;
  r = run("sample --ckpt " + tmp.path() + "/r --out " + tmp.file("grid.png") + " --per-class 2 --steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("grid.png")).substr(1, 3), "PNG");
}

}  // namespace
