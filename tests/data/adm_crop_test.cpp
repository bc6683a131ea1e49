// data/adm_crop against Pillow itself: generated RGB images of odd sizes
// through guided-diffusion's center_crop_arr (as DiT's train.py runs it) and
// through Image.resize with BOX and BICUBIC, compared pixel for pixel.
#include "data/adm_crop.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "base/error.h"
#include "support/python_script.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::kPythonSkip;
using perftrain::testing::read_raw;
using perftrain::testing::run_python_script;
using perftrain::testing::TempDir;

// Each case: "<name> <op> <H> <W> <a> <b>": op crop (a = size) or box/bicubic
// (a x b = width x height); in_<name>.raw the input, out_<name>.raw PIL's.
const char* const kScript = R"PY(
import sys
try:
    import numpy as np
    from PIL import Image
except ImportError:
    sys.exit(77)

def center_crop_arr(pil_image, image_size):  # guided-diffusion's, as DiT's train.py uses it
    while min(*pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)
    scale = image_size / min(*pil_image.size)
    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size), resample=Image.BICUBIC)
    arr = np.array(pil_image)
    crop_y = (arr.shape[0] - image_size) // 2
    crop_x = (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[crop_y: crop_y + image_size, crop_x: crop_x + image_size])

out = sys.argv[1]
rng = np.random.default_rng(7)
cases = [("c1", "crop", 37, 53, 16, 0), ("c2", "crop", 301, 451, 64, 0), ("c3", "crop", 129, 67, 32, 0),
         ("c4", "crop", 513, 257, 63, 0), ("c5", "crop", 21, 45, 32, 0), ("c6", "crop", 64, 100, 64, 0),
         ("c7", "crop", 250, 333, 125, 0), ("c8", "crop", 99, 99, 17, 0),
         ("c9", "crop", 200, 45, 40, 0),
         ("r1", "box", 45, 67, 33, 22), ("r2", "bicubic", 45, 67, 101, 13), ("r3", "bicubic", 31, 29, 29, 60),
         ("r4", "bicubic", 31, 29, 7, 31), ("r5", "box", 30, 40, 40, 7)]
for name, op, h, w, a, b in cases:
    # Smooth ramps plus noise: edges where the bicubic lobes over- and undershoot.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) % 2) * 255], -1)
    img = np.clip(base + rng.integers(-40, 41, size=(h, w, 3)), 0, 255).astype(np.uint8)
    img.tofile(f"{out}/in_{name}.raw")
    pil = Image.fromarray(img)
    if op == "crop":
        res = center_crop_arr(pil, a)
    else:
        res = pil.resize((a, b), resample=Image.BOX if op == "box" else Image.BICUBIC)
    np.asarray(res).tofile(f"{out}/out_{name}.raw")
    print(name, op, h, w, a, b)
)PY";

at::Tensor raw_image(const std::string& path, int64_t h, int64_t w) {
  const std::string bytes = read_raw(path);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), h * w * 3) << path;
  at::Tensor t = at::empty({h, w, 3}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), std::min<size_t>(bytes.size(), t.nbytes()));
  return t;
}

TEST(AdmCrop, EqualsPillowOnOddSizes) {
  TempDir dir;
  const auto r = run_python_script(dir, kScript, "'" + dir.path() + "'");
  if (r.code == kPythonSkip) GTEST_SKIP() << "numpy or Pillow not installed";
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string name, op;
  int64_t h = 0, w = 0, a = 0, b = 0;
  int cases = 0;
  while (lines >> name >> op >> h >> w >> a >> b) {
    ++cases;
    const at::Tensor in = raw_image(dir.file("in_" + name + ".raw"), h, w);
    at::Tensor mine;
    int64_t oh = b, ow = a;
    if (op == "crop") {
      mine = adm_center_crop(in, a);
      oh = ow = a;
    } else {
      mine = pil_resize(in, a, b, op == "box" ? PilFilter::kBox : PilFilter::kBicubic);
    }
    const at::Tensor pil = raw_image(dir.file("out_" + name + ".raw"), oh, ow);
    ASSERT_EQ(mine.sizes(), pil.sizes()) << name;
    const int max_diff = mine.to(at::kInt).sub(pil.to(at::kInt)).abs().max().item<int>();
    // The brief allows 1; the fixed point is Pillow's, so expect equality.
    EXPECT_EQ(max_diff, 0) << name << " (" << op << " " << h << "x" << w << " -> " << a << ", " << b << ")";
  }
  EXPECT_EQ(cases, 14) << r.output;
}

TEST(AdmCrop, KeepsChannelsAndTakesViews) {
  const at::Tensor img = at::arange(40 * 30 * 1, at::kInt).remainder(251).to(at::kByte).reshape({40, 30, 1});
  EXPECT_EQ(adm_center_crop(img, 8).sizes(), (std::vector<int64_t>{8, 8, 1}));
  // A transposed view gives what its contiguous copy gives.
  const at::Tensor rgb = at::arange(20 * 36 * 3, at::kInt).remainder(256).to(at::kByte).reshape({20, 36, 3});
  const at::Tensor view = rgb.transpose(0, 1);
  EXPECT_TRUE(adm_center_crop(view, 9).equal(adm_center_crop(view.contiguous(), 9)));
}

TEST(AdmCrop, BadInputsAreUsageErrors) {
  const at::Tensor rgb = at::empty({4, 4, 3}, at::kByte);
  EXPECT_NE(error_of<UsageError>([&] { adm_center_crop(rgb, 0); }).find("crop size"), std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adm_center_crop(rgb.to(at::kFloat), 2); }).find("uint8"), std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adm_center_crop(at::empty({0, 4, 3}, at::kByte), 2); }).find("empty"),
            std::string::npos);
}

}  // namespace
}  // namespace perftrain::data
