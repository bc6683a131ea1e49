// On a GPU: gated_residual (with and without a bias) against its reference
// computed in float64 on the same (upcast) inputs, forward and backward, over
// the DiT widths and odd ones; every element written (outputs pre-filled with
// NaN through the kernel launches), bit-identical reruns, and capture of
// forward + backward (after adaln_layernorm, as in a DiT block) in a CUDA
// graph. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/gated_residual.h"
#include "ops/adaln_layernorm.h"
#include "ops/gated_residual.h"
#include "support/graph_checks.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

const std::vector<Shape> kShapes = {{1, 1, 37}, {2, 3, 200}, {3, 256, 384}, {2, 256, 1152}, {4, 17, 1000},
                                    {256, 256, 384}};

struct GatedCase {
  at::ScalarType x, gate, y;
};
const std::vector<GatedCase> kGatedCases = {{at::kFloat, at::kBFloat16, at::kBFloat16},
                                            {at::kFloat, at::kFloat, at::kFloat},
                                            {at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                            {at::kFloat, at::kHalf, at::kHalf},
                                            {at::kHalf, at::kFloat, at::kBFloat16}};

std::string name(const GatedCase& c) { return dtype_names({{"x", c.x}, {"gate", c.gate}, {"y", c.y}}); }

// Without a bias and with a random fp32 one (the folded bias of the linear
// layer that made y): out, dx, dgate, dy and dbias against float64. dbias is
// fp32 and sums B*T rows: expect_rel_l2's fp32 tolerance (1e-5).
TEST(GatedResidualGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1000;
  for (const GatedCase& c : kGatedCases) {
    for (const Shape& s : kShapes) {
      for (const bool with_bias : {false, true}) {
        const std::string where = name(c) + " " + name(s) + (with_bias ? " with bias " : " ");
        at::Generator g = gen(seed++);
        const at::Tensor mod = rnd({s.b, 6 * s.d}, g, c.gate, 0.5);
        const at::Tensor x = rnd({s.b, s.t, s.d}, g, c.x);
        const at::Tensor y = rnd({s.b, s.t, s.d}, g, c.y);
        const at::Tensor dout = rnd({s.b, s.t, s.d}, g, c.x);
        const at::Tensor bias = with_bias ? rnd({s.d}, g, at::kFloat) : at::Tensor();

        const at::Tensor x_l = x.detach().requires_grad_(true), y_l = y.detach().requires_grad_(true);
        const at::Tensor mod_l = mod.detach().requires_grad_(true);
        const at::Tensor b_l = with_bias ? bias.detach().requires_grad_(true) : at::Tensor();
        const at::Tensor gate = mod_l.chunk(6, 1)[2];
        std::vector<at::Tensor> inputs = {x_l, gate, y_l};
        if (with_bias) inputs.push_back(b_l);
        const at::Tensor out = gated_residual(x_l, gate, y_l, b_l);
        ASSERT_EQ(out.scalar_type(), c.x);
        const auto grads = torch::autograd::grad({out}, inputs, {dout});
        ASSERT_EQ(grads[1].scalar_type(), c.gate);
        ASSERT_EQ(grads[2].scalar_type(), c.y);

        const at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
        const at::Tensor gate64 = gate.detach().to(at::kDouble).requires_grad_(true);
        const at::Tensor y64 = y.to(at::kDouble).requires_grad_(true);
        const at::Tensor b64 = with_bias ? bias.to(at::kDouble).requires_grad_(true) : at::Tensor();
        std::vector<at::Tensor> inputs64 = {x64, gate64, y64};
        if (with_bias) inputs64.push_back(b64);
        const at::Tensor out64 = gated_residual_reference(x64, gate64, y64, b64);
        const auto ref = torch::autograd::grad({out64}, inputs64, {dout.to(at::kDouble)});

        expect_close(out, out64, where + "out");
        EXPECT_TRUE(at::equal(grads[0], dout)) << where << "dx must be dout itself";
        expect_rel_l2(grads[1], ref[1], where + "dgate");
        expect_close(grads[2], ref[2], where + "dy");
        if (with_bias) {
          ASSERT_EQ(grads[3].scalar_type(), at::kFloat) << where;
          expect_rel_l2(grads[3], ref[3], where + "dbias");
        }

        const at::Tensor out2 = gated_residual(x_l, gate, y_l, b_l);
        const auto grads2 = torch::autograd::grad({out2}, inputs, {dout});
        EXPECT_TRUE(at::equal(out, out2)) << where << "forward not bit-identical";
        for (size_t i = 0; i < grads.size(); ++i)
          EXPECT_TRUE(at::equal(grads[i], grads2[i])) << where << "grad " << i;
      }
    }
  }
}

// The bias's gradient when gate's is not wanted (the kernels then sum dout
// for dbias without the bias entering dgate), a bf16 bias (gradient in bf16),
// and dgate when the bias needs no gradient; against float64. Tolerances as
// above (expect_rel_l2 by the result's dtype).
TEST(GatedResidualGpu, BiasGradientAlone) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1500;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 256, 1152}, Shape{4, 17, 1000}}) {
    const std::string where = name(s) + " ";
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat), y = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
    const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16, 0.5), dout = rnd({s.b, s.t, s.d}, g, at::kFloat);
    const at::Tensor bias = rnd({s.d}, g, at::kBFloat16);
    const at::Tensor x64 = x.to(at::kDouble), y64 = y.to(at::kDouble).requires_grad_(true);
    const at::Tensor gate64 = gate.to(at::kDouble).requires_grad_(true);
    const at::Tensor b64 = bias.to(at::kDouble).requires_grad_(true);
    const auto ref = torch::autograd::grad({gated_residual_reference(x64, gate64, y64, b64)}, {gate64, y64, b64},
                                           {dout.to(at::kDouble)});
    {
      const at::Tensor yl = y.detach().requires_grad_(true), bl = bias.detach().requires_grad_(true);
      const auto gr = torch::autograd::grad({gated_residual(x, gate, yl, bl)}, {yl, bl}, {dout});
      ASSERT_EQ(gr[1].scalar_type(), at::kBFloat16) << where;
      expect_close(gr[0], ref[1], where + "dy (no dgate)");
      expect_rel_l2(gr[1], ref[2], where + "dbias (no dgate)");
    }
    {
      const at::Tensor gl = gate.detach().requires_grad_(true);
      const auto gr = torch::autograd::grad({gated_residual(x, gl, y, bias)}, {gl}, {dout});
      expect_rel_l2(gr[0], ref[0], where + "dgate (bias without gradient)");
    }
  }
}

