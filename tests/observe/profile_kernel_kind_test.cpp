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

TEST(ProfileKernelKind, OtherKinds) {
  EXPECT_EQ(kernel_kind("void at::native::vectorized_layer_norm_kernel<float, float>"), "other norms and reductions");
  EXPECT_EQ(kernel_kind("nvjet_tst_128x64_64x4_1x2_h_bz_coopB_TNN"), "matrix products");
  EXPECT_EQ(kernel_kind("Memcpy HtoD (Pinned -> Device)"), "copies and memsets");
  EXPECT_EQ(kernel_kind("void perftrain::kernels::multi_tensor_adamw_kernel<float>"), "optimizer, EMA, clipping");
}

}  // namespace
}  // namespace perftrain::observe
