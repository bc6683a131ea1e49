// When the matrix products may time their algorithms (ops::gemm_tuning_open):
// open by default, closed inside a GemmTuningDeferred, restored after it,
// nested scopes included; an inactive scope changes nothing.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace perftrain::ops
