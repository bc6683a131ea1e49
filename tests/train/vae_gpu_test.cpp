// The VAE in bfloat16 on the GPU against float32 on the CPU: the same random
// folder encoded and decoded both ways, within bfloat16's rounding.
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <gtest/gtest.h>

#include "compat/compat.h"
#include "support/vae_folder.h"
#include "train/vae.h"

namespace perftrain::train {
namespace {

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.cpu() - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(VaeGpu, Bfloat16MatchesFloat32) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  perftrain::testing::TempDir tmp;
  const std::string dir = perftrain::testing::write_random_vae(tmp.file("vae"));
  const Vae fp32 = load_vae(dir, at::kCPU, false);
  const Vae bf16 = load_vae(dir, at::Device(at::kCUDA, 0), true);
  EXPECT_EQ(bf16.net->dtype(), at::kBFloat16);
  const at::Tensor x = at::rand({4, 3, 32, 32}) * 2 - 1;
  const auto want = fp32.net->encode(x);
  const auto got = bf16.net->encode(x.cuda());
  EXPECT_EQ(got.mean.scalar_type(), at::kFloat);
  EXPECT_LT(relative_error(got.mean, want.mean), 0.05);
  EXPECT_LT(relative_error(bf16.net->decode(want.mean.cuda()), fp32.net->decode(want.mean)), 0.05);
}

}  // namespace
}  // namespace perftrain::train
