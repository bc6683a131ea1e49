// .npy / .npz: what we write NumPy reads (the sample batch ADM's evaluation
// suite loads), and what NumPy writes we read (pytorch-fid's --save-stats
// files are np.savez_compressed; features may be np.save'd, in Fortran order).
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/npz.h"
#include "support/python_script.h"

namespace perftrain::io {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

std::string python(const TempDir& dir, const std::string& script, const std::string& args) {
  const auto r = perftrain::testing::run_python_script(dir, script, args);
  EXPECT_EQ(r.code, 0) << r.output;
  return r.output;
}

constexpr const char* kNumpyReadsOurs = R"(
import sys, numpy as np
d = np.load(sys.argv[1])
assert sorted(d.files) == ["arr_0", "arr_1", "sigma"], d.files
a = d["arr_0"]
assert a.dtype == np.uint8 and a.shape == (5, 4, 4, 3), (a.dtype, a.shape)
assert (a.reshape(-1) == np.arange(240) % 256).all()
assert d["arr_1"].dtype == np.int64 and list(d["arr_1"]) == [0, 1, 2, 0, 1]
s = d["sigma"]
assert s.dtype == np.float64 and s.shape == (3, 3) and s[1, 2] == 3.5, s
print("ok")
)";

TEST(Npz, NumpyReadsWhatWeWriteStreamedInPieces) {
  TempDir dir;
  const std::string path = dir.file("batch.npz");
  write_file_atomic(path, [&](std::FILE* f) {
    NpzWriter w(f, path);
    const at::Tensor images = at::arange(240, at::kLong).remainder(256).to(at::kByte).view({5, 4, 4, 3});
    w.begin("arr_0", at::kByte, {5, 4, 4, 3});
    w.append(images.narrow(0, 0, 2));  // two batches, as sample --npz writes
    w.append(images.narrow(0, 2, 3));
    w.end();
    w.begin("arr_1", at::kLong, {5});
    w.append(at::arange(5, at::kLong).remainder(3));
    w.end();
    w.begin("sigma", at::kDouble, {3, 3});
    w.append(at::arange(9, at::kDouble).div(2).view({3, 3}).t().contiguous());
    w.end();
    w.finish();
  });
  EXPECT_TRUE(contains(python(dir, kNumpyReadsOurs, path), "ok"));
  const auto back = read_npz(path);  // and we read it back the same
  EXPECT_EQ(back.at("arr_0").sizes(), at::IntArrayRef({5, 4, 4, 3}));
  EXPECT_EQ(back.at("sigma")[1][2].item<double>(), 3.5);
}

constexpr const char* kNumpyWrites = R"(
import sys, numpy as np
out = sys.argv[1]
mu = np.linspace(-1, 1, 7)
sigma = np.arange(49, dtype=np.float64).reshape(7, 7) / 7
np.savez_compressed(out + "/stats.npz", mu=mu, sigma=sigma)
np.savez(out + "/plain.npz", np.arange(6, dtype=np.float32).reshape(2, 3))
np.save(out + "/fortran.npy", np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)))
)";

TEST(Npz, WeReadNumpysCompressedPlainAndFortranOrderFiles) {
  TempDir dir;
  python(dir, kNumpyWrites, dir.path());
  const auto stats = read_npz(dir.file("stats.npz"));
  ASSERT_EQ(stats.count("mu"), 1u);
  EXPECT_EQ(stats.at("mu").scalar_type(), at::kDouble);
  EXPECT_DOUBLE_EQ(stats.at("mu")[6].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(stats.at("sigma")[3][4].item<double>(), 25.0 / 7);
  const auto plain = read_arrays(dir.file("plain.npz"));
  EXPECT_TRUE(plain.at("arr_0").equal(at::arange(6, at::kFloat).view({2, 3})));
  const at::Tensor f = read_arrays(dir.file("fortran.npy")).at("arr_0");
  EXPECT_TRUE(f.equal(at::arange(12, at::kInt).view({3, 4}))) << f;
}

TEST(Npz, ACorruptOrTruncatedFileIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.file("x.npz");
  write_npz(path, {{"mu", at::randn({16}).to(at::kDouble)}});
  std::string bytes = perftrain::testing::read_raw(path);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;  // inside the data: the CRC32 no longer matches
  write_raw(dir.file("flipped.npz"), flipped);
  EXPECT_TRUE(contains(error_of<RuntimeError>([&] { read_npz(dir.file("flipped.npz")); }), "flipped.npz"));
  write_raw(dir.file("cut.npz"), bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(contains(error_of<RuntimeError>([&] { read_npz(dir.file("cut.npz")); }), "cut.npz"));
}

TEST(Npz, AnEntryGivenTooFewBytesIsRefused) {
  TempDir dir;
  const std::string path = dir.file("short.npz");
  EXPECT_TRUE(contains(error_of<RuntimeError>([&] {
                         write_file_atomic(path, [&](std::FILE* f) {
                           NpzWriter w(f, path);
                           w.begin("arr_0", at::kByte, {4});
                           w.append(at::arange(3, at::kByte));
                           w.end();
                         });
                       }),
                       "arr_0.npy got"));
}

}  // namespace
}  // namespace perftrain::io
