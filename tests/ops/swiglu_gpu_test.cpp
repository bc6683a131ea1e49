// On a GPU: swiglu's kernels against the reference computed in float64 on the
// same (upcast) stored inputs, forward and backward, at bf16, fp16 and fp32:
// the DiT MLP widths (F = 1024, 1536, 3072), 8/3-of-hidden widths (2048, 2752),
// odd F (1001, 3, 1), one row, 3-d inputs, more rows than one grid covers;
// each access width of the kernels (8, 4, 2, 1 elements) on NaN-poisoned
// outputs; bit-identical reruns; saturating gates (|g| ~ 100: exp overflows)
// give finite results; forward + backward captured in a CUDA graph. Every
// failure prints the largest error. swiglu_product (the gate-up product with
// SwiGLU in its epilogue where it applies): the fused kernel directly and the
// op against float64 at SS-B/2 and SS-XL/2 widths, bit-identical reruns,
// captured == eager, the fallback (odd rows, fp32) bit for bit today's
// composition. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/swiglu.h"
#include "ops/dtype_dispatch.h"
#include "ops/gemm_bias_gelu.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"
#include "ops/swiglu.h"
#include "support/graph_checks.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

const std::vector<at::ScalarType> kDtypes = {at::kBFloat16, at::kHalf, at::kFloat};

std::string name(at::IntArrayRef s, at::ScalarType dt) {
  std::ostringstream o;
  o << c10::toString(dt) << " gate_up " << s << " ";
  return o.str();
}

std::vector<int64_t> half_last(at::IntArrayRef s) {
  std::vector<int64_t> o(s.begin(), s.end());
  o.back() /= 2;
  return o;
}

// Tolerances against float64, elementwise |got - ref| <= tol + tol * |ref|:
// bf16/fp16 2e-2 (one rounding of the result, <= 2^-9 relative, plus
// nothing else: the inputs are the stored values); fp32 1e-5 (expf and a
// few roundings, ~1e-6 relative).
double tolerance(at::ScalarType dt) { return dt == at::kFloat ? 1e-5 : 2e-2; }

// The float64 reference on gate_up's stored values: out, d(gate_up).
std::pair<at::Tensor, at::Tensor> reference64(const at::Tensor& gate_up, const at::Tensor& dout) {
  const at::Tensor gu64 = gate_up.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor out64 = swiglu_reference(gu64);
  const at::Tensor d64 = torch::autograd::grad({out64}, {gu64}, {dout.detach().to(at::kDouble)})[0];
  return {out64.detach(), d64};
}

// The op's out and d(gate_up) for this gate_up and incoming gradient.
std::pair<at::Tensor, at::Tensor> run_op(const at::Tensor& gate_up, const at::Tensor& dout) {
  const at::Tensor leaf = gate_up.detach().requires_grad_(true);
  const at::Tensor out = swiglu(leaf);
  const at::Tensor d = torch::autograd::grad({out}, {leaf}, {dout})[0];
  return {out.detach(), d};
}

void check_against_float64(const at::Tensor& gate_up, const at::Tensor& dout, const std::string& where) {
  const auto [out, d] = run_op(gate_up, dout);
  ASSERT_EQ(out.scalar_type(), gate_up.scalar_type()) << where;
  ASSERT_EQ(d.scalar_type(), gate_up.scalar_type()) << where;
  ASSERT_EQ(out.sizes(), at::IntArrayRef(half_last(gate_up.sizes()))) << where;
  ASSERT_EQ(d.sizes(), gate_up.sizes()) << where;
  const auto [out64, d64] = reference64(gate_up, dout);
  const double tol = tolerance(gate_up.scalar_type());
  expect_close(out, out64, where + "out", tol);
  const int64_t f = gate_up.size(-1) / 2;
  expect_close(d.narrow(-1, 0, f), d64.narrow(-1, 0, f), where + "d(gate)", tol);
  expect_close(d.narrow(-1, f, f), d64.narrow(-1, f, f), where + "d(up)", tol);
  // Rerun: the same bits.
  const auto [out2, d2] = run_op(gate_up, dout);
  EXPECT_TRUE(at::equal(out, out2)) << where << "forward rerun not bit-identical";
  EXPECT_TRUE(at::equal(d, d2)) << where << "backward rerun not bit-identical";
}

