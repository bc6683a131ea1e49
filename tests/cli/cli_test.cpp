// The program as a user runs it: exit codes (0 ok, 1 runtime error, 2 usage
// error), one-line messages that name the problem, no stack dumps.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "compat/compat.h"
#include "io/safetensors.h"
#include "train/config.h"
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

// The value of the first "key = value" line of a TOML text, quotes removed.
std::string toml_value(const std::string& toml, const std::string& key) {
  std::istringstream lines(toml);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + " = ", 0) != 0) continue;
    std::string v = line.substr(key.size() + 3);
    if (v.size() >= 2 && (v[0] == '"' || v[0] == '\'') && v.back() == v[0]) v = v.substr(1, v.size() - 2);
    return v;
  }
  return "(no " + key + ")";
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

// A [speed] key with a misspelt value stops the command before it writes
// anything, naming the key and the values it takes.
TEST(Cli, BadSpeedKeyValueExitsTwoBeforeWritingARun) {
  TempDir tmp;
  const std::string train = "train --runs-dir " + tmp.path() + kTiny;
  expect_error(train + " --set speed.attention=fast", 2, "speed.attention");
  expect_error(train + " --set speed.attention=fast", 2, "cudnn");
  expect_error(train + " --set speed.weight_grad_stream=yes", 2, "speed.weight_grad_stream");
  expect_error(train + " --set speed.gemm_tune=65", 2, "speed.gemm_tune");
  expect_error(train + " --set speed.bogus=1", 2, "unknown key speed.bogus");
  expect_error("config --set speed.attention=fast", 2, "speed.attention");
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "a run was started";
}

TEST(Cli, VersionNamesCommitTorchAndCuda) {
  const auto r = run("--version");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(^perftrain \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,}|unknown)\)\n)")))
      << r.output;
  EXPECT_NE(r.output.find("torch " + perftrain::compat::torch_version()), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(kernels built with CUDA \d+\.\d+)"))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nGPU: )"))) << r.output;
}

// `config` and `train --dry-run` print the resolved config, which reads back
// as a --config file to the same config, and start nothing.
TEST(Cli, ConfigAndDryRunPrintTheResolvedConfigAndWriteNothing) {
  TempDir tmp;
  const std::string args = " --runs-dir " + tmp.path() + kTiny + " --steps 7 --set speed.attention=cudnn";
  const auto r = run("config" + args);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* want : {"[model]", "[train]", "[speed]"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  EXPECT_EQ(toml_value(r.output, "steps"), "7") << r.output;
  EXPECT_EQ(toml_value(r.output, "depth"), "1") << r.output;
  EXPECT_EQ(toml_value(r.output, "attention"), "cudnn") << r.output;
  const auto dry = run("train --dry-run" + args);
  ASSERT_EQ(dry.code, 0) << dry.output;
  EXPECT_EQ(dry.output, r.output);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "a run was started";

  TempDir other;
  perftrain::testing::write_raw(other.file("c.toml"), r.output);
  const auto again = run("config --config " + other.file("c.toml"));
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(again.output, r.output);
  expect_error("config --set train.steps=0", 2, "train.steps must be positive");
}

// Every option that takes a value shows its default in --help ("--steps
// INT=4000 (GPU), 500 (CPU)"), except those that have none.
TEST(Cli, HelpShowsTheDefaults) {
  const std::set<std::string> no_default = {"--config", "--resume", "--init-from", "--set", "--ckpt", "--help", "--version"};
  const std::regex option(R"(^\s+(?:-\w, )?(--[\w-]+)\s+([A-Z]+)(\S*))");
  for (const std::string cmd : {"", "train", "config", "sample", "eval", "models"}) {
    const auto r = run(cmd + " --help");
    ASSERT_EQ(r.code, 0) << r.output;
    std::istringstream lines(r.output);
    int with_value = 0;
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, option) || no_default.count(m[1])) continue;
      ++with_value;
      EXPECT_NE(m[3].str().find('='), std::string::npos) << cmd << ": " << line;
    }
    if (!cmd.empty()) EXPECT_GT(with_value, 3) << r.output;
  }
  const auto train = perftrain::train::default_config(true), cpu = perftrain::train::default_config(false);
  const auto r = run("train --help");
  EXPECT_NE(r.output.find("--steps INT=" + std::to_string(train.optim.steps) + " (GPU), " +
                          std::to_string(cpu.optim.steps) + " (CPU)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--graph TEXT:{on,off}=on"), std::string::npos) << r.output;
  EXPECT_NE(run("sample --help").output.find("--per-class INT:POSITIVE=8"), std::string::npos);
}

