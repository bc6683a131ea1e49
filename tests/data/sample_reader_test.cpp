// data::SampleReader: samples of a safetensors tensor read with pread, as
// float32, against the tensor written; a NaN or inf is a data error naming
// the file, tensor and sample; a file truncated after open is a RuntimeError
// (where a mapping would raise SIGBUS).
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"
#include "data/sample_reader.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;

TEST(SampleReader, ReadsEachSampleAsFloatInEveryDtype) {
  TempDir dir;
  for (const at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor lat = at::randn({5, 3, 4, 4}).to(dt);
    const std::string path = dir.file(std::string("s_") + c10::toString(dt) + ".safetensors");
    // Another tensor before it, so that the offset is not the data's start.
    io::save_safetensors(path, {{"a_first", at::randn({7})}, {"latents", lat}});
    const auto file = io::SafetensorsFile::open(path);
    const SampleReader r = SampleReader::open(file, "latents");
    ASSERT_EQ(r.size(), 5);
    ASSERT_EQ(r.sample_numel(), 48);
    const at::Tensor want = lat.to(at::kFloat).contiguous();
    std::vector<float> out(48);
    for (const int64_t j : {3, 0, 4}) {
      r.read(j, out.data());
      for (int64_t e = 0; e < 48; ++e)
        ASSERT_EQ(out[e], want.data_ptr<float>()[j * 48 + e]) << c10::toString(dt) << " sample " << j << " element " << e;
    }
  }
}

TEST(SampleReader, NonFiniteValueIsADataErrorNamingFileAndSample) {
  TempDir dir;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    at::Tensor lat = at::randn({6, 2, 3, 3});
    lat.data_ptr<float>()[4 * 18 + 11] = bad;  // sample 4, element 11
    const std::string path = dir.file("bad.safetensors");
    io::save_safetensors(path, {{"latents", lat.to(at::kBFloat16)}});
    const auto file = io::SafetensorsFile::open(path);
    const SampleReader r = SampleReader::open(file, "latents");
    std::vector<float> out(18);
    r.read(3, out.data());  // the others are fine
    r.read(5, out.data());
    const std::string msg = error_of<RuntimeError>([&] { r.read(4, out.data()); });
    EXPECT_NE(msg.find("data error"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample 4 of 'latents'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::isnan(bad) ? "NaN" : "inf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("element 11"), std::string::npos) << msg;
  }
}

TEST(SampleReader, TruncatedAfterOpenIsARuntimeErrorNotSigbus) {
  TempDir dir;
  const at::Tensor lat = at::randn({8, 4, 8, 8});
  const std::string path = dir.file("shard.safetensors");
  io::save_safetensors(path, {{"latents", lat}});
  const auto file = io::SafetensorsFile::open(path);
  const SampleReader r = SampleReader::open(file, "latents");
  std::vector<float> out(256);
  r.read(7, out.data());
  // Cut the file in the middle of sample 3: samples before it still read.
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const off_t keep = st.st_size - 4 * 256 * 4 - 100;
  ASSERT_EQ(::truncate(path.c_str(), keep), 0);
  r.read(2, out.data());
  for (const int64_t j : {3, 7}) {
    const std::string msg = error_of<RuntimeError>([&] { r.read(j, out.data()); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample " + std::to_string(j)), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace perftrain::data