// The kernel launches write every element of their outputs and read no
// scratch they did not write: outputs and scratch start as NaN, results must
// match the op (which is checked against the reference above) bit for bit.
TEST(GatedResidualGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  using bf16 = __nv_bfloat16;
  uint64_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 3, 200}, Shape{3, 256, 384}, Shape{4, 17, 1000}}) {
    const int b = int(s.b), t = int(s.t), d = int(s.d);
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat);
    const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16), yb = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
    at::Tensor out = nan_like({s.b, s.t, s.d}, at::kFloat);
    kernels::gated_residual_forward<float, bf16, bf16>(x.data_ptr<float>(), static_cast<const bf16*>(gate.data_ptr()),
                                                       d, static_cast<const bf16*>(yb.data_ptr()), nullptr,
                                                       out.data_ptr<float>(), b, t, d, launch.stream);
    EXPECT_TRUE(at::equal(out, gated_residual(x, gate, yb))) << name(s) << " gated forward";

    const at::Tensor dout = rnd({s.b, s.t, s.d}, g, at::kFloat);
    const int gtiles = kernels::gated_residual_backward_tiles(b, t, launch.sms);
    at::Tensor dyb = nan_like({s.b, s.t, s.d}, at::kBFloat16), dgate = nan_like({s.b, s.d}, at::kBFloat16);
    at::Tensor gpartials = nan_like({kernels::gated_residual_backward_partials(b, gtiles, d, false)}, at::kFloat);
    kernels::gated_residual_backward<float, bf16, bf16>(
        dout.data_ptr<float>(), static_cast<const bf16*>(gate.data_ptr()), d, static_cast<const bf16*>(yb.data_ptr()),
        nullptr, static_cast<bf16*>(dyb.data_ptr()), static_cast<bf16*>(dgate.data_ptr()), nullptr,
        gpartials.data_ptr<float>(), b, t, d, gtiles, launch.stream);
    {
      const at::Tensor gl = gate.detach().requires_grad_(true), yl = yb.detach().requires_grad_(true);
      const auto gr = torch::autograd::grad({gated_residual(x, gl, yl)}, {gl, yl}, {dout});
      EXPECT_TRUE(at::equal(dgate, gr[0])) << name(s) << " gated dgate";
      EXPECT_TRUE(at::equal(dyb, gr[1])) << name(s) << " gated dy";
    }

    // With a bias: the forward, and the backward's second partials plane and per-sample dbias.
    const at::Tensor bias = rnd({s.d}, g, at::kFloat);
    at::Tensor out_b = nan_like({s.b, s.t, s.d}, at::kFloat);
    kernels::gated_residual_forward<float, bf16, bf16>(x.data_ptr<float>(), static_cast<const bf16*>(gate.data_ptr()),
                                                       d, static_cast<const bf16*>(yb.data_ptr()),
                                                       bias.data_ptr<float>(), out_b.data_ptr<float>(), b, t, d,
                                                       launch.stream);
    EXPECT_TRUE(at::equal(out_b, gated_residual(x, gate, yb, bias))) << name(s) << " gated forward with bias";
    at::Tensor dyb_b = nan_like({s.b, s.t, s.d}, at::kBFloat16), dgate_b = nan_like({s.b, s.d}, at::kBFloat16);
    at::Tensor dbias_ps = nan_like({s.b, s.d}, at::kFloat);
    at::Tensor gpartials_b = nan_like({kernels::gated_residual_backward_partials(b, gtiles, d, true)}, at::kFloat);
    kernels::gated_residual_backward<float, bf16, bf16>(
        dout.data_ptr<float>(), static_cast<const bf16*>(gate.data_ptr()), d, static_cast<const bf16*>(yb.data_ptr()),
        bias.data_ptr<float>(), static_cast<bf16*>(dyb_b.data_ptr()), static_cast<bf16*>(dgate_b.data_ptr()),
        dbias_ps.data_ptr<float>(), gpartials_b.data_ptr<float>(), b, t, d, gtiles, launch.stream);
    {
      const at::Tensor gl = gate.detach().requires_grad_(true), yl = yb.detach().requires_grad_(true);
      const at::Tensor bl = bias.detach().requires_grad_(true);
      const auto gr = torch::autograd::grad({gated_residual(x, gl, yl, bl)}, {gl, yl, bl}, {dout});
      EXPECT_TRUE(at::equal(dgate_b, gr[0])) << name(s) << " gated dgate with bias";
      EXPECT_TRUE(at::equal(dyb_b, gr[1])) << name(s) << " gated dy with bias";
      EXPECT_FALSE(dbias_ps.isnan().any().item<bool>()) << name(s) << " gated dbias_per_sample";
      EXPECT_TRUE(at::equal(at::sum(dbias_ps, {0}), gr[2])) << name(s) << " gated dbias";
    }
  }
}

