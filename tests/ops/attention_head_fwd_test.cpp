// ops/attention_head_fwd on the CPU: the switch, and that the op steps aside
// (returns nothing, so cuDNN's forward runs) where its kernel does not
// apply. The kernel itself is checked on the GPU (projected_attention_gpu_test.cpp).
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>


#include "ops/attention_head_fwd.h"

namespace perftrain::ops {
namespace {

TEST(AttentionHeadFwd, SwitchIsOnByDefaultAndSettable) {
  EXPECT_TRUE(whole_head_attention_forward());
  set_whole_head_attention_forward(false);
  EXPECT_FALSE(whole_head_attention_forward());
  set_whole_head_attention_forward(true);
  EXPECT_TRUE(whole_head_attention_forward());
}

TEST(AttentionHeadFwd, StepsAsideOnTheCpuAndOnOtherShapes) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  EXPECT_FALSE(try_attention_head_fwd(at::randn({2, 256, 3 * 128}, bf16), 2).first.defined());
  EXPECT_FALSE(try_attention_head_fwd(at::randn({2, 17, 3 * 128}, bf16), 2).first.defined());
  EXPECT_FALSE(try_attention_head_fwd(at::randn({2, 256, 3 * 128}), 2).first.defined());
}

}  // namespace
}  // namespace perftrain::ops
