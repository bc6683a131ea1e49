// The kind each kernel of a trace is counted under in the step breakdown:
// perftrain's fused row-norm kernels (one template, kernels/row_norm.cuh, that
// the four ops share) and the gated residual's are "fused norm / residual",
// apart from other norms.
#include <gtest/gtest.h>

#include <string>

#include "observe/profile/kernel_breakdown.h"

namespace perftrain::observe {
namespace {

const std::string kFused = "fused norm / residual (perftrain)";

TEST(ProfileKernelKind, RowNormKernelsAreTheFusedNorms) {
  EXPECT_EQ(kernel_kind("void perftrain::kernels::detail::row_norm_forward_kernel<"
                        "(perftrain::kernels::detail::Norm)0, true, true, float, __nv_bfloat16, __nv_bfloat16, 8, 5>"
                        "(float const*, ...)"),
            kFused);
  EXPECT_EQ(kernel_kind("void perftrain::kernels::detail::row_norm_backward_kernel<"
                        "(perftrain::kernels::detail::Norm)1, true, float, __nv_bfloat16, __nv_bfloat16, 8, 1, "
                        "true, false, false>(...)"),
            kFused);
  EXPECT_EQ(kernel_kind("void perftrain::kernels::(anonymous namespace)::residual_adaln_reduce_partials_kernel<float>"),
            kFused);
  EXPECT_EQ(kernel_kind("void perftrain::kernels::(anonymous namespace)::gated_backward_kernel<float>"), kFused);
  EXPECT_EQ(kernel_kind("void perftrain::kernels::(anonymous namespace)::gated_reduce_partials_kernel<float>"), kFused);
}

// train.precision = fp8: the casts (with their amax) and the scaling update
// are a kind of their own; the fp8 products stay matrix products.
TEST(ProfileKernelKind, Fp8CastsAndScaling) {
  const std::string kFp8 = "fp8 casts and scaling";
  EXPECT_EQ(kernel_kind("void perftrain::kernels::(anonymous namespace)::fp8_cast_kernel<__nv_bfloat16, "
                        "(perftrain::kernels::Fp8Format)0, true>(__nv_bfloat16 const*, long, float const*, "
                        "unsigned char*, float*)"),
            kFp8);
  EXPECT_EQ(kernel_kind("void perftrain::kernels::(anonymous namespace)::fp8_cast_transpose_kernel<__nv_bfloat16, "
                        "(perftrain::kernels::Fp8Format)1>(...)"),
            kFp8);
  EXPECT_EQ(kernel_kind("perftrain::kernels::(anonymous namespace)::fp8_scaling_update_kernel("
                        "perftrain::kernels::Fp8ScalingTable, float)"),
            kFp8);
  EXPECT_EQ(kernel_kind("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"),
            "matrix products");
}

TEST(ProfileKernelKind, OtherKinds) {
  EXPECT_EQ(kernel_kind("void at::native::vectorized_layer_norm_kernel<float, float>"), "other norms and reductions");
  EXPECT_EQ(kernel_kind("nvjet_tst_128x64_64x4_1x2_h_bz_coopB_TNN"), "matrix products");
  EXPECT_EQ(kernel_kind("Memcpy HtoD (Pinned -> Device)"), "copies and memsets");
  EXPECT_EQ(kernel_kind("void perftrain::kernels::multi_tensor_adamw_kernel<float>"), "optimizer, EMA, clipping");
}

}  // namespace
}  // namespace perftrain::observe
