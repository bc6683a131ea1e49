// ops::column_sums_into on the GPU: the fused column-sum kernel against
// float64 sums for 1-3 matrices at once, every float dtype, aligned and odd
// widths, a single row and DiT-sized ones, on NaN-poisoned outputs; the same
// bits on a rerun (fixed reduction order); ops::batch_sums_into (the short
// one-launch sum) the same way, into fp32 and bf16 outputs. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/column_sums.h"
#include "compat/compat.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

TEST(ColumnSumsGpu, MatchFloat64AndRepeatBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(3);
  struct Case {
    int64_t rows, cols;
    int count;
  };
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const Case c : {Case{1, 8, 1}, Case{7, 100, 2}, Case{300, 384, 3}, Case{8192, 1152, 3}, Case{65536, 384, 1},
                         Case{1000, 257, 2}}) {
      std::vector<at::Tensor> mats, outs, again;
      for (int j = 0; j < c.count; ++j) {
        // A mean offset, so that column sums are large and cancellation shows.
        mats.push_back((at::randn({c.rows, c.cols}, g, at::TensorOptions().device(kCuda)) + 0.5).to(dt));
        outs.push_back(at::full({c.cols}, std::numeric_limits<double>::quiet_NaN(),
                                at::TensorOptions().device(kCuda).dtype(at::kFloat)));
        again.push_back(at::full_like(outs.back(), std::numeric_limits<double>::quiet_NaN()));
      }
      column_sums_into(mats, outs);
      column_sums_into(mats, again);
      const std::string what = std::string(c10::toString(dt)) + " " + std::to_string(c.rows) + "x" +
                               std::to_string(c.cols) + " x" + std::to_string(c.count);
      for (int j = 0; j < c.count; ++j) {
        const at::Tensor want = mats[j].to(at::kDouble).sum(0);
        // fp32 accumulation over `rows` terms of magnitude ~1: error ~ rows * 2^-24 * |sum|-ish; 1e-5 relative
        // plus an absolute term for columns that sum near zero.
        EXPECT_TRUE(perftrain::testing::all_close(outs[j], want, 1e-6 * double(c.rows), 1e-5)) << what << " m" << j;
        EXPECT_TRUE(at::equal(outs[j], again[j])) << what << " m" << j << ": a rerun gave other bits";
      }
    }
  }
}

// Column blocks of one wider matrix (rows ld elements apart), as the qkv
// bias gradient takes the q and v blocks of the packed dqkv and skips k:
// DiT-XL/2's widths (16-byte rows) and odd ones (the one-column loads).
TEST(ColumnSumsGpu, ColumnBlocksOfAWiderMatrixMatchFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(4);
  for (const at::ScalarType dt : {at::kBFloat16, at::kFloat}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{4096, 1152}, {333, 101}}) {
      const at::Tensor wide = (at::randn({rows, 3 * cols}, g, at::TensorOptions().device(kCuda)) + 0.5).to(dt);
      const std::vector<at::Tensor> mats = {wide.narrow(1, 0, cols), wide.narrow(1, 2 * cols, cols)};
      std::vector<at::Tensor> outs;
      for (int j = 0; j < 2; ++j)
        outs.push_back(at::full({cols}, std::numeric_limits<double>::quiet_NaN(),
                                at::TensorOptions().device(kCuda).dtype(at::kFloat)));
      column_sums_into(mats, outs);
      const std::string what = std::string(c10::toString(dt)) + " " + std::to_string(rows) + "x" +
                               std::to_string(cols) + " blocks of " + std::to_string(3 * cols);
      for (int j = 0; j < 2; ++j)
        EXPECT_TRUE(perftrain::testing::all_close(outs[j], mats[j].to(at::kDouble).sum(0), 1e-6 * double(rows), 1e-5))
            << what << " block " << j;
    }
  }
}

TEST(ColumnSumsGpu, BatchSumsMatchFloat64AndRepeatBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(5);
  const auto f32 = at::TensorOptions().device(kCuda).dtype(at::kFloat);
  // Rows: one, fewer than the kernel's 8 row groups, not a multiple of 8, DiT batches; widths: odd, under and
  // over one 32-column block, DiT's.
  for (const int64_t rows : {1, 5, 33, 256, 1000}) {
    for (const int64_t cols : {1, 31, 100, 384, 1152}) {
      const at::Tensor partials = at::randn({rows, cols}, g, f32) + 0.5;
      const at::Tensor want = partials.to(at::kDouble).sum(0);
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
      for (const at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
        const at::Tensor out = at::full({cols}, std::numeric_limits<double>::quiet_NaN(), f32.dtype(dt));
        const at::Tensor again = at::full_like(out, std::numeric_limits<double>::quiet_NaN());
        batch_sums_into(partials, out);
        batch_sums_into(partials, again);
        const double rtol = dt == at::kFloat ? 1e-5 : 8e-3;  // bf16: one rounding of the fp32 sum
        EXPECT_TRUE(perftrain::testing::all_close(out, want, 1e-6 * double(rows), rtol)) << what << " " << dt;
        EXPECT_TRUE(at::equal(out, again)) << what << " " << dt << ": a rerun gave other bits";
      }
    }
  }
}

}  // namespace
}  // namespace perftrain::ops
