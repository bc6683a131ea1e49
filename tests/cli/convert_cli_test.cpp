// perftrain convert and train --init-from as a user runs them: a refused
// .pt is one line, exit 2 and nothing written; a run's weights start a new
// run with another class count, and export to a diffusers directory that a
// second export replaces but a directory of other files does not take.
#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"
#include "support/torch_files.h"

namespace {

using perftrain::testing::contains;
using perftrain::testing::TempDir;

perftrain::testing::CommandResult run(const std::string& args) {
  return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args);
}

// Exit 2 and one line containing `part`.
void expect_usage_error(const perftrain::testing::CommandResult& r, const std::string& part) {
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, part)) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

TEST(ConvertCli, RefusedPickleIsOneLineAndWritesNothing) {
  TempDir tmp;
  const std::string files = perftrain::testing::torch_files_dir();
  expect_usage_error(run("convert " + files + "/system.pt --out " + tmp.file("w.safetensors")),
                     "the pickle names the global 'posix.system'");
  expect_usage_error(run("convert " + files + "/legacy.pt --out " + tmp.file("w.safetensors")), "legacy (non-zip) format");
  expect_usage_error(run("convert " + files + "/state_dict.pt --out " + tmp.file("no/w.safetensors")),
                     "--out " + tmp.file("no/w.safetensors") + ": " + tmp.file("no") + " is not a directory");
  expect_usage_error(run("convert " + files + "/state_dict.pt --out " + tmp.file("w.safetensors")),
                     "no tensor 'x_embedder.proj.weight', so not a DiT state dict");
  EXPECT_TRUE(tmp.entries().empty());
  EXPECT_FALSE(perftrain::fs::exists(perftrain::testing::system_pt_marker()));
}

TEST(ConvertCli, InitFromStartsANewRunWithAnotherClassCountAndExportsToDiffusers) {
  TempDir tmp;
  const std::string base = "train --device cpu --steps 2 --runs-dir " + tmp.path() +
                           " --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.patch=8"
                           " --set log.sample_per_class=1 --set diffusion.sample_steps=1 --set log.sample_classes=2";
  auto r = run(base + " --run-name a");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_usage_error(run(base + " --run-name b --init-from " + tmp.file("a") + " --resume " + tmp.file("a")),
                     "--init-from and --resume cannot go together");
  r = run(base + " --run-name b --init-from " + tmp.file("a") + " --set model.num_classes=12");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "initialised from " + tmp.file("a/ckpt/step_00000002/ema.safetensors") +
                                     " (the EMA weights of " + tmp.file("a") + "): loaded "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "re-initialised y_embedder.embedding_table.weight ([11, 32] in the weights, [13, 32] here"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "done: steps 1-2")) << r.output;  // a new run from step 0
  // Another width is an error naming the tensor, and leaves no run behind.
  r = run(base + " --run-name c --init-from " + tmp.file("a") + " --set model.hidden=64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "of another shape (first 'x_embedder.proj.weight')")) << r.output;
  EXPECT_FALSE(perftrain::testing::run_command("test -e " + tmp.file("c")) == 0);

  r = run("convert " + tmp.file("b") + " --to diffusers --out " + tmp.file("hf"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(from the file's config)")) << r.output;
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.file("hf/config.json")), "\"num_embeds_ada_norm\": 12"));
  r = run("convert " + tmp.file("b") + " --to diffusers --out " + tmp.file("hf"));  // replaces its own export
  ASSERT_EQ(r.code, 0) << r.output;
  perftrain::testing::write_raw(tmp.file("hf/notes.txt"), "mine");
  expect_usage_error(run("convert " + tmp.file("b") + " --to diffusers --out " + tmp.file("hf")),
                     tmp.file("hf") + " exists and holds other things than the files written here");
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("hf/notes.txt")), "mine");
}

}  // namespace
