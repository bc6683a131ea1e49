// What the tests of the row ops (adaln_layernorm, gated_residual,
// residual_adaln, rms_adaln, residual_rms_adaln) share: seeded random CUDA inputs, NaN-filled outputs for
// the every-element-written checks, the [B, T, D] shapes, and the two
// comparisons against a float64 reference with tolerances by the result's
// dtype. A test says `using namespace perftrain::testing::row_ops;`.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::testing::row_ops {

inline const c10::Device kCuda(c10::DeviceType::CUDA, 0);

inline at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Random on the CPU (seeded), then moved: N(mean, std) in `dtype`.
inline at::Tensor rnd(at::IntArrayRef sizes, at::Generator& g, at::ScalarType dtype, double std = 1.0,
                      double mean = 0.0) {
  return (at::randn(sizes, g) * std + mean).to(kCuda).to(dtype);
}

inline at::Tensor nan_like(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::full(sizes, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions(kCuda).dtype(dtype));
}

inline bool reduced(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// got against ref in float64: elementwise (|got - ref| <= tol + tol * |ref|
// everywhere) or by relative L2 (||got - ref|| / ||ref|| < tol); a NaN fails.
// tol <= 0: by got's dtype, bf16/fp16 then fp32.
inline void expect_near_ref(const at::Tensor& got, const at::Tensor& ref, const std::string& what, double tol,
                            bool elementwise) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  if (tol <= 0) tol = reduced(got.scalar_type()) ? (elementwise ? 2e-2 : 1e-2) : (elementwise ? 1e-4 : 1e-5);
  const at::Tensor g = got.to(at::kDouble), r = ref.to(at::kDouble);
  EXPECT_FALSE(g.isnan().any().item<bool>()) << what << ": NaN in the result";
  if (elementwise) {
    const at::Tensor bad = ((g - r).abs() > r.abs() * tol + tol).logical_or(g.isnan());
    const int64_t n_bad = bad.sum().item<int64_t>();
    EXPECT_EQ(n_bad, 0) << what << ": " << n_bad << " of " << g.numel()
                        << " elements out of tolerance; max |got - ref| = " << (g - r).abs().max().item<double>();
  } else {
    const double rel = (g - r).norm().item<double>() / r.norm().item<double>();
    EXPECT_LT(rel, tol) << what << ": relative L2 error " << rel;  // NaN fails too
  }
}

// Elementwise. Tolerance per dtype of `got`: bf16/fp16 2e-2 (one rounding of
// an O(1) value is <= 2^-8 relative, plus the rounding of an input the op
// rounds first); fp32 1e-4 (row reductions of up to a few thousand terms);
// `tol` > 0 overrides.
inline void expect_close(const at::Tensor& got, const at::Tensor& ref, const std::string& what, double tol = 0) {
  expect_near_ref(got, ref, what, tol, /*elementwise=*/true);
}

// Per-sample column sums over T rows, by relative L2: below 1e-2 when got is
// bf16/fp16 (its own rounding dominates), 1e-5 when fp32; `tol` > 0 overrides.
inline void expect_rel_l2(const at::Tensor& got, const at::Tensor& ref, const std::string& what, double tol = 0) {
  expect_near_ref(got, ref, what, tol, /*elementwise=*/false);
}

// What a result should be: its name in messages, its dtype, and whether it
// is compared elementwise (expect_close) or, a sum over rows, by relative L2.
struct Expected {
  const char* name;
  at::ScalarType dtype;
  bool elementwise;
};

// Each result defined, of its dtype, and close to the reference.
inline void expect_results(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& ref,
                           const std::vector<Expected>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << where << want[i].name;
    EXPECT_EQ(got[i].scalar_type(), want[i].dtype) << where << want[i].name << " dtype";
    if (want[i].elementwise)
      expect_close(got[i], ref[i], where + want[i].name);
    else
      expect_rel_l2(got[i], ref[i], where + want[i].name);
  }
}

