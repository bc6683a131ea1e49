// perftrain train on image inputs as a user runs it: a bad folder, shard or
// image stops with one line naming it (exit 2 before anything is written,
// or 1 for an image found corrupt while training), and --image-size sets
// the crop.
#include <gtest/gtest.h>

#include <string>

#include "support/image_files.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;

perftrain::testing::CommandResult train(const TempDir& tmp, const std::string& path, const std::string& more = "") {
  return perftrain::testing::run_shell(
      std::string(PERFTRAIN_BINARY) + " train --device cpu --runs-dir " + tmp.file("runs") + " --run-name r" +
      " --data images --data-path '" + path + "' --image-size 8 --set model.in_channels=3" +
      " --set model.num_classes=3 --set model.depth=1 --set model.hidden=32 --set model.heads=2" +
      " --set model.patch=4 --batch-size 4 --steps 2 --set log.sample_every=0 --set data.workers=2" + more);
}

void expect_one_line_error(const perftrain::testing::CommandResult& r, int code, const std::string& part) {
  EXPECT_EQ(r.code, code) << r.output;
  EXPECT_NE(r.output.find(part), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
}

TEST(ImageCli, BadFoldersAndShardsStopBeforeWritingARun) {
  TempDir tmp;
  tmp.mkdir("empty");
  expect_one_line_error(train(tmp, tmp.file("empty")), 2, tmp.file("empty") + " has no class sub-folders");
  perftrain::testing::write_raw(tmp.file("nocls.tar"),
                                perftrain::testing::tar_member("k1.png", "x") + perftrain::testing::tar_end());
  expect_one_line_error(train(tmp, tmp.file("nocls.tar")), 2, tmp.file("nocls.tar") + ": sample 'k1' has no .cls");
  expect_one_line_error(train(tmp, tmp.file("missing-{0..3}.tar")), 2, tmp.file("missing-0.tar"));
  perftrain::testing::write_image_folder(tmp.file("imgs"), {"a", "b"}, 2);
  expect_one_line_error(train(tmp, tmp.file("imgs"), " --set model.in_channels=1"), 2, "model.in_channels");
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("runs/r")));
}

TEST(ImageCli, CorruptImageStopsTheRunNamingTheFile) {
  TempDir tmp;
  perftrain::testing::write_image_folder(tmp.file("imgs"), {"a", "b"}, 2);
  perftrain::testing::write_raw(tmp.file("imgs/b/0.png"), "garbage");
  expect_one_line_error(train(tmp, tmp.file("imgs")), 1, tmp.file("imgs/b/0.png"));
}

TEST(ImageCli, TrainsAndRecordsTheKeys) {
  TempDir tmp;
  perftrain::testing::write_image_folder(tmp.file("imgs"), {"a", "b", "c"}, 2);
  const auto r = train(tmp, tmp.file("imgs"));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string cfg = perftrain::testing::read_raw(tmp.file("runs/r/config.toml"));
  for (const char* line : {"source = 'images'", "workers = 2", "flip = true", "image_size = 8"})
    EXPECT_NE(cfg.find(line), std::string::npos) << line << "\n" << cfg;
}

}  // namespace