TEST(SwigluGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const std::vector<std::vector<int64_t>> shapes = {
      {256, 2 * 1024}, {1, 2 * 1024}, {300, 2 * 1536}, {128, 2 * 3072}, {64, 2 * 2048}, {33, 2 * 2752},
      {37, 2 * 1001},  {1, 2 * 1001}, {5, 2 * 3},      {7, 2 * 1},      {2, 256, 2 * 1024}, {3, 17, 2 * 1001}};
  uint64_t seed = 100;
  for (const at::ScalarType dt : kDtypes)
    for (const auto& s : shapes) {
      at::Generator g = gen(seed++);
      const at::Tensor gu = rnd(s, g, dt, 2.0);
      const at::Tensor dout = rnd(half_last(s), g, dt);
      check_against_float64(gu, dout, name(s, dt));
    }
}

// DiT-sized calls (B*T = 8192 rows; F = 3072, 8/3 of 1152) and more rows than
// one grid covers (at F = 3 a block holds 64 rows and the grid at most 65536
// blocks, so the blocks stride over the rest): bf16, the training dtype.
TEST(SwigluGpu, LargeRowCounts) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 300;
  for (const std::vector<int64_t> s : {std::vector<int64_t>{8192, 2 * 3072}, std::vector<int64_t>{4194381, 2 * 3}}) {
    at::Generator g = gen(seed++);
    const at::Tensor gu = rnd(s, g, at::kBFloat16, 2.0);
    const at::Tensor dout = rnd(half_last(s), g, at::kBFloat16);
    check_against_float64(gu, dout, name(s, at::kBFloat16));
  }
}

// The kernels called directly for every access width, into NaN-filled
// outputs (an element they forget fails as NaN): widths by F and by the
// pointers' alignment (gate_up, out and dout start `offset` elements into
// their buffers), each checked against float64.
TEST(SwigluGpu, KernelsWriteEveryElementAtEachVectorWidth) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const c10::cuda::CUDAGuard guard(kCuda);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  struct Case {
    int64_t rows, f, offset;
  };
  const std::vector<Case> cases = {{65, 1024, 0}, {65, 1024, 1}, {65, 1024, 2}, {65, 1024, 4}, {19, 1028, 0},
                                   {19, 1030, 0}, {19, 1001, 0}, {3, 8, 0},     {3, 4, 0},     {3, 2, 0}};
  uint64_t seed = 500;
  for (const at::ScalarType dt : kDtypes) {
    std::set<int> widths;
    for (const Case& c : cases) {
      const std::string where = name({c.rows, 2 * c.f}, dt) + "offset " + std::to_string(c.offset) + " ";
      at::Generator g = gen(seed++);
      const at::Tensor gu_buf = rnd({c.rows * 2 * c.f + c.offset}, g, dt, 2.0);
      const at::Tensor dout_buf = rnd({c.rows * c.f + c.offset}, g, dt);
      at::Tensor out_buf = nan_like({c.rows * c.f + c.offset}, dt);
      at::Tensor d_buf = nan_like({c.rows * 2 * c.f + c.offset}, dt);
      const at::Tensor gu = gu_buf.narrow(0, c.offset, c.rows * 2 * c.f).view({c.rows, 2 * c.f});
      const at::Tensor dout = dout_buf.narrow(0, c.offset, c.rows * c.f).view({c.rows, c.f});
      at::Tensor out = out_buf.narrow(0, c.offset, c.rows * c.f).view({c.rows, c.f});
      at::Tensor d = d_buf.narrow(0, c.offset, c.rows * 2 * c.f).view({c.rows, 2 * c.f});
      with_kernel_type("test", dt, [&](auto tp) {
        using T = kernel_type<decltype(tp)>;
        const int w = kernels::swiglu_vector_width<T>(int(c.f), gu.data_ptr(), out.data_ptr(), nullptr);
        EXPECT_EQ(w, kernels::swiglu_vector_width<T>(int(c.f), dout.data_ptr(), gu.data_ptr(), d.data_ptr()))
            << where;
        widths.insert(w);
        kernels::swiglu_forward<T>(kernel_ptr<const T>(gu), kernel_ptr<T>(out), c.rows, int(c.f), stream);
        kernels::swiglu_backward<T>(kernel_ptr<const T>(dout), kernel_ptr<const T>(gu), kernel_ptr<T>(d), c.rows,
                                    int(c.f), stream);
      });
      const auto [out64, d64] = reference64(gu, dout);
      const double tol = tolerance(dt);
      expect_close(out, out64, where + "kernel out", tol);
      expect_close(d, d64, where + "kernel d(gate_up)", tol);
      // Nothing outside the views was written.
      if (c.offset > 0) {
        EXPECT_TRUE(out_buf.narrow(0, 0, c.offset).isnan().all().item<bool>()) << where;
        EXPECT_TRUE(d_buf.narrow(0, 0, c.offset).isnan().all().item<bool>()) << where;
      }
      // The op on the same (possibly misaligned) views: the same values.
      check_against_float64(gu, dout, where + "op ");
    }
    EXPECT_EQ(widths, (std::set<int>{1, 2, 4, 8})) << c10::toString(dt) << ": not every access width was taken";
  }
}