// Deterministic: a rerun's outputs are the same bits as the first run's
// (undefined ones are skipped).
inline void expect_same_bits(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& again,
                             const std::string& where) {
  ASSERT_EQ(got.size(), again.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].defined()) continue;
    EXPECT_TRUE(at::equal(got[i], again[i])) << where << "output " << i << " not bit-identical";
  }
}

// "x Float mod BFloat16 out BFloat16": a test case's dtypes by input, for failure messages.
inline std::string dtype_names(std::initializer_list<std::pair<const char*, at::ScalarType>> dtypes) {
  std::string out;
  for (const auto& [input, t] : dtypes) out += std::string(out.empty() ? "" : " ") + input + " " + c10::toString(t);
  return out;
}

// x's [B, T, D].
struct Shape {
  int64_t b, t, d;
};

inline std::string name(const Shape& s) {
  return "[" + std::to_string(s.b) + "," + std::to_string(s.t) + "," + std::to_string(s.d) + "]";
}

// Which outputs of a residual op (x1, h) the loss uses.
enum class Use { kBoth, kHOnly, kX1Only };
inline const Use kUses[] = {Use::kBoth, Use::kHOnly, Use::kX1Only};
inline const char* name(Use u) { return u == Use::kBoth ? "both used" : u == Use::kHOnly ? "h only" : "x1 only"; }

// x1 and h (detached), then the gradients of `inputs` when the outputs that
// `use` names receive dx1 and dh (in their dtypes); a gradient the used
// outputs do not reach is undefined.
inline std::vector<at::Tensor> outputs_and_grads(const at::Tensor& x1, const at::Tensor& h,
                                                 const std::vector<at::Tensor>& inputs, Use use,
                                                 const at::Tensor& dx1, const at::Tensor& dh) {
  std::vector<at::Tensor> outs, grads_out;
  if (use != Use::kHOnly) outs.push_back(x1), grads_out.push_back(dx1);
  if (use != Use::kX1Only) outs.push_back(h), grads_out.push_back(dh);
  std::vector<at::Tensor> all = torch::autograd::grad(outs, inputs, grads_out, /*retain_graph=*/std::nullopt,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
  all.insert(all.begin(), {x1.detach(), h.detach()});
  return all;
}

// The CPU tests' common ground (the ops' CPU path is their fp32 reference): a
// test says `using namespace perftrain::testing::row_ops::cpu;`.
namespace cpu {

using row_ops::gen;
using row_ops::kUses;
using row_ops::outputs_and_grads;
using row_ops::Shape;
using row_ops::Use;

// A single row, odd and even widths, several samples and tokens.
inline const std::vector<Shape> kShapes = {{1, 1, 37}, {2, 3, 200}, {3, 5, 64}, {2, 9, 1000}};

// f(shape, x_dtype, row_dtype, act_dtype, generator) for every shape and the
// storage dtypes the CPU tests cross: x fp32 or bf16, the per-sample rows
// (gate, shift, scale) fp32, bf16 or fp16, the activations (y, or the output)
// fp32 or bf16; a seeded generator each.
template <typename F>
void for_each_dtypes(F&& f) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes)
    for (const auto x_dt : {at::kFloat, at::kBFloat16})
      for (const auto m_dt : {at::kFloat, at::kBFloat16, at::kHalf})
        for (const auto a_dt : {at::kFloat, at::kBFloat16}) {
          at::Generator g = gen(seed++);
          f(s, x_dt, m_dt, a_dt, g);
        }
}

// f(leaves) on fresh leaves that require grad (clones of `inputs`): its
// output (detached), then the inputs' gradients for the upstream gradient dout.
template <typename F>
std::vector<at::Tensor> output_and_grads(const std::vector<at::Tensor>& inputs, const at::Tensor& dout, F&& f) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.clone().requires_grad_(true));
  const at::Tensor out = f(leaves);
  std::vector<at::Tensor> all = torch::autograd::grad({out}, leaves, {dout});
  all.insert(all.begin(), out.detach());
  return all;
}

// "shape [b,t,d] ": the start of a failure message.
inline std::string shape_name(const Shape& s) { return "shape " + row_ops::name(s) + " "; }

}  // namespace cpu

}  // namespace perftrain::testing::row_ops
