// The image inputs through the batch loader: open_images' samples, the
// loader's workers (the same batches for any count) and its flip
// (deterministic per seed and stream position, so a resume replays it).
#include <ATen/ops/equal.h>
#include <ATen/ops/flip.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "data/adm_crop.h"
#include "data/batch_loader.h"
#include "data/dataset.h"
#include "data/image_file.h"
#include "support/image_files.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

// Three classes of `per_class` PNGs each.
std::string make_folder(const TempDir& dir, int per_class) {
  perftrain::testing::write_image_folder(dir.file("imgs"), {"cat", "dog", "emu"}, per_class);
  return dir.file("imgs");
}

std::vector<Batch> take(BatchLoader& loader, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(loader.next());
  return out;
}

void expect_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].x.equal(b[i].x)) << "batch " << i;
    EXPECT_TRUE(a[i].y.equal(b[i].y)) << "batch " << i;
  }
}

TEST(ImageDataset, SamplesAreTheCropScaledToPlusMinusOne) {
  TempDir dir;
  const std::string root = make_folder(dir, 2);
  const auto ds = open_images(root, 8);
  EXPECT_EQ(ds->size(), 6);
  EXPECT_EQ(ds->sample_shape(), (std::array<int64_t, 3>{3, 8, 8}));
  EXPECT_EQ(ds->num_classes(), 3);
  EXPECT_NE(ds->describe().find("image folder " + root), std::string::npos) << ds->describe();
  std::vector<float> x(3 * 64);
  int64_t y = -1;
  const int64_t i = 3;  // dog/1.png
  ds->gather(&i, 1, x.data(), &y);
  EXPECT_EQ(y, 1);
  const at::Tensor crop = adm_center_crop(read_image_file(root + "/dog/1.png"), 8);
  for (int64_t k = 0; k < 64; ++k)
    for (int64_t c = 0; c < 3; ++c)
      ASSERT_EQ(x[c * 64 + k], (crop.data_ptr<uint8_t>()[k * 3 + c] / 255.0f - 0.5f) / 0.5f) << k << " " << c;
}

// Decoding on 1 or 4 threads gives the same batches (and so does a batch
// smaller than the worker count), across an epoch boundary.
TEST(ImageLoader, WorkersOneAndFourGiveTheSameBatches) {
  TempDir dir;
  const auto ds = open_images(make_folder(dir, 5), 6);
  for (const bool flip : {false, true}) {
    BatchLoader one(*ds, 4, 9, {}, false, 2, {}, LoaderOptions{1, flip});
    BatchLoader four(*ds, 4, 9, {}, false, 2, {}, LoaderOptions{4, flip});
    BatchLoader five(*ds, 4, 9, {}, false, 2, {}, LoaderOptions{5, flip});
    const auto a = take(one, 6);
    expect_same(a, take(four, 6));
    expect_same(a, take(five, 6));
  }
}

// Each flipped row is its unflipped row mirrored left-right, exactly where
// sample_flipped says, about half of them; another seed flips others; a
// loader resumed at a position replays the flips of the uninterrupted one.
TEST(ImageLoader, FlipIsDeterministicPerSeedAndPosition) {
  TempDir dir;
  const auto ds = open_images(make_folder(dir, 4), 6);  // 12 images
  BatchLoader plain(*ds, 5, 3, {}, false, 2, {}, LoaderOptions{2, false});
  BatchLoader flip(*ds, 5, 3, {}, false, 2, {}, LoaderOptions{2, true});
  int flipped = 0, rows = 0;
  LoaderPosition pos;
  const int64_t n = ds->size();
  for (int b = 0; b < 8; ++b) {
    const Batch p = plain.next(), f = flip.next();
    ASSERT_TRUE(p.y.equal(f.y));
    for (int64_t r = 0; r < 5; ++r, ++rows) {
      const bool drawn = sample_flipped(3, pos.epoch, pos.index);
      const at::Tensor want = drawn ? p.x[r].flip({2}) : p.x[r];
      EXPECT_TRUE(f.x[r].equal(want)) << "batch " << b << " row " << r;
      flipped += drawn;
      if (++pos.index == n) pos = {pos.epoch + 1, 0};
    }
  }
  EXPECT_GT(flipped, rows / 4);
  EXPECT_LT(flipped, rows * 3 / 4);
  // The same seed flips the same samples; resuming at batch 3's position replays batches 3..5.
  BatchLoader again(*ds, 5, 3, {}, false, 2, {}, LoaderOptions{1, true});
  const auto first = take(again, 6);
  BatchLoader head(*ds, 5, 3, {}, false, 2, {}, LoaderOptions{3, true});
  take(head, 3);
  BatchLoader resumed(*ds, 5, 3, head.position(), false, 2, {}, LoaderOptions{4, true});
  expect_same(std::vector<Batch>(first.begin() + 3, first.end()), take(resumed, 3));
  // Another seed: another order and other flips, but still a mirror of an unflipped sample.
  int other = 0;
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t i = 0; i < n; ++i) other += sample_flipped(3, e, i) != sample_flipped(4, e, i);
  EXPECT_GT(other, 0);
}

TEST(ImageLoader, SampleFlippedIsTheDocumentedHash) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (uint64_t seed : {0ull, 7ull})
    for (int64_t e : {0, 3})
      for (int64_t i : {0, 1, 1000})
        EXPECT_EQ(sample_flipped(seed, e, i),
                  (mix(mix(mix(seed ^ 0xF11F11F11F11F11Full) ^ uint64_t(e)) ^ uint64_t(i)) >> 63) != 0);
}

// A corrupt image read by any worker ends the stream with an error naming it,
// after the batches made before.
TEST(ImageLoader, CorruptImageOnAWorkerNamesTheFile) {
  TempDir dir;
  const std::string root = make_folder(dir, 3);
  write_raw(root + "/emu/9.png", "not a png");
  const auto ds = open_images(root, 6);
  BatchLoader loader(*ds, 10, 1, {}, false, 1, {}, LoaderOptions{4, true});
  std::string e;
  for (int i = 0; i < 3 && e.empty(); ++i) {
    try {
      loader.next();
    } catch (const RuntimeError& err) {
      e = err.what();
    }
  }
  EXPECT_NE(e.find(root + "/emu/9.png"), std::string::npos) << e;
  EXPECT_NE(error_of<UsageError>([&] { BatchLoader l(*ds, 4, 0, {}, false, 2, {}, LoaderOptions{0, false}); })
                .find("workers"),
            std::string::npos);
}

}  // namespace
}  // namespace perftrain::data
