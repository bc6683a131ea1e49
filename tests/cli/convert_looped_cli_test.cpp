// perftrain convert --to looped as a user runs it: a
// DiT's weights file in, a looped model's weights and config out that
// `perftrain sample` reads; the reconstruction table and the output check
// printed; a depth that does not add up is one line naming the key, with
// nothing written.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/fs.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "support/test_support.h"
#include "train/config.h"

namespace {

using perftrain::testing::TempDir;
using Result = perftrain::testing::CommandResult;

Result run(const std::string& args) { return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args); }

// The CPU default model (DiT-T/4 on 32x32 Fashion-MNIST, depth 6) at width 64 with random
// weights, saved as a weights file that carries its config.
std::string write_source(const TempDir& tmp) {
  perftrain::train::TrainConfig cfg = perftrain::train::default_config(false);
  cfg.model.hidden = 64;  // two heads of 32: quick on a loaded 2-core machine
  cfg.model.heads = 2;
  perftrain::models::DiT dit(cfg.model, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  dit.transform([&](const std::string& name, const at::Tensor& t) {
    return name == "pos_embed" ? t : at::randn(t.sizes(), gen) * 0.05;
  });
  const std::string path = tmp.file("dit.safetensors");
  perftrain::io::save_safetensors(path, dit.state(), {{"perftrain.config", cfg.to_toml()}});
  return path;
}

TEST(CliConvertLooped, FullRankConversionSamplesAndPrintsItsErrors) {
  TempDir tmp;
  const std::string src = write_source(tmp);
  const std::string out = tmp.file("looped");
  auto r = run("convert " + src + " --to looped --out " + out +
               " --set model.prelude=1 --set model.coda=1 --set model.lora_rank=64"
               " --set model.lora_targets=attn,mlp,adaln");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("relative reconstruction error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blocks.4 loop 3"), std::string::npos) << r.output;
  const size_t at = r.output.find("||looped - source|| / ||source|| = ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_LT(std::atof(r.output.c_str() + at + 36), 1e-4) << r.output;
  ASSERT_TRUE(perftrain::fs::is_regular_file(out + "/model.safetensors"));
  const std::string toml = perftrain::testing::read_raw(out + "/config.toml");
  EXPECT_NE(toml.find("family = 'looped'"), std::string::npos) << toml;
  EXPECT_NE(toml.find("loops = 4"), std::string::npos) << toml;

  r = run("sample --ckpt " + out + "/model.safetensors --device cpu --steps 2 --classes 2 --per-class 1 --out " +
          tmp.file("grid.png"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(perftrain::fs::is_regular_file(tmp.file("grid.png")));
}

TEST(CliConvertLooped, LowRankToAFileSaysWhatItLoses) {
  TempDir tmp;
  const std::string src = write_source(tmp);
  auto r = run("convert " + src + " --to looped --out " + tmp.file("l.safetensors") + " --set model.lora_rank=4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("truncated SVD"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("adaLN_modulation.1.weight"), std::string::npos) << "adaln is not a default target";
  EXPECT_TRUE(perftrain::fs::is_regular_file(tmp.file("l.safetensors")));
}

TEST(CliConvertLooped, ADepthThatDoesNotAddUpIsOneLineAndWritesNothing) {
  TempDir tmp;
  const std::string src = write_source(tmp);
  auto r = run("convert " + src + " --to looped --out " + tmp.file("bad.safetensors") + " --set model.loops=3");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("model.loops"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("bad.safetensors")));
  r = run("convert " + src + " --to looped --out " + tmp.file("x") + " --shared layer:9");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--shared layer:9"), std::string::npos) << r.output;
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("x")));
}

// The looped options belong to --to looped: given to another target they are
// one line, and nothing is written.
TEST(CliConvertLooped, LoopedOptionsWithoutToLoopedAreOneLine) {
  TempDir tmp;
  const std::string src = write_source(tmp);
  auto r = run("convert " + src + " --out " + tmp.file("p.safetensors") + " --set model.loops=8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("options of --to looped"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("p.safetensors")));
}

}  // namespace
