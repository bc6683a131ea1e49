#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

at::Tensor long_tensor(std::vector<int64_t> v) {
  at::Tensor t = at::full({static_cast<int64_t>(v.size())}, 0, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

std::vector<float> gather(const Dataset& ds, std::vector<int64_t> idx, std::vector<int64_t>* labels) {
  const auto s = ds.sample_shape();
  std::vector<float> x(idx.size() * s[0] * s[1] * s[2]);
  labels->resize(idx.size());
  ds.gather(idx.data(), static_cast<int64_t>(idx.size()), x.data(), labels->data());
  return x;
}

TEST(LatentShards, DirectoryOfShardsInNameOrder) {
  TempDir dir;
  // b_ holds samples 0..2 (F32), c_ samples 3..4 (BF16 of exactly representable values).
  const at::Tensor lat_b = at::randn({3, 2, 2, 2});
  const at::Tensor lat_c = at::arange(16, at::TensorOptions().dtype(at::kFloat)).reshape({2, 2, 2, 2}).mul(0.5);
  io::save_safetensors(dir.file("b_first.safetensors"),
                       {{"latents", lat_b}, {"labels", long_tensor({4, 0, 2}).to(at::kInt)}});
  io::save_safetensors(dir.file("c_second.safetensors"),
                       {{"latents", lat_c.to(at::kBFloat16)}, {"labels", long_tensor({1, 1}).to(at::kByte)}});
  write_raw(dir.file("a_notes.txt"), "ignored");
  const auto ds = open_latent_shards(dir.path());
  EXPECT_EQ(ds->size(), 5);
  EXPECT_EQ(ds->sample_shape(), (std::array<int64_t, 3>{2, 2, 2}));
  EXPECT_EQ(ds->num_classes(), 5);  // max label 4 + 1
  std::vector<int64_t> y;
  const auto x = gather(*ds, {4, 0, 2}, &y);
  EXPECT_EQ(y, (std::vector<int64_t>{1, 4, 2}));
  for (int e = 0; e < 8; ++e) {
    EXPECT_EQ(x[e], lat_c.data_ptr<float>()[8 + e]);
    EXPECT_EQ(x[8 + e], lat_b.data_ptr<float>()[e]);
    EXPECT_EQ(x[16 + e], lat_b.data_ptr<float>()[16 + e]);
  }
  EXPECT_NE(ds->describe().find("2 files"), std::string::npos) << ds->describe();
}

TEST(LatentShards, SingleFileWithDeclaredClasses) {
  TempDir dir;
  const std::string path = dir.file("one.safetensors");
  io::save_safetensors(path, {{"latents", at::randn({4, 1, 2, 3}).to(at::kHalf)}, {"labels", long_tensor({0, 1, 0, 1})}},
                       {{"num_classes", "1000"}});
  const auto ds = open_latent_shards(path);
  EXPECT_EQ(ds->size(), 4);
  EXPECT_EQ(ds->num_classes(), 1000);
}

TEST(LatentShards, MissingInputIsAUsageError) {
  TempDir dir;
  EXPECT_NE(error_of<UsageError>([&] { open_latent_shards(dir.file("nope")); }).find(dir.file("nope")),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { open_latent_shards(dir.path()); }).find("no *.safetensors"), std::string::npos);
}

struct BadShard {
  const char* name;
  io::NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  const char* expect;
};

TEST(LatentShards, BadShardsNameTheFileAndTheProblem) {
  const at::Tensor lat = at::randn({3, 2, 2, 2});
  const at::Tensor lab = long_tensor({0, 1, 2});
  const std::vector<BadShard> cases = {
      {"no_labels", {{"latents", lat}}, {}, "no tensor named 'labels'"},
      {"no_latents", {{"labels", lab}}, {}, "no tensor named 'latents'"},
      {"latents_3d", {{"latents", lat.reshape({3, 4, 2})}, {"labels", lab}}, {}, "[N, C, H, W]"},
      {"latents_int", {{"latents", lat.to(at::kInt)}, {"labels", lab}}, {}, "F32, F16 or BF16"},
      {"labels_float", {{"latents", lat}, {"labels", lab.to(at::kFloat)}}, {}, "integer type"},
      {"labels_2d", {{"latents", lat}, {"labels", lab.reshape({3, 1})}}, {}, "integer type"},
      {"count_mismatch", {{"latents", lat}, {"labels", long_tensor({0, 1})}}, {}, "2 entries"},
      {"negative_label", {{"latents", lat}, {"labels", long_tensor({0, -3, 1})}}, {}, "label -3 of sample 1 is negative"},
      {"label_too_big", {{"latents", lat}, {"labels", lab}}, {{"num_classes", "2"}}, "label 2 of sample 2"},
      {"bad_num_classes", {{"latents", lat}, {"labels", lab}}, {{"num_classes", "ten"}}, "'ten'"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    io::save_safetensors(path, c.tensors, c.metadata);
    const std::string msg = error_of<RuntimeError>([&] { open_latent_shards(dir.path()); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(LatentShards, ShardsMustAgree) {
  TempDir dir;
  io::save_safetensors(dir.file("0.safetensors"), {{"latents", at::randn({2, 4, 8, 8})}, {"labels", long_tensor({0, 1})}},
                       {{"num_classes", "10"}});
  io::save_safetensors(dir.file("1.safetensors"), {{"latents", at::randn({2, 4, 8, 4})}, {"labels", long_tensor({0, 1})}});
  std::string msg = error_of<RuntimeError>([&] { open_latent_shards(dir.path()); });
  EXPECT_NE(msg.find(dir.file("1.safetensors")), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 8, 4]"), std::string::npos) << msg;

  io::save_safetensors(dir.file("1.safetensors"), {{"latents", at::randn({2, 4, 8, 8})}, {"labels", long_tensor({0, 1})}},
                       {{"num_classes", "11"}});
  msg = error_of<RuntimeError>([&] { open_latent_shards(dir.path()); });
  EXPECT_NE(msg.find(dir.file("1.safetensors")), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_classes 11"), std::string::npos) << msg;
}

TEST(LatentShards, CorruptShardIsNamed) {
  TempDir dir;
  io::save_safetensors(dir.file("0.safetensors"), {{"latents", at::randn({2, 4, 8, 8})}, {"labels", long_tensor({0, 1})}});
  write_raw(dir.file("1.safetensors"), "this is not a safetensors file");
  const std::string msg = error_of<RuntimeError>([&] { open_latent_shards(dir.path()); });
  EXPECT_NE(msg.find(dir.file("1.safetensors")), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::data
