#include <gtest/gtest.h>
#include <sys/stat.h>

#include <vector>

#include "base/error.h"
#include "data/dataset.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

constexpr const char* kDebianDir = "/usr/share/datasets/fashion-mnist";

bool have_debian_files() {
  struct stat st {};
  return ::stat((std::string(kDebianDir) + "/train-images-idx3-ubyte.gz").c_str(), &st) == 0;
}

// Checks a few hundred samples spread over the set: shape, range, padding, labels.
void check_samples(const Dataset& ds) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < ds.size(); i += ds.size() / 257) idx.push_back(i);
  idx.push_back(ds.size() - 1);
  const int64_t n = static_cast<int64_t>(idx.size());
  std::vector<float> x(n * 32 * 32);
  std::vector<int64_t> y(n);
  ds.gather(idx.data(), n, x.data(), y.data());
  bool some_bright = false;
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_GE(y[k], 0);
    EXPECT_LT(y[k], 10);
    for (int r = 0; r < 32; ++r) {
      for (int c = 0; c < 32; ++c) {
        const float v = x[k * 1024 + r * 32 + c];
        ASSERT_GE(v, -1.0f);
        ASSERT_LE(v, 1.0f);
        if (r < 2 || r >= 30 || c < 2 || c >= 30) ASSERT_EQ(v, -1.0f) << "padding at " << r << "," << c;
        some_bright |= v > 0.5f;
      }
    }
  }
  EXPECT_TRUE(some_bright);
}

TEST(FashionMnist, DebianFiles) {
  if (!have_debian_files()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist to run this";
  const auto train = open_fashion_mnist(kDebianDir, true);
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->sample_shape(), (std::array<int64_t, 3>{1, 32, 32}));
  EXPECT_EQ(train->num_classes(), 10);
  check_samples(*train);
  const auto test = open_fashion_mnist(kDebianDir, false);
  EXPECT_EQ(test->size(), 10000);
  check_samples(*test);
  EXPECT_NE(train->describe().find("60000"), std::string::npos);
}

std::string idx(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(d >> s));
  return out + data;
}

// A two-image set: image 0 all 0 except pixel (0, 0) = 255, image 1 all 255.
void write_tiny(const TempDir& dir, const std::string& prefix, const std::string& labels) {
  std::string pixels(2 * 784, '\0');
  pixels[0] = static_cast<char>(255);
  std::fill(pixels.begin() + 784, pixels.end(), static_cast<char>(255));
  write_raw(dir.file(prefix + "-images-idx3-ubyte"), idx({2, 28, 28}, pixels));
  write_raw(dir.file(prefix + "-labels-idx1-ubyte"), idx({static_cast<uint32_t>(labels.size())}, labels));
}

TEST(FashionMnist, UncompressedFilesAndScaling) {
  TempDir dir;
  write_tiny(dir, "t10k", std::string("\x03\x09", 2));
  const auto ds = open_fashion_mnist(dir.path(), false);
  ASSERT_EQ(ds->size(), 2);
  const int64_t idx[2] = {1, 0};
  std::vector<float> x(2 * 1024);
  int64_t y[2];
  ds->gather(idx, 2, x.data(), y);
  EXPECT_EQ(y[0], 9);
  EXPECT_EQ(y[1], 3);
  EXPECT_EQ(x[0], -1.0f);                 // padding
  EXPECT_EQ(x[2 * 32 + 2], 1.0f);         // image 1, first real pixel
  EXPECT_EQ(x[1024 + 2 * 32 + 2], 1.0f);  // image 0, pixel (0, 0)
  EXPECT_EQ(x[1024 + 2 * 32 + 3], -1.0f);
}

TEST(FashionMnist, MissingFilesSayHowToGetThem) {
  TempDir dir;
  std::string msg = error_of<UsageError>([&] { open_fashion_mnist(dir.file("nope")); });
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  write_tiny(dir, "train", std::string("\x01\x02", 2));
  msg = error_of<UsageError>([&] { open_fashion_mnist(dir.path(), false); });  // no t10k files
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST(FashionMnist, CountMismatchAndBadLabels) {
  TempDir dir;
  write_tiny(dir, "train", std::string("\x01\x02\x03", 3));
  std::string msg = error_of<RuntimeError>([&] { open_fashion_mnist(dir.path()); });
  EXPECT_NE(msg.find(dir.file("train-labels-idx1-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 labels"), std::string::npos) << msg;
  write_tiny(dir, "train", std::string("\x01\x0c", 2));
  msg = error_of<RuntimeError>([&] { open_fashion_mnist(dir.path()); });
  EXPECT_NE(msg.find("label 12 at byte 9"), std::string::npos) << msg;
  write_raw(dir.file("train-images-idx3-ubyte"), idx({2, 28, 27}, std::string(2 * 28 * 27, '\0')));
  msg = error_of<RuntimeError>([&] { open_fashion_mnist(dir.path()); });
  EXPECT_NE(msg.find("[2, 28, 27]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::data
