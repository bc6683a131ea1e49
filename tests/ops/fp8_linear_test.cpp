// fp8_linear on the CPU: the fp32 reference (quantise, dequantise, multiply)
// against float64 products of the unquantised values within fp8's error
// bound on odd sizes (and visibly quantised: not within bf16's); the
// autograd function (hand-written backward, the CPU casts) against the
// reference; the casts' amaxes recorded in the layer's state and a scaling
// update from them; a weight given as row blocks equal to the op on their
// concatenation bit for bit; bad arguments and bad blocks raise UsageError.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/fp8_linear.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using perftrain::testing::rel_err;

const at::Device kCpu(at::kCPU);

// Unit roundoffs: 3 and 2 mantissa bits.
constexpr double kE4M3Unit = 1.0 / 16, kE5M2Unit = 1.0 / 8;

struct Shape {
  std::vector<int64_t> x;
  int64_t n;
};
const std::vector<Shape> kShapes = {{{7, 37}, 13}, {{2, 3, 40}, 24}, {{33, 64}, 48}, {{1, 17}, 5}};

std::string name(const Shape& s) {
  std::string r = "x [";
  for (size_t i = 0; i < s.x.size(); ++i) r += (i ? "," : "") + std::to_string(s.x[i]);
  return r + "] N=" + std::to_string(s.n);
}

struct Inputs {
  at::Tensor x, w, b, dy;
};

// x ~ N(0.3, 2^2), W ~ N(0, 1/K), b ~ N(0, 1), dy ~ N(0, 10^-3^2) (a gradient's scale).
Inputs make_inputs(const Shape& s, uint64_t seed) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(seed);
  const int64_t k = s.x.back();
  Inputs in;
  in.x = at::randn(s.x, g) * 2 + 0.3;
  in.w = at::randn({s.n, k}, g) / std::sqrt(double(k));
  in.b = at::randn({s.n}, g);
  std::vector<int64_t> ys = s.x;
  ys.back() = s.n;
  in.dy = at::randn(ys, g) * 1e-3;
  return in;
}

// The delayed scales a previous step with these tensors would give.
Fp8Scaling calibrated(const Inputs& in) {
  Fp8Scaling s = make_fp8_linear_scaling(4, kCpu);
  s.amax[kFp8X].fill_(in.x.abs().max().item<float>());
  s.amax[kFp8W].fill_(in.w.abs().max().item<float>());
  s.amax[kFp8Dy].fill_(in.dy.abs().max().item<float>());
  fp8_scaling_update({&s}, 0);
  return s;
}

// {y, dx, dW, db} of fp8_linear at the inputs.
std::vector<at::Tensor> run_op(const Inputs& in, const Fp8Scaling& s) {
  const at::Tensor x = in.x.clone().requires_grad_(true), w = in.w.clone().requires_grad_(true),
                   b = in.b.clone().requires_grad_(true);
  const at::Tensor y = fp8_linear(x, w, b, s);
  const auto grads = torch::autograd::grad({y}, {x, w, b}, {in.dy});
  return {y.detach(), grads[0], grads[1], grads[2]};
}

std::vector<at::Tensor> run_reference(const Inputs& in, const Fp8Scaling& s) {
  const Fp8LinearGrads g = fp8_linear_backward_reference(in.dy, in.x, in.w, s);
  return {fp8_linear_reference(in.x, in.w, in.b, s), g.dx, g.dw, g.db};
}

const char* kWhat[] = {"y", "dx", "dW", "db"};

// Relative L2 bounds: the sum of the two operands' unit roundoffs (each
// element's relative error is at most that, to first order); db is not
// quantised. And at least 2^-9 for the products: fp8 was really used.
TEST(Fp8Linear, ReferenceIsWithinFp8ErrorOfFloat64) {
  uint64_t seed = 1;
  for (const Shape& sh : kShapes) {
    const Inputs in = make_inputs(sh, seed++);
    const Fp8Scaling s = calibrated(in);
    const auto got = run_reference(in, s);
    const at::Tensor x = in.x.to(at::kDouble), w = in.w.to(at::kDouble), dy = in.dy.to(at::kDouble);
    const int64_t k = sh.x.back();
    const std::vector<at::Tensor> want = {at::matmul(x, w.t()) + in.b.to(at::kDouble), at::matmul(dy, w),
                                          at::matmul(dy.reshape({-1, sh.n}).t(), x.reshape({-1, k})),
                                          dy.reshape({-1, sh.n}).sum(0)};
    const double bound[] = {2 * kE4M3Unit, kE5M2Unit + kE4M3Unit, kE5M2Unit + kE4M3Unit, 1e-6};
    for (int i = 0; i < 4; ++i) {
      const double err = rel_err(got[i], want[i]);
      EXPECT_LT(err, bound[i]) << name(sh) << " " << kWhat[i];
      if (i < 3) EXPECT_GT(err, 1.0 / 512) << name(sh) << " " << kWhat[i] << ": no quantisation error";
    }
  }
}

