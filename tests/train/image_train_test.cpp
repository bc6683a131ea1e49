// Pixel-space training on image inputs (data.source = images): a folder of
// generated PNGs and the same images as tar shards train a tiny DiT on the
// CPU, with workers and flip on, and a resumed run is bit-identical to an
// uninterrupted one (the flips replay from the data position).
#include <gtest/gtest.h>

#include <sstream>

#include "base/error.h"
#include "support/image_files.h"
#include "support/run_checks.h"
#include "support/test_support.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::TempDir;

TrainConfig tiny_images(const std::string& path, const std::string& runs, const std::string& name, int64_t steps) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=4", "model.image_size=8",
                        "model.in_channels=3", "model.num_classes=3", "data.source=images", "data.workers=3",
                        "train.batch_size=4", "train.device=cpu", "log.every=2", "log.checkpoint_every=3",
                        "log.sample_every=0", "log.tensorboard=false"})
    apply_override(c, o);
  c.data.path = path;
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

TEST(ImageTrain, ResumedRunOnAnImageFolderIsBitIdentical) {
  TempDir tmp;
  const std::string folder = tmp.file("imgs");
  perftrain::testing::write_image_folder(folder, {"a", "b", "c"}, 3);  // 9 images: batches straddle epochs
  std::ostringstream log;
  perftrain::testing::expect_resume_bit_identical(
      [&](const std::string& name, int64_t steps) { return tiny_images(folder, tmp.path(), name, steps); }, tmp.path(),
      3, log);
  EXPECT_NE(log.str().find("image folder " + folder), std::string::npos) << log.str();
}

TEST(ImageTrain, TrainsOnTarShards) {
  TempDir tmp;
  using perftrain::testing::tar_member;
  for (int s = 0; s < 2; ++s) {
    std::string tar;
    for (int k = 0; k < 3; ++k) {
      perftrain::testing::write_pattern_png(tmp.file("x.png"), 11 + k, 9 + 2 * s, 3, s * 3 + k);
      const std::string key = "s" + std::to_string(s) + "_" + std::to_string(k);
      tar += tar_member(key + ".png", perftrain::testing::read_raw(tmp.file("x.png"))) +
             tar_member(key + ".cls", std::to_string(k));
    }
    perftrain::testing::write_raw(tmp.file("shard-0" + std::to_string(s) + ".tar"), tar + perftrain::testing::tar_end());
  }
  std::ostringstream log;
  const auto r = run_training(tiny_images(tmp.file("shard-{00..01}.tar"), tmp.path(), "tar", 2), {}, log);
  EXPECT_EQ(r.last_step, 2);
  EXPECT_NE(log.str().find("2 tar shards"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace perftrain::train
