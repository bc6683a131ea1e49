// The shapes our own Hopper fc1 product takes, and its refusals, which come
// before any CUDA call (so they run without a GPU).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "kernels/gemm_bias_gelu_sm90.h"

namespace perftrain::kernels {
namespace {

TEST(GemmBiasGelu, SupportedShapesAreWholeTiles) {
  EXPECT_TRUE(gemm_bias_gelu_sm90_supported(128, 256, 64));
  EXPECT_TRUE(gemm_bias_gelu_sm90_supported(65536, 3072, 768));   // DiT-B/2 b256 fc1
  EXPECT_TRUE(gemm_bias_gelu_sm90_supported(65536, 4608, 1152));  // DiT-XL/2 b256
  EXPECT_TRUE(gemm_bias_gelu_sm90_supported(8192, 1536, 384));    // DiT-S/2 b32
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(100, 256, 64));
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(128, 384, 64));  // N a multiple of the 128-wide tile but not of 256
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(128, 300, 64));
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(128, 256, 72));
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(0, 256, 64));
  EXPECT_FALSE(gemm_bias_gelu_sm90_supported(int64_t(1) << 31, 256, 64));  // rows past an int
}

TEST(GemmBiasGelu, RefusesBadShapesAndPointersBeforeTouchingTheGpu) {
  alignas(16) static __nv_bfloat16 buf[64];
  alignas(16) static float bias[8];
  EXPECT_THROW(gemm_bias_gelu_sm90<float>(buf, buf, bias, buf, buf, 100, 256, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemm_bias_gelu_sm90<float>(buf + 1, buf, bias, buf, buf, 128, 256, 64, nullptr),
               std::invalid_argument);
  EXPECT_THROW(gemm_bias_gelu_sm90<float>(buf, buf, nullptr, buf, buf, 128, 256, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(gemm_bias_gelu_sm90<float>(buf, buf, bias + 1, buf, buf, 128, 256, 64, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace perftrain::kernels
