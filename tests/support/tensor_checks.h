// Comparisons of tensors against references for the op, optimizer and model
// tests: every element within atol + rtol * |ref| (computed in float64 on the
// CPU), a NaN on either side always a failure, and the message says how many
// elements are off and by how much.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/isnan.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <string>

namespace perftrain::testing {

inline at::Generator seeded_cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

inline ::testing::AssertionResult all_close(const at::Tensor& got, const at::Tensor& ref, double atol, double rtol) {
  if (!got.defined()) return ::testing::AssertionFailure() << "undefined result";
  if (got.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << "sizes differ: " << got.sizes() << " vs " << ref.sizes();
  const at::Tensor g = got.detach().cpu().to(at::kDouble), r = ref.detach().cpu().to(at::kDouble);
  const at::Tensor err = (g - r).abs();
  const at::Tensor bad = (err > r.abs() * rtol + atol) | at::isnan(g) | at::isnan(r);
  if (bad.any().item<bool>())
    return ::testing::AssertionFailure() << bad.sum().item<int64_t>() << " of " << g.numel()
                                         << " elements off; max |got - ref| = " << err.max().item<double>();
  return ::testing::AssertionSuccess();
}

inline void expect_close(const at::Tensor& got, const at::Tensor& ref, double atol, double rtol,
                         const std::string& what) {
  EXPECT_TRUE(all_close(got, ref, atol, rtol)) << what;
}

// ||got - ref|| / ||ref|| in float64 (for results that round differently
// element by element but must agree as a whole, e.g. bf16 products).
inline double rel_l2(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor g = got.detach().cpu().to(at::kDouble), r = ref.detach().cpu().to(at::kDouble);
  return (g - r).norm().item<double>() / (r.norm().item<double>() + 1e-300);
}

// rel_l2, with a NaN anywhere in got a failure of the calling test.
inline double rel_err(const at::Tensor& got, const at::Tensor& ref) {
  EXPECT_FALSE(got.detach().isnan().any().item<bool>()) << "NaN is always a failure";
  return rel_l2(got, ref);
}

}  // namespace perftrain::testing