TEST(Fp8Linear, CpuFunctionMatchesTheReference) {
  uint64_t seed = 10;
  for (const Shape& sh : kShapes) {
    const Inputs in = make_inputs(sh, seed++);
    const Fp8Scaling s = calibrated(in);
    const auto got = run_op(in, s);
    const auto want = run_reference(in, s);
    EXPECT_EQ(got[0].sizes(), want[0].sizes());
    for (int i = 0; i < 4; ++i) expect_close(got[i], want[i], 1e-6, 1e-5, name(sh) + " " + kWhat[i]);
  }
}

// Forward records x's and W's amax, backward dY's; the update turns them
// into the next step's scales.
TEST(Fp8Linear, CastsRecordTheAmaxesInTheState) {
  const Inputs in = make_inputs({{5, 24}, 16}, 3);
  Fp8Scaling s = make_fp8_linear_scaling(2, kCpu);
  run_op(in, s);
  const float ax = in.x.abs().max().item<float>(), aw = in.w.abs().max().item<float>(),
              ad = in.dy.abs().max().item<float>();
  EXPECT_EQ(s.amax[kFp8X].item<float>(), ax);
  EXPECT_EQ(s.amax[kFp8W].item<float>(), aw);
  EXPECT_EQ(s.amax[kFp8Dy].item<float>(), ad);
  fp8_scaling_update({&s}, 0);
  EXPECT_EQ(s.scale[kFp8X].item<float>(), 448.f / ax);
  EXPECT_EQ(s.scale[kFp8Dy].item<float>(), 57344.f / ad);
  EXPECT_EQ(s.amax.abs().sum().item<float>(), 0.f);
}

TEST(Fp8Linear, Bf16InputGivesBf16OutputAndFp32WeightGradient) {
  Inputs in = make_inputs({{2, 3, 40}, 24}, 4);
  in.w = in.w.to(at::kBFloat16).to(at::kFloat);  // the op quantises W's bf16 copy: the same values
  const Fp8Scaling s = calibrated(in);
  const at::Tensor x = in.x.to(at::kBFloat16).requires_grad_(true), w = in.w.clone().requires_grad_(true);
  const at::Tensor y = fp8_linear(x, w, at::Tensor(), s);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const auto grads = torch::autograd::grad({y}, {x, w}, {in.dy.to(at::kBFloat16)});
  EXPECT_EQ(grads[0].scalar_type(), at::kBFloat16);
  EXPECT_EQ(grads[1].scalar_type(), at::kFloat);
  // What remains is y's rounding to bf16.
  EXPECT_LT(rel_err(y, fp8_linear_reference(in.x.to(at::kBFloat16), in.w, at::Tensor(), s)), 1e-2);
}

TEST(Fp8Linear, BadArgumentsRaiseUsageError) {
  const at::Tensor x = at::zeros({4, 16}), w = at::zeros({8, 16});
  const Fp8Scaling s = make_fp8_linear_scaling(2, kCpu);
  EXPECT_THROW(fp8_linear(x.to(at::kHalf), w, at::Tensor(), s), UsageError);
  EXPECT_THROW(fp8_linear(x, at::zeros({8, 12}), at::Tensor(), s), UsageError);
  EXPECT_THROW(fp8_linear(x, w, at::zeros({7}), s), UsageError);
  EXPECT_THROW(fp8_linear(x, w, at::Tensor(), make_fp8_scaling({Fp8Format::kE4M3}, 2, kCpu)), UsageError);
  EXPECT_TRUE(fp8_linear_supported(at::zeros({3, 5}), at::zeros({7, 5}))) << "the CPU takes any sizes";
}