// Bad inputs that only exist on a GPU: tensors on different devices.
TEST(GatedResidualGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Tensor x = at::randn({2, 3, 8}).to(kCuda);
  const at::Tensor m = at::randn({2, 8});
  EXPECT_THROW(gated_residual(x, m, x), UsageError);
  EXPECT_THROW(gated_residual(x, m.to(kCuda), x, at::randn({8})), UsageError);  // bias on the CPU
}

// A DiT-block-shaped chain (adaln -> stand-in for attention -> gated residual,
// without and with a bias) forward and backward captured in one CUDA graph and
// replayed: fails loudly on a host sync or a data-dependent allocation, and
// the replay reproduces the eager gradients bit for bit.
TEST(GatedResidualGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(9000);
  const int64_t b = 4, t = 64, d = 384;
  const at::Tensor x = rnd({b, t, d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor mod = rnd({b, 6 * d}, g, at::kBFloat16, 0.5).requires_grad_(true);
  const at::Tensor bias = rnd({d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dout = rnd({b, t, d}, g, at::kFloat);
  for (const bool with_bias : {false, true}) {
    auto step = [&] {
      const auto c = mod.chunk(6, 1);
      const at::Tensor h = adaln_layernorm(x, c[0], c[1], at::kBFloat16);
      const at::Tensor out = gated_residual(x, c[2], h * 2, with_bias ? bias : at::Tensor());
      std::vector<at::Tensor> result = {out.detach()};
      const auto grads = with_bias ? torch::autograd::grad({out}, {x, mod, bias}, {dout})
                                   : torch::autograd::grad({out}, {x, mod}, {dout});
      result.insert(result.end(), grads.begin(), grads.end());
      return result;
    };
    perftrain::testing::expect_graph_replays_match_eager(step, with_bias ? "with bias " : "");
  }
}

}  // namespace
}  // namespace perftrain::ops