// Gates around and beyond exp's overflow (|g| up to 100, in every dtype):
// s = sigmoid(g) becomes exactly 0 or 1, and out and d(gate_up) stay finite
// and match float64.
TEST(SwigluGpu, SaturatingGatesGiveFiniteResults) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 700;
  const int64_t rows = 64, f = 1024;
  for (const at::ScalarType dt : kDtypes)
    for (const int64_t odd : {0, 1}) {  // the vector path and the scalar one
      const int64_t ff = f + odd;
      at::Generator g = gen(seed++);
      at::Tensor gate = rnd({rows, ff}, g, at::kFloat, 100.0);
      // Exact extremes too: +-100, +-88.7 (fp32 exp's overflow), +-90.
      const at::Tensor edge = at::tensor({100.0, -100.0, 88.72, -88.72, 90.0, -90.0, 87.0, -87.0},
                                         at::TensorOptions().dtype(at::kFloat).device(kCuda));
      gate.narrow(0, 0, 1).narrow(1, 0, 8).copy_(edge.view({1, 8}));
      const at::Tensor up = rnd({rows, ff}, g, at::kFloat, 2.0);
      const at::Tensor gu = at::cat({gate, up}, 1).to(dt);
      const at::Tensor dout = rnd({rows, ff}, g, dt);
      const std::string where = name(gu.sizes(), dt) + "saturating ";
      const auto [out, d] = run_op(gu, dout);
      EXPECT_TRUE(at::isfinite(out).all().item<bool>()) << where << "non-finite out";
      EXPECT_TRUE(at::isfinite(d).all().item<bool>()) << where << "non-finite d(gate_up)";
      check_against_float64(gu, dout, where);
    }
}

// Forward and backward (behind an ATen op on each side) captured in one CUDA
// graph and replayed: no host sync, no data-dependent allocation, and the
// replays give the eager results bit for bit.
TEST(SwigluGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const at::ScalarType dt : kDtypes)
    for (const int64_t f : {1024, 1001}) {
      at::Generator g = gen(900 + f);
      const at::Tensor gu0 = rnd({4, 64, 2 * f}, g, dt, 2.0).requires_grad_(true);
      const at::Tensor dout = rnd({4, 64, f}, g, dt);
      auto step = [&] {
        const at::Tensor out = swiglu(gu0 * 1.5) * 2;
        const at::Tensor d = torch::autograd::grad({out}, {gu0}, {dout})[0];
        return std::vector<at::Tensor>{out.detach(), d};
      };
      perftrain::testing::expect_graph_replays_match_eager(step, name(gu0.sizes(), dt));
    }
}

