// bench/reference_train.py (the plain-PyTorch parity reference) takes the
// batches perftrain's training takes: the same rows in the same order, across
// epoch boundaries, with the same padding and scaling of the images.
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch_loader.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "support/test_support.h"
#include "train/config.h"

namespace perftrain::train {
namespace {

using perftrain::testing::run_shell;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

std::string idx(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(d >> s));
  return out + data;
}

// A Fashion-MNIST training set of n images with varied pixels and labels.
void write_fashion_mnist(const TempDir& dir, uint32_t n) {
  std::string pixels(n * 784, '\0'), labels(n, '\0');
  uint32_t z = 12345;
  for (char& p : pixels) p = static_cast<char>((z = z * 1103515245u + 12345u) >> 24);
  for (char& l : labels) l = static_cast<char>(((z = z * 1103515245u + 12345u) >> 16) % 10);
  write_raw(dir.file("train-images-idx3-ubyte"), idx({n, 28, 28}, pixels));
  write_raw(dir.file("train-labels-idx1-ubyte"), idx({n}, labels));
}

// 300 images, steps of 2 micro-batches of 64: the five steps read 640 rows, so
// the third crosses into the second epoch and the fifth into the third.
TEST(ReferenceTrain, TakesTheLoadersBatches) {
  TempDir dir;
  write_fashion_mnist(dir, 300);
  TrainConfig cfg = default_config(false);
  cfg.data.path = dir.path();
  cfg.optim.batch_size = 64;
  cfg.optim.accumulate = 2;
  cfg.optim.seed = 7;
  write_raw(dir.file("run.toml"), cfg.to_toml());
  const auto r = run_shell(std::string("'") + PERFTRAIN_PYTHON + "' '" + PERFTRAIN_SOURCE_DIR +
                           "/bench/reference_train.py' batches --config '" + dir.file("run.toml") +
                           "' --count 5 --out '" + dir.file("batches.safetensors") + "'");
  ASSERT_EQ(r.code, 0) << r.output;

  const auto file = io::SafetensorsFile::open(dir.file("batches.safetensors"));
  const at::Tensor x = file.get("x"), y = file.get("y");
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{640, 1, 32, 32}));
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{640}));
  const auto dataset = data::open_fashion_mnist(dir.path(), true);
  data::BatchLoader loader(*dataset, cfg.optim.step_batch(), cfg.optim.seed);
  for (int64_t step = 0; step < 5; ++step) {
    const data::Batch b = loader.next();
    EXPECT_TRUE(at::equal(b.y, y.narrow(0, step * 128, 128))) << "labels of step " << step + 1;
    EXPECT_TRUE(at::equal(b.x, x.narrow(0, step * 128, 128))) << "images of step " << step + 1;
  }
  EXPECT_EQ(loader.position().epoch, 2);
}

}  // namespace
}  // namespace perftrain::train
