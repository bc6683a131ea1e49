// ops/attention_head_bwd on the CPU: the switch, and that the op steps aside
// (returns nothing, so cuDNN's backward runs) where its kernel does not
// apply. The kernel itself is checked on the GPU (projected_attention_gpu_test.cpp).
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>


#include "ops/attention_head_bwd.h"

namespace perftrain::ops {
namespace {

TEST(AttentionHeadBwd, SwitchIsOnByDefaultAndSettable) {
  EXPECT_TRUE(whole_head_attention_backward());
  set_whole_head_attention_backward(false);
  EXPECT_FALSE(whole_head_attention_backward());
  set_whole_head_attention_backward(true);
  EXPECT_TRUE(whole_head_attention_backward());
}

// The shapes both whole-head kernels take: bf16 CUDA [B, 256, 3D] with head
// dim 64 or 72 (a CPU tensor never).
TEST(AttentionHeadBwd, WholeHeadDimIsZeroOffTheKernelsShapes) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  EXPECT_EQ(detail::whole_head_dim(at::randn({2, 256, 3 * 128}, bf16), 2), 0) << "on the CPU";
  EXPECT_EQ(detail::whole_head_dim(at::randn({2, 256, 3 * 128}, bf16), 0), 0) << "no heads";
}

TEST(AttentionHeadBwd, StepsAsideOnTheCpuAndOnOtherShapes) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  // DiT-S/2's shape (256 tokens, head dim 64) on the CPU.
  const at::Tensor qkv = at::randn({2, 256, 3 * 128}, bf16);
  const at::Tensor out = at::randn({2, 256, 2, 64}, bf16).transpose(1, 2);
  const at::Tensor lse = at::randn({2, 2, 256});
  const at::Tensor grad = at::randn({2, 256, 128}, bf16);
  EXPECT_FALSE(try_attention_head_bwd(qkv, out, lse, grad, 2).defined());
  // Other token counts and fp32 step aside before any GPU check.
  EXPECT_FALSE(try_attention_head_bwd(at::randn({2, 17, 3 * 128}, bf16), out, lse, grad, 2).defined());
  EXPECT_FALSE(try_attention_head_bwd(qkv.to(at::kFloat), out, lse, grad, 2).defined());
}

}  // namespace
}  // namespace perftrain::ops