// Bad inputs on the GPU: fp64 (the reference only) and an odd last dimension.
// swiglu_linear (the activation not kept, made again in backward) against
// the composition linear(swiglu(.)) on the same inputs: the same kernels and
// products in the same order, so the output, d(gate_up) and the weight
// gradient are bit-identical; bf16 and fp32, the SS-B/2 width (F = 2048 into
// 768) and odd sizes, with the fp32 master weight as the leaf. Prints the
// largest differences on failure.
TEST(SwigluGpu, SwigluLinearEqualsTheCompositionBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(17);
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA, 0);
  struct Shape {
    int64_t rows, f, n;
  };
  for (const at::ScalarType dt : {at::kBFloat16, at::kFloat}) {
    for (const Shape sh : {Shape{4 * 288, 2048, 768}, Shape{37, 1001, 24}, Shape{1, 64, 8}}) {
      const at::Tensor gate_up = at::randn({sh.rows, 2 * sh.f}, g, cuda).to(dt);
      const at::Tensor w = at::randn({sh.n, sh.f}, g, cuda) * 0.05;
      const at::Tensor gout = at::randn({sh.rows, sh.n}, g, cuda).to(dt);
      const auto run = [&](bool fused) {
        const at::Tensor x = gate_up.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
        const at::Tensor y = fused ? swiglu_linear(x, wl) : ops::linear(swiglu(x), wl);
        const auto d = torch::autograd::grad({y}, {x, wl}, {gout});
        return std::vector<at::Tensor>{y.detach(), d[0], d[1]};
      };
      const auto got = run(true), want = run(false);
      const char* what[] = {"output", "d(gate_up)", "d(weight)"};
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what[i];
        EXPECT_TRUE(at::equal(got[i], want[i]))
            << c10::toString(dt) << " rows " << sh.rows << " F " << sh.f << " N " << sh.n << ": " << what[i]
            << " differs by up to " << (got[i].to(at::kFloat) - want[i].to(at::kFloat)).abs().max().item<float>()
            << " (of " << want[i].abs().max().item<float>() << ")";
      }
    }
  }
}

TEST(SwigluGpu, BadInputsRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  EXPECT_THROW(swiglu(at::randn({4, 8}).to(kCuda).to(at::kDouble)), UsageError);
  EXPECT_THROW(swiglu(at::randn({4, 7}).to(kCuda)), UsageError);
  EXPECT_THROW(swiglu(at::randn({4, 8}).to(kCuda).to(at::kInt)), UsageError);
}

// The single-stream FFN's widths: SS-B/2 (K = 768, F = 2048) and SS-XL/2
// (K = 1152, F = 3072) at 16 samples of 256 + 32 tokens (4608 rows: the
// fused kernel's shape), and odd rows (the fallback).
struct ProductShape {
  int64_t rows, k, f;
};
const ProductShape kSsB2{16 * 288, 768, 2048}, kSsXl2{16 * 288, 1152, 3072}, kOddRows{4 * 288 + 5, 768, 2048};

std::string name(const ProductShape& s) {
  return "rows " + std::to_string(s.rows) + " K " + std::to_string(s.k) + " F " + std::to_string(s.f) + " ";
}

// The inputs: x [rows, K] in dt, the fp32 master weights gate_w, up_w [F, K]
// and down_w [K, F] (0.05: gate_up ~ O(1)), the incoming gradients of h
// [rows, F] and of down's output [rows, K].
struct ProductInputs {
  at::Tensor x, gate_w, up_w, down_w, dh, dy;
};
ProductInputs product_inputs(const ProductShape& s, at::ScalarType dt, uint64_t seed) {
  at::Generator g = gen(seed);
  return {rnd({s.rows, s.k}, g, dt),         rnd({s.f, s.k}, g, at::kFloat, 0.05), rnd({s.f, s.k}, g, at::kFloat, 0.05),
          rnd({s.k, s.f}, g, at::kFloat, 0.05), rnd({s.rows, s.f}, g, dt),          rnd({s.rows, s.k}, g, dt)};
}

