// ops/attention_head_bwd on the CPU: the switch, and that the op steps aside
// (returns nothing, so cuDNN's backward runs) where its kernel does not
// apply. The kernel itself is checked on the GPU
// (projected_attention_gpu_test.cpp, tools/attention_bwd_check.cu).
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "ops/attention_head_bwd.h"

namespace perftrain::ops {
namespace {

TEST(AttentionHeadBwd, SwitchIsOwnOrCudnnAndRefusesOtherValues) {
  EXPECT_TRUE(own_attention_backward_from(nullptr));
  EXPECT_TRUE(own_attention_backward_from("own"));
  EXPECT_FALSE(own_attention_backward_from("cudnn"));
  EXPECT_THROW(own_attention_backward_from("cuDNN"), std::invalid_argument);
  EXPECT_THROW(own_attention_backward_from(""), std::invalid_argument);
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