// The bytes torch.save starts its zip file with (a local file header).
const std::string kTorchZip("PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                            "\x00\x00\x00\x00\x00\x00\x10\x00\x12\x00" "archive/data.pklFB", 48);

TEST(Cli, TorchCheckpointGivenAsWeightsSaysHowToConvert) {
  TempDir tmp;
  perftrain::testing::write_raw(tmp.file("model.pt"), kTorchZip + std::string(100, '\0'));
  expect_error("sample --ckpt " + tmp.file("model.pt"), 2, "model.pt: a PyTorch checkpoint");
  expect_error("sample --ckpt " + tmp.file("model.pt"), 2, "safetensors.torch import save_file");
  // A run whose weights were replaced: --resume says the same.
  tmp.mkdir("r");
  tmp.mkdir("r/ckpt");
  tmp.mkdir("r/ckpt/step_00000001");
  perftrain::testing::write_raw(tmp.file("r/ckpt/step_00000001/model.safetensors"), kTorchZip + std::string(100, '\0'));
  perftrain::testing::write_raw(tmp.file("r/ckpt/step_00000001/trainer_state.safetensors"), "");
  expect_error("train --resume " + tmp.file("r/ckpt/step_00000001"), 2, "a PyTorch checkpoint");
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

// A relative --data-path is stored absolute, so a run resumes from any
// directory.
TEST(Cli, DataPathIsStoredAbsoluteAndResumeWorksFromElsewhere) {
  TempDir tmp;
  tmp.mkdir("work");
  tmp.mkdir("work/shards");
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  perftrain::io::save_safetensors(tmp.file("work/shards/s.safetensors"),
                                  {{"latents", at::randn({8, 1, 32, 32}, opts)},
                                   {"labels", at::arange(8, opts.dtype(at::kLong)).remainder(2)}});
  auto r = perftrain::testing::run_shell("cd " + tmp.file("work") + " && " + PERFTRAIN_BINARY +
                                         " config --data latents --data-path ./shards");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(toml_value(r.output, "path"), tmp.file("work/shards")) << r.output;

  r = perftrain::testing::run_shell("cd " + tmp.file("work") + " && " + PERFTRAIN_BINARY +
                                    " train --data latents --data-path shards --steps 2 --batch-size 4 --run-name r"
                                    " --runs-dir ../runs" + kTiny);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(toml_value(perftrain::testing::read_raw(tmp.file("runs/r/config.toml")), "path"), tmp.file("work/shards"));
  r = run("train --resume " + tmp.file("runs/r") + " --steps 3");  // from the test's directory
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("done: steps 3-3"), std::string::npos) << r.output;
}

// Weights without the config in their metadata (converted from PyTorch,
// or written by another tool) sample with the run's config.toml given as
// --config, which the error names; --set goes over it.
TEST(Cli, SampleTakesConfigAndSetForWeightsWithoutMetadata) {
  TempDir tmp;
  auto r = run("train --data synthetic --set data.synthetic_size=16 --steps 1 --batch-size 2 --run-name r --runs-dir " +
               tmp.path() + kTiny);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string step = tmp.file("r/ckpt/") + perftrain::testing::read_raw(tmp.file("r/ckpt/latest"));
  const auto file = perftrain::io::SafetensorsFile::open(step.substr(0, step.find_last_not_of("\n") + 1) +
                                                         "/ema.safetensors");
  perftrain::io::NamedTensors tensors;
  for (const auto& name : file.names()) tensors.emplace_back(name, file.get(name));
  perftrain::io::save_safetensors(tmp.file("bare.safetensors"), tensors);  // no metadata

  const std::string sample = "sample --ckpt " + tmp.file("bare.safetensors") + " --per-class 1 --classes 2 --steps 1";
  expect_error(sample + " --out " + tmp.file("a.png"), 2, "pass --config");
  r = run(sample + " --config " + tmp.file("r/config.toml") + " --set diffusion.cfg_scale=1.5 --out " +
          tmp.file("b.png"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("guidance 1.5"), std::string::npos) << r.output;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("b.png")).substr(1, 3), "PNG");
  r = run(sample + " --config " + tmp.file("r/config.toml") + " --set model.depth=3 --out " + tmp.file("c.png"));
  EXPECT_TRUE(r.code == 1 || r.code == 2) << "weights of another shape: an error, not a crash\n" << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  expect_error(sample + " --config " + tmp.file("r/config.toml") + " --cfg-scale nan", 2,
               "--cfg-scale: nan is not a finite number");
}

// The quickstart's "newest run" recipe picks the newest training run, not a
// bench or profile directory written after it (they write under runs/ too).
TEST(Cli, QuickstartNewestRunRecipePicksATrainingRun) {
  const std::string guide = perftrain::testing::read_raw(std::string(PERFTRAIN_SOURCE_DIR) + "/docs/guide/quickstart.md");
  std::string recipe;
  std::istringstream lines(guide);
  for (std::string line; std::getline(lines, line);)
    if (line.find("# the newest run") != std::string::npos && line.rfind("run=", 0) == 0) recipe = line;
  ASSERT_FALSE(recipe.empty()) << "no shell line ending in '# the newest run' in quickstart.md";
  TempDir tmp;
  auto r = perftrain::testing::run_shell("cd " + tmp.path() + " && " + PERFTRAIN_BINARY +
                                         " train --data synthetic --set data.synthetic_size=16 --steps 1"
                                         " --batch-size 2 --run-name trained" + kTiny);
  ASSERT_EQ(r.code, 0) << r.output;
  r = perftrain::testing::run_shell("sleep 1; cd " + tmp.path() + " && " + PERFTRAIN_BINARY +
                                    " bench --device cpu --model DiT-T/4 --batch-size 2 --steps 1 --warmup 1"
                                    " --variants eager-fp32");  // into runs/bench-DiT-T-4-<date>
  ASSERT_EQ(r.code, 0) << r.output;
  r = perftrain::testing::run_shell("cd " + tmp.path() + "\n" + recipe + "\necho \"[$run]\"");  // it ends in a comment
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[runs/trained]"), std::string::npos) << recipe << "\n" << r.output;
}

}  // namespace