// What runs: swiglu_product, or the composition swiglu(stacked_linear(...))
// the single-stream branch ran before it; with down: swiglu_product_linear,
// or swiglu_linear(stacked_linear(...)).
enum class Path { kOp, kComposition, kOpDown, kCompositionDown };

// The output and the gradients of x, gate_w, up_w (and down_w).
std::vector<at::Tensor> product_run(const ProductInputs& in, Path path) {
  const at::Tensor x = in.x.clone().requires_grad_(true), gw = in.gate_w.clone().requires_grad_(true),
                   uw = in.up_w.clone().requires_grad_(true), dw = in.down_w.clone().requires_grad_(true);
  at::Tensor y;
  switch (path) {
    case Path::kOp: y = swiglu_product(x, gw, uw); break;
    case Path::kComposition: y = swiglu(stacked_linear(x, {gw, uw})); break;
    case Path::kOpDown: y = swiglu_product_linear(x, gw, uw, dw); break;
    case Path::kCompositionDown: y = swiglu_linear(stacked_linear(x, {gw, uw}), dw); break;
  }
  const bool down = path == Path::kOpDown || path == Path::kCompositionDown;
  if (!down) {
    const auto d = torch::autograd::grad({y}, {x, gw, uw}, {in.dh});
    return {y.detach(), d[0], d[1], d[2]};
  }
  const auto d = torch::autograd::grad({y}, {x, gw, uw, dw}, {in.dy});
  return {y.detach(), d[0], d[1], d[2], d[3]};
}

// The same in float64 on the stored values (x as given, the weights rounded
// to x's dtype as the op's compute copies are); with down or not.
std::vector<at::Tensor> product_reference64(const ProductInputs& in, bool down) {
  const at::ScalarType dt = in.x.scalar_type();
  const auto leaf = [dt](const at::Tensor& t) { return t.to(dt).to(at::kDouble).requires_grad_(true); };
  const at::Tensor x = leaf(in.x), gw = leaf(in.gate_w), uw = leaf(in.up_w), dw = leaf(in.down_w);
  const at::Tensor h = at::silu(at::matmul(x, gw.t())) * at::matmul(x, uw.t());
  if (!down) {
    const auto d = torch::autograd::grad({h}, {x, gw, uw}, {in.dh.to(at::kDouble)});
    return {h.detach(), d[0], d[1], d[2]};
  }
  const at::Tensor y = at::matmul(h, dw.t());
  const auto d = torch::autograd::grad({y}, {x, gw, uw, dw}, {in.dy.to(at::kDouble)});
  return {y.detach(), d[0], d[1], d[2], d[3]};
}

// The kernel itself (through ops::try_gemm_swiglu_sm90, which must take these
// shapes on an H100/H200) against float64: gate_up and h elementwise (one
// bf16 rounding each, h from the fp32 products), on NaN-filled outputs.
TEST(SwigluProductGpu, FusedKernelMatchesFloat64) {
  if (!compat::cuda_available() || !compat::current_device_is_sm90()) GTEST_SKIP() << "no sm_90 GPU";
  uint64_t seed = 700;
  for (const ProductShape& s : {kSsB2, kSsXl2, ProductShape{128, 64, 64}}) {
    const ProductInputs in = product_inputs(s, at::kBFloat16, seed++);
    const at::Tensor w = at::cat({in.gate_w, in.up_w}, 0).to(at::kBFloat16);
    const at::Tensor gate_up = nan_like({s.rows, 2 * s.f}, at::kBFloat16), h = nan_like({s.rows, s.f}, at::kBFloat16);
    ASSERT_TRUE(try_gemm_swiglu_sm90(in.x, w, gate_up, h)) << name(s) << "the kernel refused its shape";
    const at::Tensor gu64 = at::matmul(in.x.to(at::kDouble), w.to(at::kDouble).t());
    const at::Tensor h64 = at::silu(gu64.narrow(1, 0, s.f)) * gu64.narrow(1, s.f, s.f);
    expect_close(gate_up, gu64, name(s) + "gate_up");
    expect_close(h, h64, name(s) + "h");
    const at::Tensor gate_up2 = nan_like({s.rows, 2 * s.f}, at::kBFloat16), h2 = nan_like({s.rows, s.f}, at::kBFloat16);
    ASSERT_TRUE(try_gemm_swiglu_sm90(in.x, w, gate_up2, h2));
    EXPECT_TRUE(at::equal(gate_up, gate_up2) && at::equal(h, h2)) << name(s) << "rerun not bit-identical";
  }
  EXPECT_FALSE(try_gemm_swiglu_sm90(at::zeros({129, 64}, at::TensorOptions(kCuda).dtype(at::kBFloat16)),
                                    at::zeros({128, 64}, at::TensorOptions(kCuda).dtype(at::kBFloat16)),
                                    nan_like({129, 128}, at::kBFloat16), nan_like({129, 64}, at::kBFloat16)));
}

