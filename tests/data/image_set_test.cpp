// The image inputs' pieces: decoding (data/image_file), tar shards
// (data/tar_file) and the listing of an image folder or shard set
// (data/image_set), on files made here: PNGs by io's writer, JPEGs and a pax
// tar by Python (Pillow, tarfile), ustar shards by a writer in this file.
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "base/error.h"
#include "data/image_file.h"
#include "data/image_set.h"
#include "data/tar_file.h"
#include "support/image_files.h"
#include "support/python_script.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::tar_end;
using perftrain::testing::tar_member;
using perftrain::testing::kPythonSkip;
using perftrain::testing::read_raw;
using perftrain::testing::run_python_script;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

void png(const std::string& path, int w, int h, int channels, int seed) {
  perftrain::testing::write_pattern_png(path, w, h, channels, seed);
}

std::string png_bytes(const TempDir& dir, int w, int h, int channels, int seed) {
  png(dir.file("tmp.png"), w, h, channels, seed);
  return read_raw(dir.file("tmp.png"));
}

TEST(ImageFile, PngOfEachChannelCountBecomesRgb) {
  TempDir dir;
  for (int channels = 1; channels <= 4; ++channels) {
    png(dir.file("a.png"), 5, 3, channels, channels);
    const at::Tensor img = read_image_file(dir.file("a.png"));
    ASSERT_EQ(img.sizes(), (std::vector<int64_t>{3, 5, 3})) << channels;
    ASSERT_EQ(img.scalar_type(), at::kByte);
    const auto p = perftrain::testing::image_pattern(5, 3, channels, channels);
    const uint8_t* q = img.data_ptr<uint8_t>();
    for (int i = 0; i < 15; ++i)
      for (int c = 0; c < 3; ++c) {
        // Grey repeats into R, G and B; alpha is dropped.
        const int src = channels <= 2 ? i * channels : i * channels + c;
        ASSERT_EQ(q[i * 3 + c], p[src]) << "channels " << channels << " pixel " << i << " c " << c;
      }
  }
}

