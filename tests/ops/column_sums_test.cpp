// ops::batch_sums_into and ops::column_sums_into on the CPU (the ATen
// fallback the GPU kernels stand in for): sums against float64, the rounding
// into a bf16 output, and the argument checks.
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <limits>

#include "base/error.h"
#include "ops/column_sums.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(ColumnSums, BatchSumsMatchFloat64IntoFp32AndBf16) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(0);
  const at::Tensor partials = at::randn({37, 130}, g) + 0.5;
  const at::Tensor want = partials.to(at::kDouble).sum(0);
  for (const at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor out = at::full({130}, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().dtype(dt));
    batch_sums_into(partials, out);
    EXPECT_TRUE(perftrain::testing::all_close(out, want, 1e-4, dt == at::kFloat ? 1e-5 : 8e-3)) << dt;
  }
}

TEST(ColumnSums, ColumnSumsMatchFloat64) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(1);
  const at::Tensor a = at::randn({50, 24}, g), b = at::randn({50, 24}, g);
  at::Tensor oa = at::full({24}, std::numeric_limits<double>::quiet_NaN()), ob = at::full_like(oa, 0.0);
  column_sums_into({a, b}, {oa, ob});
  EXPECT_TRUE(perftrain::testing::all_close(oa, a.to(at::kDouble).sum(0), 1e-5, 1e-5));
  EXPECT_TRUE(perftrain::testing::all_close(ob, b.to(at::kDouble).sum(0), 1e-5, 1e-5));
}

TEST(ColumnSums, ColumnBlocksOfAWiderMatrix) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(2);
  const at::Tensor wide = at::randn({40, 30}, g);
  const at::Tensor q = wide.narrow(1, 0, 10), v = wide.narrow(1, 20, 10);
  at::Tensor oq = at::full({10}, std::numeric_limits<double>::quiet_NaN()), ov = at::full_like(oq, 0.0);
  column_sums_into({q, v}, {oq, ov});
  EXPECT_TRUE(perftrain::testing::all_close(oq, q.to(at::kDouble).sum(0), 1e-5, 1e-5));
  EXPECT_TRUE(perftrain::testing::all_close(ov, v.to(at::kDouble).sum(0), 1e-5, 1e-5));
  // A contiguous [6, 1] whose size-1 dimension has another stride is still one dense matrix.
  const at::Tensor column = at::randn({1, 6}, g).t();
  at::Tensor oc = at::full({1}, std::numeric_limits<double>::quiet_NaN());
  column_sums_into({column}, {oc});
  EXPECT_TRUE(perftrain::testing::all_close(oc, column.to(at::kDouble).sum(0), 1e-5, 1e-5));
  // Rows must be contiguous, and the blocks must share their row stride.
  EXPECT_THROW(column_sums_into({wide.narrow(1, 0, 10).t()}, {at::empty({40})}), UsageError);
  EXPECT_THROW(column_sums_into({q, at::randn({40, 10}, g)}, {oq, ov}), UsageError);
}

TEST(ColumnSums, RejectWrongShapesAndDtypes) {
  const at::Tensor partials = at::randn({4, 8});
  EXPECT_THROW(batch_sums_into(partials.to(at::kBFloat16), at::empty({8})), UsageError);  // partials not fp32
  EXPECT_THROW(batch_sums_into(partials, at::empty({7})), UsageError);                    // width
  EXPECT_THROW(batch_sums_into(partials.view({32}), at::empty({32})), UsageError);        // not [B, N]
  EXPECT_THROW(column_sums_into({partials}, {at::empty({7})}), UsageError);
  EXPECT_THROW(column_sums_into({}, {}), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