// swiglu_product and swiglu_product_linear, forward and backward, against
// float64 (h elementwise; down's output and the gradients, sums of
// bf16-rounded terms, by relative L2), fused and fallback shapes; reruns
// give the same bits.
TEST(SwigluProductGpu, MatchesFloat64ForwardAndBackward) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 800;
  for (const ProductShape& s : {kSsB2, kSsXl2, kOddRows})
    for (const Path path : {Path::kOp, Path::kOpDown}) {
      const ProductInputs in = product_inputs(s, at::kBFloat16, seed++);
      const bool down = path == Path::kOpDown;
      const std::string where = name(s) + (down ? "with down " : "");
      const auto got = product_run(in, path), ref = product_reference64(in, down);
      const char* what[] = {down ? "y" : "h", "dx", "d(gate_w)", "d(up_w)", "d(down_w)"};
      if (down) expect_rel_l2(got[0], ref[0], where + what[0]);
      if (!down) expect_close(got[0], ref[0], where + what[0]);
      expect_rel_l2(got[1], ref[1], where + what[1]);
      // The weight gradients are fp32 sums of bf16 products (x, h and dy in
      // bf16): bf16's bound, not fp32's (measured 2.4e-3 to 3.1e-3).
      for (size_t i = 2; i < got.size(); ++i) expect_rel_l2(got[i], ref[i], where + what[i], 1e-2);
      expect_same_bits(product_run(in, path), got, where);
    }
}

// Where the fused kernel does not apply (odd rows; fp32) the ops are the
// compositions the branch ran before them, bit for bit, forward and backward.
TEST(SwigluProductGpu, FallbackIsTheCompositionBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 900;
  for (const auto& [s, dt] : {std::pair{kOddRows, at::kBFloat16}, std::pair{ProductShape{256, 96, 192}, at::kFloat}}) {
    const ProductInputs in = product_inputs(s, dt, seed++);
    const std::string where = name(s) + c10::toString(dt) + " ";
    expect_same_bits(product_run(in, Path::kOp), product_run(in, Path::kComposition), where);
    expect_same_bits(product_run(in, Path::kOpDown), product_run(in, Path::kCompositionDown), where + "with down ");
  }
}

// Forward and backward captured in a CUDA graph and replayed give the eager
// results bit for bit (the fused kernel at SS-B/2's width, and the fallback).
TEST(SwigluProductGpu, CapturedEqualsEager) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1000;
  for (const ProductShape& s : {ProductShape{4 * 288, 768, 2048}, ProductShape{4 * 288 + 5, 768, 2048}}) {
    const ProductInputs in = product_inputs(s, at::kBFloat16, seed++);
    for (const Path path : {Path::kOp, Path::kOpDown})
      perftrain::testing::expect_graph_replays_match_eager([&] { return product_run(in, path); }, name(s));
  }
}

}  // namespace
}  // namespace perftrain::ops
