#include "io/png.h"

#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "support/test_support.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb_image.h>

namespace perftrain::io {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;

struct Decoded {
  int w = 0, h = 0, c = 0;
  std::vector<uint8_t> px;
  uint8_t at(int x, int y, int ch) const { return px[(y * w + x) * c + ch]; }
};

Decoded decode(const std::string& path) {
  Decoded d;
  uint8_t* p = stbi_load(path.c_str(), &d.w, &d.h, &d.c, 0);
  if (p == nullptr) throw std::runtime_error("cannot decode " + path);
  d.px.assign(p, p + d.w * d.h * d.c);
  stbi_image_free(p);
  return d;
}

// Value of image i, channel ch, pixel (x, y): distinct per image and
// position, covering [-1, 1] (the grid maps v to round((v + 1) * 127.5)).
float value(int i, int ch, int x, int y) { return -1.0f + ((i * 37 + ch * 11 + y * 5 + x) % 51) / 25.0f; }
uint8_t expected(float v) { return static_cast<uint8_t>(std::floor((v + 1.0f) * 127.5f + 0.5f)); }

TEST(Png, GridLayoutAndPixels) {
  const int n = 5, c = 3, h = 4, w = 6, nrow = 3;
  at::Tensor images = at::full({n, c, h, w}, 0.0f);
  float* p = images.data_ptr<float>();
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) p[((i * c + ch) * h + y) * w + x] = value(i, ch, x, y);
  TempDir dir;
  const std::string path = dir.file("grid.png");
  save_png_grid(path, images, nrow);
  const Decoded d = decode(path);
  ASSERT_EQ(d.w, nrow * (w + 2) + 2);  // 3 columns
  ASSERT_EQ(d.h, 2 * (h + 2) + 2);     // 2 rows, the last one partly empty
  ASSERT_EQ(d.c, 3);
  std::vector<bool> inside(d.w * d.h, false);
  for (int i = 0; i < n; ++i) {
    const int x0 = 2 + (i % nrow) * (w + 2), y0 = 2 + (i / nrow) * (h + 2);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        inside[(y0 + y) * d.w + x0 + x] = true;
        for (int ch = 0; ch < c; ++ch) {
          ASSERT_EQ(d.at(x0 + x, y0 + y, ch), expected(value(i, ch, x, y))) << i << " " << ch << " " << x << " " << y;
        }
      }
  }
  for (int y = 0; y < d.h; ++y)  // padding and the empty slot are black
    for (int x = 0; x < d.w; ++x)
      if (!inside[y * d.w + x])
        for (int ch = 0; ch < c; ++ch) ASSERT_EQ(d.at(x, y, ch), 0) << x << " " << y;
}

TEST(Png, GrayClampsAndNaN) {
  at::Tensor images = at::full({2, 1, 1, 2}, 0.0f);
  float* p = images.data_ptr<float>();
  p[0] = 5.0f;
  p[1] = -7.0f;
  p[2] = std::numeric_limits<float>::quiet_NaN();
  p[3] = 1.0f;
  TempDir dir;
  save_png_grid(dir.file("g.png"), images.to(at::kHalf), 1);  // one per row: 2 rows
  const Decoded d = decode(dir.file("g.png"));
  ASSERT_EQ(d.c, 1);
  ASSERT_EQ(d.w, 2 + 2 + 2);
  ASSERT_EQ(d.h, 2 * (1 + 2) + 2);
  EXPECT_EQ(d.at(2, 2, 0), 255);
  EXPECT_EQ(d.at(3, 2, 0), 0);
  EXPECT_EQ(d.at(2, 5, 0), 0);
  EXPECT_EQ(d.at(3, 5, 0), 255);
}

TEST(Png, SavePngRoundTrip) {
  std::vector<uint8_t> rgba(3 * 2 * 4);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i * 10);
  TempDir dir;
  save_png(dir.file("a.png"), rgba.data(), 3, 2, 4);
  const Decoded d = decode(dir.file("a.png"));
  ASSERT_EQ(d.w, 3);
  ASSERT_EQ(d.h, 2);
  ASSERT_EQ(d.c, 4);
  EXPECT_EQ(d.px, rgba);
}

TEST(Png, BadInputIsAUsageError) {
  TempDir dir;
  const std::string path = dir.file("x.png");
  EXPECT_NE(error_of<UsageError>([&] { save_png_grid(path, at::full({2, 2, 4, 4}, 0.0f), 2); }).find(path),
            std::string::npos);
  error_of<UsageError>([&] { save_png_grid(path, at::full({4, 4}, 0.0f), 2); });
  error_of<UsageError>([&] { save_png_grid(path, at::full({1, 3, 4, 4}, 0.0f), 0); });
  error_of<UsageError>([&] { save_png_grid(path, at::full({0, 3, 4, 4}, 0.0f), 1); });
  uint8_t px[4] = {};
  error_of<UsageError>([&] { save_png(path, px, 0, 1, 1); });
  error_of<UsageError>([&] { save_png(path, px, 1, 1, 5); });
  EXPECT_TRUE(dir.entries().empty());
  error_of<RuntimeError>([&] { save_png(dir.file("no/dir.png"), px, 1, 1, 1); });
}

}  // namespace
}  // namespace perftrain::io
