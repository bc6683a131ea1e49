// The host side of the cuBLASLt products (ops/cublaslt_workspace.h), no GPU:
// when they may time their algorithms (gemm_tuning_open: open by default,
// closed inside a GemmTuningDeferred, restored after it, nested scopes
// included; an inactive scope changes nothing), how many candidates they time
// (the [speed] key gemm_tune: the default, a set value, negative as 0), and
// the dtypes a product takes.
#include <gtest/gtest.h>

#include "base/error.h"
#include "ops/cublaslt_workspace.h"

namespace perftrain::ops {
namespace {

TEST(GemmTuning, DeferredScopesCloseAndRestore) {
  ASSERT_TRUE(gemm_tuning_open());
  {
    const GemmTuningDeferred deferred;
    EXPECT_FALSE(gemm_tuning_open());
    {
      const GemmTuningDeferred nested;
      EXPECT_FALSE(gemm_tuning_open());
    }
    EXPECT_FALSE(gemm_tuning_open()) << "the outer scope still defers";
    {
      const GemmTuningDeferred inactive(false);
      EXPECT_FALSE(gemm_tuning_open());
    }
  }
  EXPECT_TRUE(gemm_tuning_open());
  {
    const GemmTuningDeferred inactive(false);
    EXPECT_TRUE(gemm_tuning_open());
  }
  EXPECT_TRUE(gemm_tuning_open());
}

TEST(GemmTuning, CandidatesDefaultSetAndClamped) {
  const int before = gemm_tune_candidates();
  EXPECT_EQ(before, kDefaultGemmTuneCandidates) << "nothing in this process has set it";
  set_gemm_tune_candidates(0);
  EXPECT_EQ(gemm_tune_candidates(), 0);
  set_gemm_tune_candidates(64);
  EXPECT_EQ(gemm_tune_candidates(), 64);
  set_gemm_tune_candidates(-3);
  EXPECT_EQ(gemm_tune_candidates(), 0) << "a negative count takes the heuristic's first pick";
  set_gemm_tune_candidates(before);
}

TEST(GemmDtype, Bf16Fp16Fp32OnlyOthersAreUsageErrors) {
  EXPECT_EQ(gemm_dtype(at::kBFloat16, "x"), kernels::GemmDtype::kBF16);
  EXPECT_EQ(gemm_dtype(at::kHalf, "x"), kernels::GemmDtype::kF16);
  EXPECT_EQ(gemm_dtype(at::kFloat, "x"), kernels::GemmDtype::kF32);
  EXPECT_THROW(gemm_dtype(at::kDouble, "x"), UsageError);
  EXPECT_THROW(gemm_dtype(at::kInt, "x"), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
