// The attention kernel choice each op notes for the bench report (CPU: ATen's
// SDPA; the CUDA choices are checked in qkv_attention_gpu_test.cpp).
#include "ops/attention_paths.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/qkv_attention.h"

namespace perftrain::ops {
namespace {

TEST(AttentionPaths, NotesEachDistinctShapeOnceInAFixedOrder) {
  reset_attention_paths();
  note_attention_path(AttentionPath::Cudnn, 288, 64, true, at::kBFloat16);
  note_attention_path(AttentionPath::Own, 256, 72, false, at::kBFloat16);
  note_attention_path(AttentionPath::Cudnn, 288, 64, true, at::kBFloat16);  // again: no new line
  note_attention_path(AttentionPath::Tiled, 1152, 64, true, at::kBFloat16);
  const std::vector<std::string> lines = attention_paths_used();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "ours (whole-head forward and backward): 256 tokens, head dim 72, BFloat16");
  EXPECT_EQ(lines[1], "ours, tiled: 1152 tokens, head dim 64, key mask, BFloat16");
  EXPECT_EQ(lines[2], "cuDNN fused: 288 tokens, head dim 64, key mask, BFloat16");
  reset_attention_paths();
  EXPECT_TRUE(attention_paths_used().empty());
}

TEST(AttentionPaths, TheCpuOpsNoteAtenSdpaWithTheirShape) {
  at::manual_seed(3);
  reset_attention_paths();
  const at::Tensor qkv = at::randn({2, 37, 3 * 24});
  (void)qkv_attention(qkv, 3);
  at::Tensor mask = at::rand({2, 37}) > 0.3;
  mask.select(1, 0).fill_(true);
  (void)qkv_attention(qkv, 3, mask);
  const std::vector<std::string> lines = attention_paths_used();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "ATen scaled_dot_product_attention: 37 tokens, head dim 8, Float");
  EXPECT_EQ(lines[1], "ATen scaled_dot_product_attention: 37 tokens, head dim 8, key mask, Float");
}

}  // namespace
}  // namespace perftrain::ops