TEST(ImageFile, EmptyCorruptAndMissingFilesNameTheFile) {
  TempDir dir;
  write_raw(dir.file("empty.png"), "");
  std::string bytes = png_bytes(dir, 8, 8, 3, 1);
  write_raw(dir.file("cut.png"), bytes.substr(0, bytes.size() / 2));
  write_raw(dir.file("text.jpg"), "not an image at all");
  for (const char* name : {"empty.png", "cut.png", "text.jpg", "missing.png"}) {
    const std::string e = error_of<RuntimeError>([&] { read_image_file(dir.file(name)); });
    EXPECT_NE(e.find(dir.file(name)), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// A JPEG written by Pillow decodes to what Pillow decodes, up to the IDCT and
// chroma upsampling the two decoders do differently.
TEST(ImageFile, JpegFromPillowDecodesAsPillowDoes) {
  TempDir dir;
  const auto r = run_python_script(dir, R"PY(
import sys
try:
    import numpy as np
    from PIL import Image
except ImportError:
    sys.exit(77)
d = sys.argv[1]
y, x = np.mgrid[0:37, 0:53]
img = np.stack([x * 4, y * 6, (x + y) * 2], -1).clip(0, 255).astype(np.uint8)
Image.fromarray(img).save(d + "/a.jpg", quality=95)
Image.fromarray(img[:, :, 0]).save(d + "/grey.jpg", quality=95)
np.asarray(Image.open(d + "/a.jpg").convert("RGB")).tofile(d + "/a.raw")
np.asarray(Image.open(d + "/grey.jpg").convert("RGB")).tofile(d + "/grey.raw")
)PY", "'" + dir.path() + "'");
  if (r.code == kPythonSkip) GTEST_SKIP() << "numpy or Pillow not installed";
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* name : {"a", "grey"}) {
    const at::Tensor mine = read_image_file(dir.file(std::string(name) + ".jpg"));
    ASSERT_EQ(mine.sizes(), (std::vector<int64_t>{37, 53, 3}));
    const std::string pil = read_raw(dir.file(std::string(name) + ".raw"));
    ASSERT_EQ(pil.size(), static_cast<size_t>(mine.numel()));
    double total = 0;
    int worst = 0;
    for (int64_t i = 0; i < mine.numel(); ++i) {
      const int d = std::abs(int(mine.data_ptr<uint8_t>()[i]) - int(static_cast<uint8_t>(pil[i])));
      total += d;
      worst = std::max(worst, d);
    }
    EXPECT_LT(total / mine.numel(), 1.5) << name;
    EXPECT_LE(worst, 12) << name;
  }
}

TEST(TarFile, BracePatternsAsBraceexpand) {
  EXPECT_EQ(expand_braces("s-{000..002}.tar"), (std::vector<std::string>{"s-000.tar", "s-001.tar", "s-002.tar"}));
  EXPECT_EQ(expand_braces("s-{9..11}.tar"), (std::vector<std::string>{"s-9.tar", "s-10.tar", "s-11.tar"}));
  EXPECT_EQ(expand_braces("s-{2..0}.tar"), (std::vector<std::string>{"s-2.tar", "s-1.tar", "s-0.tar"}));
  EXPECT_EQ(expand_braces("{a,b}/{0..1}.tar::c.tar"),
            (std::vector<std::string>{"a/0.tar", "a/1.tar", "b/0.tar", "b/1.tar", "c.tar"}));
  EXPECT_EQ(expand_braces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_NE(error_of<UsageError>([] { expand_braces("s-{0..2.tar"); }).find("s-{0..2.tar"), std::string::npos);
  EXPECT_NE(error_of<UsageError>([] { expand_braces("s-0..2}.tar"); }).find("'}'"), std::string::npos);
}

// Python's tarfile in pax format: long member names in 'x' headers.
TEST(TarFile, ReadsPythonsPaxArchives) {
  TempDir dir;
  const auto r = run_python_script(dir, R"PY(
import io, sys, tarfile
with tarfile.open(sys.argv[1] + "/p.tar", "w", format=tarfile.PAX_FORMAT) as t:
    for name, data in [("d/" + "k" * 120 + ".cls", b"3"), ("short.txt", b"hello"), ("caf\u00e9.cls", b"1")]:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    d = tarfile.TarInfo("a_dir")
    d.type = tarfile.DIRTYPE
    t.addfile(d)
)PY", "'" + dir.path() + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto members = list_tar(dir.file("p.tar"));
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "d/" + std::string(120, 'k') + ".cls");
  EXPECT_EQ(members[1].name, "short.txt");
  EXPECT_EQ(members[2].name, "caf\xc3\xa9.cls");
  const auto bytes = read_tar_member(dir.file("p.tar"), members[1]);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "hello");
}

TEST(TarFile, BrokenArchivesNameTheFile) {
  TempDir dir;
  std::string good = tar_member("a.cls", "1") + tar_end();
  std::string bad_sum = good;
  bad_sum[0] = 'b';  // the name changes, the checksum does not
  write_raw(dir.file("sum.tar"), bad_sum);
  write_raw(dir.file("cut.tar"), tar_member("a.png", std::string(2000, 'x')).substr(0, 1500));
  for (const char* name : {"sum.tar", "cut.tar"}) {
    const std::string e = error_of<RuntimeError>([&] { list_tar(dir.file(name)); });
    EXPECT_NE(e.find(dir.file(name)), std::string::npos) << e;
  }
}

TEST(ImageSet, FolderAsTorchvisionsImageFolder) {
  TempDir dir;
  const std::string root = dir.file("imgs");
  for (const char* d : {"imgs", "imgs/b_cls", "imgs/a_cls", "imgs/a_cls/sub", "imgs/.hidden_cls", "imgs/a_cls/.git"})
    dir.mkdir(d);
  png(root + "/b_cls/2.png", 4, 4, 3, 1);
  png(root + "/b_cls/10.PNG", 4, 4, 3, 2);  // upper-case extension
  png(root + "/a_cls/z.png", 4, 4, 3, 3);
  png(root + "/a_cls/sub/a.png", 4, 4, 3, 4);
  png(root + "/a_cls/.x.png", 4, 4, 3, 5);      // hidden file
  png(root + "/a_cls/.git/c.png", 4, 4, 3, 5);  // hidden folder
  png(root + "/.hidden_cls/q.png", 4, 4, 3, 5);
  write_raw(root + "/a_cls/notes.txt", "not an image");
  png(root + "/top.png", 4, 4, 3, 5);  // outside any class: ignored, as torchvision does
  const ImageSet set = ImageSet::open(root);
  EXPECT_TRUE(set.is_folder());
  EXPECT_EQ(set.class_names(), (std::vector<std::string>{"a_cls", "b_cls"}));
  std::vector<std::string> got;
  std::vector<int64_t> labels;
  for (const ImageItem& it : set.items()) got.push_back(it.source.substr(root.size() + 1)), labels.push_back(it.label);
  // torchvision: sorted(os.walk(class)) -> "a_cls" before "a_cls/sub"; names sorted by bytes.
  EXPECT_EQ(got, (std::vector<std::string>{"a_cls/z.png", "a_cls/sub/a.png", "b_cls/10.PNG", "b_cls/2.png"}));
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 1, 1}));
  const auto p = perftrain::testing::image_pattern(4, 4, 3, 2);
  const at::Tensor img = set.read_rgb(2);
  EXPECT_EQ(std::memcmp(img.data_ptr<uint8_t>(), p.data(), p.size()), 0);
}