// A weight given as row blocks [N_i, K] trains as their concatenation, bit for
// bit: y, dX, each block's dW (its rows of the concatenation's), the state's
// amax (the W slot's the max over every block: the largest value put in the
// last block), with x given as values and as codes, fp32 and bf16.
TEST(Fp8Linear, RowBlocksTrainAsTheirConcatenationBitForBit) {
  struct Case {
    std::vector<int64_t> x, rows;
  };
  const std::vector<Case> cases = {{{7, 37}, {13, 5, 21}}, {{2, 3, 48}, {32, 16}}, {{33, 16}, {1, 16}}};
  uint64_t seed = 40;
  for (const Case& c : cases)
    for (const at::ScalarType dt : {at::kFloat, at::kBFloat16})
      for (const bool codes : {false, true}) {
        at::Generator g = perftrain::testing::seeded_cpu_generator(seed++);
        const int64_t k = c.x.back();
        std::vector<at::Tensor> blocks;
        for (const int64_t r : c.rows) blocks.push_back(at::randn({r, k}, g) / std::sqrt(double(k)));
        blocks.back()[0][0] = 5.f;  // the W amax lies in the last block
        const at::Tensor x0 = (at::randn(c.x, g) * 2 + 0.3).to(dt);
        int64_t n = 0;
        for (const int64_t r : c.rows) n += r;
        std::vector<int64_t> ys = c.x;
        ys.back() = n;
        const at::Tensor dy = (at::randn(ys, g) * 1e-3).to(dt);
        const std::string what = name({c.x, n}) + (dt == at::kFloat ? " fp32" : " bf16") + (codes ? " codes" : "");
        // Both runs from the same calibrated scales, their amax zeroed.
        Fp8Scaling s_blocks = make_fp8_linear_scaling(4, kCpu);
        s_blocks.amax.fill_(1.5f);
        fp8_scaling_update({&s_blocks}, 0);
        Fp8Scaling s_cat = make_fp8_linear_scaling(4, kCpu);
        s_cat.amax.fill_(1.5f);
        fp8_scaling_update({&s_cat}, 0);
        const auto run = [&](bool as_blocks, const Fp8Scaling& s) {
          const at::Tensor x = x0.clone().requires_grad_(true);
          std::vector<at::Tensor> ws;
          for (const at::Tensor& b : blocks) ws.push_back(b.clone().requires_grad_(true));
          const Fp8Operand op = codes ? fp8_operand_of(x, fp8_linear_input_target(s), "x") : Fp8Operand{x, at::Tensor()};
          const at::Tensor y = as_blocks ? fp8_linear(op, ws, s) : fp8_linear(op, at::cat(ws, 0), at::Tensor(), s);
          std::vector<at::Tensor> inputs = {x};
          inputs.insert(inputs.end(), ws.begin(), ws.end());
          std::vector<at::Tensor> out = torch::autograd::grad({y}, inputs, {dy});
          out.insert(out.begin(), y.detach());
          return out;
        };
        const std::vector<at::Tensor> got = run(true, s_blocks), want = run(false, s_cat);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what << " output " << i;
          EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what << " output " << i;
          EXPECT_TRUE(at::equal(got[i], want[i])) << what << " output " << i << " (y, dx, dW_0, ...)";
        }
        EXPECT_TRUE(at::equal(s_blocks.amax, s_cat.amax)) << what;
        EXPECT_EQ(s_blocks.amax[kFp8W].item<float>(), 5.f) << what;
      }
}

TEST(Fp8Linear, BadRowBlocksRaiseUsageError) {
  const at::Tensor x = at::zeros({4, 16}), w = at::zeros({8, 16});
  const Fp8Scaling s = make_fp8_linear_scaling(2, kCpu);
  const auto message = [&](const std::vector<at::Tensor>& ws) -> std::string {
    try {
      fp8_linear(x, ws, s);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({}).find("empty"), std::string::npos) << message({});
  EXPECT_NE(message({w, at::zeros({8, 12})}).find("share K"), std::string::npos);
  EXPECT_NE(message({w, w.to(at::kBFloat16)}).find("share one dtype"), std::string::npos);
  EXPECT_NE(message({w, at::zeros({8})}).find("row block 1"), std::string::npos);
  EXPECT_NE(message({at::zeros({8, 12}), at::zeros({8, 12})}).find("fp8_linear"), std::string::npos)
      << "blocks that share a K other than x's";
  EXPECT_EQ(message({w, w}).find("\n"), std::string::npos);
  EXPECT_NO_THROW(fp8_linear(x, {w, w}, s));
}

}  // namespace
}  // namespace perftrain::ops
