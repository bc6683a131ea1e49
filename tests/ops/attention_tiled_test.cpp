// ops/attention_tiled on the CPU: the switch (off by default), that the
// op steps aside where its kernel does not apply (CPU tensors, fp32, head
// dims other than 64, 72, 96 and 128, fewer than 64 tokens, a bias of the
// wrong shape), that the kernels take head dims 96 and 128 and refuse 32, 80 and 112 and short
// sequences by name before touching a GPU, and that a 3-D tensor map and the key
// bias's row map refuse a row stride TMA cannot take. The kernel itself is
// checked on the GPU (attention_tiled_gpu_test.cpp, bench/kernels/attention_tiled_check.cu).
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/attention_tiled_bwd_sm90.h"
#include "kernels/attention_tiled_fwd_sm90.h"
#include "kernels/tensor_map.h"
#include "ops/attention_tiled.h"

namespace perftrain::ops {
namespace {

TEST(AttentionTiled, SwitchIsOffByDefaultAndSettable) {
  EXPECT_FALSE(tiled_attention());
  set_tiled_attention(true);
  EXPECT_TRUE(tiled_attention());
  set_tiled_attention(false);
  EXPECT_FALSE(tiled_attention());
}

TEST(AttentionTiled, StepsAsideWhereTheKernelDoesNotApply) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor qkv = at::randn({2, 288, 3 * 128}, bf16);
  const auto q = qkv.narrow(2, 0, 128), k = qkv.narrow(2, 128, 128), v = qkv.narrow(2, 256, 128);
  EXPECT_FALSE(tiled_attention_takes(q, k, v, 2));  // on the CPU
  EXPECT_FALSE(tiled_attention_takes(q.to(at::kFloat), k, v, 2));
  const at::Tensor wide = at::randn({2, 288, 3 * 160}, bf16);  // head dim 80
  EXPECT_FALSE(tiled_attention_takes(wide.narrow(2, 0, 160), wide.narrow(2, 160, 160), wide.narrow(2, 320, 160), 2));
  set_tiled_attention(true);
  EXPECT_FALSE(detail::tiled_attention_applies(qkv, 2));
  EXPECT_FALSE(detail::tiled_attention_applies(q, k, v, 2));  // the three-tensor form's, on the CPU
  EXPECT_FALSE(detail::tiled_attention_applies(at::randn({2, 17, 3 * 128}, bf16), 2));
  EXPECT_FALSE(detail::tiled_attention_applies(qkv, 2, at::zeros({2, 1, 1, 17}, bf16)));
  set_tiled_attention(false);
  EXPECT_THROW(attention_tiled_fwd(q, k, v, 2), std::invalid_argument);
  EXPECT_THROW(attention_tiled_bwd(q, k, v, 2, at::Tensor(), q, q, q, q, k, v), std::invalid_argument);
}

TEST(AttentionTiled, KernelRefusesOtherHeadDimsAndShortSequencesByName) {
  const kernels::AttentionOperand none{};
  for (const int d : {80, 112, 32}) {
    try {
      kernels::attention_tiled_fwd_sm90(none, none, none, {}, nullptr, nullptr, 2, 288, 2, d, 0.1f, nullptr);
      ADD_FAILURE() << "head dim " << d << " accepted";
    } catch (const std::invalid_argument& e) {
      const std::string expected = "head dim must be 64, 72, 96 or 128, not " + std::to_string(d);
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(kernels::attention_tiled_fwd_sm90(none, none, none, {}, nullptr, nullptr, 2, 63, 2, 64, 0.1f, nullptr),
               std::invalid_argument);
  const kernels::AttentionGradOperand no_grad{};
  for (const int d : {80, 112})
    EXPECT_THROW(kernels::attention_tiled_bwd_sm90(none, none, none, {}, nullptr, nullptr, nullptr, nullptr, no_grad,
                                                   no_grad, no_grad, 2, 288, 2, d, 0.1f, nullptr),
                 std::invalid_argument)
        << d;
}

// Head dims 96 and 128 pass the head-dim check: the same call gets as far as
// the null pointers and is refused for those.
TEST(AttentionTiled, KernelTakesHeadDims96And128) {
  const kernels::AttentionOperand none{};
  for (const int d : {96, 128}) {
    EXPECT_TRUE(kernels::tiled_attention_dim_supported(d)) << d;
    try {
      kernels::attention_tiled_fwd_sm90(none, none, none, {}, nullptr, nullptr, 2, 288, 2, d, 0.1f, nullptr);
      ADD_FAILURE() << "null pointers accepted at head dim " << d;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find("head dim"), std::string::npos) << e.what();
    }
  }
}

// A row stride below the columns or not a multiple of 8 elements (16 bytes)
// is refused, naming the caller, before the driver is asked.
TEST(AttentionTiled, TensorMapRefusesRowStridesTmaCannotTake) {
  alignas(16) static unsigned char buffer[64];
  for (const int64_t stride : {132, 120}) {  // not a multiple of 8; below the 128 columns
    try {
      (void)kernels::bf16_tensor_map_3d(buffer, 2, 64, 128, stride, 64, "who");
      ADD_FAILURE() << "row stride " << stride << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("who: a row stride"), std::string::npos) << e.what();
    }
  }
}

// The key bias's row map (the tiled kernels stage a key tile of it by TMA):
// a row stride that is not a multiple of 16 bytes or below the keys, a box
// that is not, and elements of other than 2 or 4 bytes are refused by name
// before the driver is asked; one sample's stride is not asked.
TEST(AttentionTiled, RowTensorMapRefusesWhatTmaCannotTake) {
  alignas(16) static unsigned char buffer[64];
  const auto refused = [&](int64_t samples, int64_t stride, int bytes, int box, const char* what) {
    try {
      (void)kernels::row_tensor_map(buffer, samples, 257, stride, bytes, box, "who");
      ADD_FAILURE() << what << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("who: a row"), std::string::npos) << what << ": " << e.what();
    }
  };
  refused(2, 260, 2, 128, "bf16 rows 520 bytes apart");
  refused(2, 258, 4, 128, "fp32 rows 1032 bytes apart");
  refused(2, 256, 2, 128, "a row stride below the 257 keys");
  refused(2, 264, 2, 100, "a box of 200 bytes");
  refused(2, 264, 2, 512, "a box of 512 keys");
  refused(2, 264, 8, 64, "8-byte elements");
  // The same stride with one sample passes the checks (then the driver, absent here, is asked).
  try {
    (void)kernels::row_tensor_map(buffer, 1, 257, 257, 2, 128, "who");
  } catch (const std::invalid_argument& e) {
    ADD_FAILURE() << "one sample's stride refused: " << e.what();
  } catch (const std::exception&) {
  }
}

}  // namespace
}  // namespace perftrain::ops