TEST(ImageSet, FolderErrorsNameTheFolderOrFile) {
  TempDir dir;
  dir.mkdir("empty");
  dir.mkdir("noimg");
  dir.mkdir("noimg/c");
  write_raw(dir.file("noimg/c/a.txt"), "x");
  dir.mkdir("webp");
  dir.mkdir("webp/c");
  write_raw(dir.file("webp/c/a.webp"), "x");
  EXPECT_NE(error_of<UsageError>([&] { ImageSet::open(dir.file("empty")); }).find(dir.file("empty") + " has no class"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { ImageSet::open(dir.file("noimg")); }).find(dir.file("noimg/c") + " holds no"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { ImageSet::open(dir.file("webp")); }).find(dir.file("webp/c/a.webp")),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { ImageSet::open(dir.file("nothing-{0..1}.tar")); }).find("nothing-0.tar"),
            std::string::npos);
  // A corrupt image is found when it is read, and named.
  dir.mkdir("bad");
  dir.mkdir("bad/c");
  write_raw(dir.file("bad/c/a.png"), "garbage");
  const ImageSet set = ImageSet::open(dir.file("bad"));
  EXPECT_NE(error_of<RuntimeError>([&] { set.read_rgb(0); }).find(dir.file("bad/c/a.png")), std::string::npos);
}

TEST(ImageSet, TarShardsByPattern) {
  TempDir dir;
  const std::string a = png_bytes(dir, 6, 5, 3, 11), b = png_bytes(dir, 3, 7, 1, 12), c = png_bytes(dir, 4, 4, 4, 13);
  write_raw(dir.file("s-00.tar"), tar_member("n1/x.png", a) + tar_member("n1/x.cls", "2\n") +
                                      tar_member("n1/x.json", "{}") + tar_member("._n1", "mac") +
                                      tar_member("y.cls", " 0 ") + tar_member("y.PNG", b) + tar_end());
  write_raw(dir.file("s-01.tar"), tar_member("z.png", c) + tar_member("z.seg.png", a) + tar_member("z.cls", "5") + tar_end());
  const ImageSet set = ImageSet::open(dir.file("s-{00..01}.tar"));
  EXPECT_FALSE(set.is_folder());
  ASSERT_EQ(set.size(), 3);
  EXPECT_EQ(set.item(0).source, dir.file("s-00.tar") + ":n1/x.png");
  EXPECT_EQ(set.item(0).label, 2);
  EXPECT_EQ(set.item(1).source, dir.file("s-00.tar") + ":y.PNG");  // the first part seen orders the sample
  EXPECT_EQ(set.item(1).label, 0);
  EXPECT_EQ(set.item(2).label, 5);  // z.seg.png is a part "seg.png" of z, not its image
  EXPECT_EQ(set.num_classes(), 6);
  const auto bytes = set.read_bytes(1);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), b);
  const at::Tensor img = set.read_rgb(0);
  const auto p = perftrain::testing::image_pattern(6, 5, 3, 11);
  ASSERT_EQ(img.sizes(), (std::vector<int64_t>{5, 6, 3}));
  EXPECT_EQ(std::memcmp(img.data_ptr<uint8_t>(), p.data(), p.size()), 0);
  EXPECT_EQ(set.read_rgb(2).sizes(), (std::vector<int64_t>{4, 4, 3}));
}

TEST(ImageSet, TarShardErrorsNameTheShardAndKey) {
  TempDir dir;
  const std::string img = png_bytes(dir, 2, 2, 3, 1);
  write_raw(dir.file("nocls.tar"), tar_member("k1.jpg", img) + tar_end());
  write_raw(dir.file("noimg.tar"), tar_member("k2.cls", "1") + tar_end());
  write_raw(dir.file("badcls.tar"), tar_member("k3.png", img) + tar_member("k3.cls", "dog") + tar_end());
  write_raw(dir.file("two.tar"), tar_member("k4.png", img) + tar_member("k4.jpg", img) + tar_end());
  write_raw(dir.file("none.tar"), tar_member("readme.txt", "x") + tar_end());
  for (const auto& [file, key, why] :
       {std::tuple{"nocls.tar", "'k1'", "no .cls"}, std::tuple{"noimg.tar", "'k2'", "no image"},
        std::tuple{"badcls.tar", "'k3'", "not a class label"}, std::tuple{"two.tar", "'k4'", "two images"},
        std::tuple{"none.tar", "", "no samples"}}) {
    const std::string e = error_of<UsageError>([&] { ImageSet::open(dir.file(file)); });
    EXPECT_NE(e.find(dir.file(file)), std::string::npos) << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
    EXPECT_NE(e.find(why), std::string::npos) << e;
  }
  // A corrupt image in a shard: named by shard and member when read.
  write_raw(dir.file("corrupt.tar"), tar_member("k5.png", "garbage") + tar_member("k5.cls", "0") + tar_end());
  const ImageSet set = ImageSet::open(dir.file("corrupt.tar"));
  EXPECT_NE(error_of<RuntimeError>([&] { set.read_rgb(0); }).find(dir.file("corrupt.tar") + ":k5.png"),
            std::string::npos);
}

}  // namespace
}  // namespace perftrain::data
