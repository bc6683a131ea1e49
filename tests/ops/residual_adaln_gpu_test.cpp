// On a GPU: residual_adaln against its reference computed in float64 on the
// same (upcast) inputs, forward and backward, with both outputs used and with
// only one of them, without and with a bias; every element written (outputs
// and scratch pre-filled with NaN through the kernel launches); bit-identical
// reruns; capture of forward + backward in a CUDA graph. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/residual_adaln.h"
#include "ops/gated_residual.h"
#include "ops/residual_adaln.h"
#include "support/graph_checks.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

// 77 tokens: row tiles whose last row ahead falls outside the tile or the
// tensor; 4104: wider than 4096, where the backward with a bias takes two
// vectors per thread.
const std::vector<Shape> kShapes = {{1, 1, 37},     {2, 3, 200},     {3, 256, 384}, {2, 5, 1000}, {2, 77, 768},
                                    {2, 256, 1152}, {256, 256, 384}, {2, 7, 4104}};

// Dtypes of x, of y, of gate/shift/scale, and out_dtype: the DiT autocast
// case (fp32 residual stream, bf16 everything else), pure fp32, all bf16, y
// not in out_dtype (the fp32 detour), and half modulation.
struct Case {
  at::ScalarType x, y, mod, out;
};
const std::vector<Case> kCases = {{at::kFloat, at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                  {at::kFloat, at::kFloat, at::kFloat, at::kFloat},
                                  {at::kBFloat16, at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                  {at::kFloat, at::kFloat, at::kBFloat16, at::kBFloat16},
                                  {at::kFloat, at::kHalf, at::kHalf, at::kHalf}};

std::string name(const Case& c) { return dtype_names({{"x", c.x}, {"y", c.y}, {"mod", c.mod}, {"out", c.out}}); }


// Runs the op (or the float64 reference) and differentiates the used outputs.
// Returns {x1, h, dx, dgate, dy, dshift, dscale, dbias}; unused-input gradients
// and dbias without a bias (undefined = none) are undefined.
std::vector<at::Tensor> run(bool reference, Use use, const at::Tensor& x, const at::Tensor& mod_a,
                            const at::Tensor& y, const at::Tensor& mod_b, at::ScalarType out, const at::Tensor& dx1,
                            const at::Tensor& dh, const at::Tensor& bias = at::Tensor()) {
  auto leaf = [&](const at::Tensor& t) {
    return (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true);
  };
  // Chunks of [B, 6D] modulation tensors (row stride 6D), as the DiT block passes them:
  // gate is block i's gate_mlp, shift/scale block i+1's shift_msa/scale_msa.
  const at::Tensor xl = leaf(x), yl = leaf(y), ma = leaf(mod_a), mb = leaf(mod_b);
  const at::Tensor gate = ma.chunk(6, 1)[5], shift = mb.chunk(6, 1)[0], scale = mb.chunk(6, 1)[1];
  const at::Tensor bl = bias.defined() ? leaf(bias) : at::Tensor();
  const auto [x1, h] = reference ? residual_adaln_reference(xl, gate, yl, shift, scale, at::kDouble, 1e-6, bl)
                                 : residual_adaln(xl, gate, yl, shift, scale, out, 1e-6, bl);
  auto as_ref = [&](const at::Tensor& t) { return reference ? t.to(at::kDouble) : t; };
  std::vector<at::Tensor> inputs = {xl, gate, yl, shift, scale};
  if (bl.defined()) inputs.push_back(bl);
  std::vector<at::Tensor> all = outputs_and_grads(x1, h, inputs, use, as_ref(dx1), as_ref(dh));
  if (!bl.defined()) all.push_back(at::Tensor());  // no dbias
  return all;
}

// Whether the op keeps xhat (not x1) for this case: an fp32 residual stream
// with 16-bit h and y (see ops/residual_adaln.h).
bool keeps_xhat(const Case& c) { return c.x == at::kFloat && reduced(c.out) && c.y == c.out; }

// Every case, shape and use without a bias and with a random fp32 one. dbias is fp32
// and sums B*T rows of dx1 * gate: expect_rel_l2's fp32 tolerance (1e-5) when
// x is fp32 and x1 is kept; when x is bf16/fp16, x1 is rounded to it before the
// LayerNorm (as dx and dgate see), so dx1 and dbias carry that rounding: 1e-2.
// A kept bf16/fp16 xhat puts its rounding (2^-9 / 2^-12 relative) into the
// LayerNorm's gradient: dx and dbias are then held to the 16-bit tolerances.
TEST(ResidualAdaLNGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const bool from_xhat = keeps_xhat(c);
    for (const Shape& s : kShapes) {
      for (const Use use : kUses) {
        for (const bool with_bias : {false, true}) {
          const std::string where = name(c) + (from_xhat ? " (xhat kept) " : " ") + name(s) + " " + name(use) +
                                    (with_bias ? " with bias: " : ": ");
          at::Generator g = gen(seed++);
          const at::Tensor mod_a = rnd({s.b, 6 * s.d}, g, c.mod, 0.5), mod_b = rnd({s.b, 6 * s.d}, g, c.mod, 0.5);
          const at::Tensor x = rnd({s.b, s.t, s.d}, g, c.x, 2.0, 0.3);
          const at::Tensor y = rnd({s.b, s.t, s.d}, g, c.y);
          const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, c.x), dh = rnd({s.b, s.t, s.d}, g, c.out);
          const at::Tensor bias = with_bias ? rnd({s.d}, g, at::kFloat) : at::Tensor();

          const auto got = run(false, use, x, mod_a, y, mod_b, c.out, dx1, dh, bias);
          const auto ref = run(true, use, x, mod_a, y, mod_b, c.out, dx1, dh, bias);
          ASSERT_EQ(got[0].scalar_type(), c.x) << where;
          ASSERT_EQ(got[1].scalar_type(), c.out) << where;
          expect_close(got[0], ref[0], where + "x1");
          expect_close(got[1], ref[1], where + "h");
          ASSERT_TRUE(got[2].defined() && got[3].defined() && got[4].defined()) << where;
          EXPECT_EQ(got[2].scalar_type(), c.x) << where << "dx dtype";
          EXPECT_EQ(got[3].scalar_type(), c.mod) << where << "dgate dtype";
          EXPECT_EQ(got[4].scalar_type(), c.y) << where << "dy dtype";
          expect_close(got[2], ref[2], where + "dx", from_xhat && use != Use::kX1Only ? 2e-2 : 0);
          expect_rel_l2(got[3], ref[3], where + "dgate", from_xhat && use != Use::kX1Only ? 1e-2 : 0);
          expect_close(got[4], ref[4], where + "dy");
          if (use == Use::kX1Only) {
            EXPECT_FALSE(got[5].defined() || got[6].defined()) << where << "h unused: no dshift/dscale";
            EXPECT_TRUE(at::equal(got[2], dx1)) << where << "dx must be dx1 itself";
          } else {
            ASSERT_TRUE(got[5].defined() && got[6].defined()) << where;
            EXPECT_EQ(got[5].scalar_type(), c.mod) << where << "dshift dtype";
            expect_rel_l2(got[5], ref[5], where + "dshift");
            expect_rel_l2(got[6], ref[6], where + "dscale");
          }
          if (with_bias) {
            ASSERT_TRUE(got[7].defined()) << where << "no dbias";
            EXPECT_EQ(got[7].scalar_type(), at::kFloat) << where << "dbias dtype";
            expect_rel_l2(got[7], ref[7], where + "dbias",
                          reduced(c.x) || (from_xhat && use != Use::kX1Only) ? 1e-2 : 1e-5);
          } else {
            EXPECT_FALSE(got[7].defined()) << where;
          }

          expect_same_bits(got, run(false, use, x, mod_a, y, mod_b, c.out, dx1, dh, bias), where);
        }
      }
    }
  }
}

// The bias's gradient when gate's is not wanted (the kernels then sum dx1 for
// dbias without the bias entering dgate), a bf16 bias (gradient in bf16), and
// dgate when the bias needs no gradient; each use of the outputs; against
// float64 (fp32 residual stream, bf16 elsewhere). Tolerances as above.
TEST(ResidualAdaLNGpu, BiasGradientAlone) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 3000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 256, 1152}, Shape{2, 7, 4104}}) {
    for (const Use use : kUses) {
      const std::string where = name(s) + " " + name(use) + ": ";
      at::Generator g = gen(seed++);
      const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat, 2.0, 0.3), y = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
      const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16, 0.5), shift = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);
      const at::Tensor scale = rnd({s.b, s.d}, g, at::kBFloat16, 0.5), bias = rnd({s.d}, g, at::kBFloat16);
      const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, at::kFloat), dh = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
      // Differentiates the used outputs with respect to `wrt` (leaves made here; the rest constants).
      auto grads = [&](bool reference, const std::vector<int>& wrt) {
        std::vector<at::Tensor> in = {x, gate, y, shift, scale, bias};
        for (at::Tensor& t : in) t = (reference ? t.to(at::kDouble) : t).detach();
        std::vector<at::Tensor> leaves;
        for (const int i : wrt) leaves.push_back(in[i].requires_grad_(true));
        const auto [x1, h] = reference
                                 ? residual_adaln_reference(in[0], in[1], in[2], in[3], in[4], at::kDouble, 1e-6, in[5])
                                 : residual_adaln(in[0], in[1], in[2], in[3], in[4], at::kBFloat16, 1e-6, in[5]);
        auto as_ref = [&](const at::Tensor& t) { return reference ? t.to(at::kDouble) : t; };
        std::vector<at::Tensor> all = outputs_and_grads(x1, h, leaves, use, as_ref(dx1), as_ref(dh));
        return std::vector<at::Tensor>(all.begin() + 2, all.end());
      };
      const auto got = grads(false, {2, 5}), ref = grads(true, {2, 5});  // y and bias, not gate
      EXPECT_EQ(got[1].scalar_type(), at::kBFloat16) << where << "dbias dtype";
      expect_close(got[0], ref[0], where + "dy (no dgate)");
      expect_rel_l2(got[1], ref[1], where + "dbias (no dgate)");
      const auto got_g = grads(false, {1}), ref_g = grads(true, {1});  // gate only: bias without gradient
      expect_rel_l2(got_g[0], ref_g[0], where + "dgate (bias without gradient)");
    }
  }
}

// The kernel launches write every element of their outputs and read no
// scratch they did not write: outputs and scratch start as NaN, results must
// match the op (checked against the reference above) bit for bit. Without and
// with a bias (then also the fourth partials plane and dbias_per_sample, whose
// batch sum is the op's dbias), with and without dx1_ext, from x1 and mean or
// from the kept xhat (the forward's, NaN-poisoned before); the 16-byte path
// (D % 8 == 0: one vector per thread, two with a bias beyond 4096) and the
// scalar one (D = 37).
TEST(ResidualAdaLNGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  using bf16 = __nv_bfloat16;
  auto bp = [](const at::Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  auto fp = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; };
  uint64_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 3, 200}, Shape{3, 256, 384}, Shape{2, 256, 1152},
                         Shape{4, 17, 1000}, Shape{2, 7, 4104}}) {
    for (const bool with_bias : {false, true}) {
      const std::string where_s = name(s) + (with_bias ? " with bias" : "");
      const int b = int(s.b), t = int(s.t), d = int(s.d);
      at::Generator g = gen(seed++);
      const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat, 2.0, 0.3), y = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
      const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16, 0.5), shift = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);
      const at::Tensor scale = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);
      const at::Tensor bias = with_bias ? rnd({s.d}, g, at::kFloat) : at::Tensor();

      at::Tensor x1 = nan_like({s.b, s.t, s.d}, at::kFloat), h = nan_like({s.b, s.t, s.d}, at::kBFloat16);
      at::Tensor mean = nan_like({s.b * s.t}, at::kFloat), rstd = nan_like({s.b * s.t}, at::kFloat);
      at::Tensor xhat = nan_like({s.b, s.t, s.d}, at::kBFloat16);
      kernels::residual_adaln_forward<float, bf16, bf16>(x.data_ptr<float>(), bp(gate), d, bp(y), fp(bias), bp(shift),
                                                         d, bp(scale), d, x1.data_ptr<float>(), bp(h),
                                                         mean.data_ptr<float>(), rstd.data_ptr<float>(), bp(xhat), b,
                                                         t, d, 1e-6f, launch.stream);
      {
        const auto [x1_op, h_op] = residual_adaln(x, gate, y, shift, scale, at::kBFloat16, 1e-6, bias);
        EXPECT_TRUE(at::equal(x1, x1_op)) << where_s << " forward x1";
        EXPECT_TRUE(at::equal(h, h_op)) << where_s << " forward h";
        EXPECT_FALSE(mean.isnan().any().item<bool>() || rstd.isnan().any().item<bool>()) << where_s;
        const at::Tensor want_xhat = (x1 - mean.view({s.b, s.t, 1})) * rstd.view({s.b, s.t, 1});
        expect_close(xhat, want_xhat, where_s + " forward xhat");
      }

      const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, at::kFloat), dh = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
      const int tiles = kernels::residual_adaln_backward_tiles(b, t, d, with_bias, launch.sms);
      for (const bool with_ext : {true, false})
      for (const bool from_xhat : {true, false}) {
        const std::string where =
            where_s + (with_ext ? " with dx1_ext" : " without dx1_ext") + (from_xhat ? ", xhat kept: " : ", x1 kept: ");
        at::Tensor dx = nan_like({s.b, s.t, s.d}, at::kFloat), dy = nan_like({s.b, s.t, s.d}, at::kBFloat16);
        at::Tensor dgate = nan_like({s.b, s.d}, at::kBFloat16), dshift = nan_like({s.b, s.d}, at::kBFloat16);
        at::Tensor dscale = nan_like({s.b, s.d}, at::kBFloat16);
        at::Tensor dbias_ps = with_bias ? nan_like({s.b, s.d}, at::kFloat) : at::Tensor();
        at::Tensor partials =
            nan_like({kernels::residual_adaln_backward_partials(b, tiles, d, with_bias)}, at::kFloat);
        kernels::residual_adaln_backward<float, bf16, bf16>(
            with_ext ? dx1.data_ptr<float>() : nullptr, bp(dh), from_xhat ? nullptr : x1.data_ptr<float>(),
            from_xhat ? bp(xhat) : nullptr, bp(y), fp(bias), bp(gate), d, bp(scale), d,
            from_xhat ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr<float>(), bp(dy),
            bp(dgate), bp(dshift), bp(dscale), fp(dbias_ps), partials.data_ptr<float>(), b, t, d, tiles, launch.stream);
        std::vector<at::Tensor> in = {x, gate, y, shift, scale};
        if (with_bias) in.push_back(bias);
        for (at::Tensor& v : in) v = v.detach().requires_grad_(true);
        const auto [x1_op, h_op] = residual_adaln(in[0], in[1], in[2], in[3], in[4], at::kBFloat16, 1e-6,
                                                  with_bias ? in[5] : at::Tensor());
        const auto gr = with_ext ? torch::autograd::grad({x1_op, h_op}, in, {dx1, dh})
                                 : torch::autograd::grad({h_op}, in, {dh});
        if (from_xhat) {  // what the op keeps for these dtypes: the same bits
          EXPECT_TRUE(at::equal(dx, gr[0])) << where << "dx";
          EXPECT_TRUE(at::equal(dgate, gr[1])) << where << "dgate";
          EXPECT_TRUE(at::equal(dy, gr[2])) << where << "dy";
          EXPECT_TRUE(at::equal(dshift, gr[3])) << where << "dshift";
          EXPECT_TRUE(at::equal(dscale, gr[4])) << where << "dscale";
        } else {  // from x1: the op's xhat rounding apart, the same values (NaN fails)
          expect_close(dx, gr[0], where + "dx", 2e-2);
          expect_rel_l2(dgate, gr[1], where + "dgate");
          expect_close(dy, gr[2], where + "dy");
          expect_rel_l2(dshift, gr[3], where + "dshift");
          expect_rel_l2(dscale, gr[4], where + "dscale");
        }
        if (with_bias) {
          EXPECT_FALSE(dbias_ps.isnan().any().item<bool>()) << where << "dbias_per_sample";
          if (from_xhat)
            EXPECT_TRUE(at::equal(at::sum(dbias_ps, {0}), gr[5])) << where << "dbias";
          else
            expect_rel_l2(at::sum(dbias_ps, {0}), gr[5], where + "dbias", 1e-2);
        }
      }
    }
  }
}

// Bad inputs that only exist on a GPU: tensors on different devices.
TEST(ResidualAdaLNGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Tensor x = at::randn({2, 3, 8}).to(kCuda);
  const at::Tensor m = at::randn({2, 8});
  EXPECT_THROW(residual_adaln(x, m.to(kCuda), x, m, m.to(kCuda), at::kBFloat16), UsageError);
  EXPECT_THROW(residual_adaln(x, m.to(kCuda), x.cpu(), m.to(kCuda), m.to(kCuda), at::kBFloat16), UsageError);
  const at::Tensor mc = m.to(kCuda);
  EXPECT_THROW(residual_adaln(x, mc, x, mc, mc, at::kBFloat16, 1e-6, at::randn({8})), UsageError);  // bias on the CPU
}

// Two DiT blocks' worth of chaining (residual_adaln -> stand-in for the
// attention -> residual_adaln -> stand-in -> gated_residual), without and with
// the folded biases, forward and backward captured in one CUDA graph and
// replayed: fails loudly on a host sync or a data-dependent allocation, and
// the replay reproduces the eager outputs and gradients bit for bit.
TEST(ResidualAdaLNGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(9000);
  const int64_t b = 4, t = 64, d = 384;
  const at::Tensor x = rnd({b, t, d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor y0 = rnd({b, t, d}, g, at::kBFloat16).requires_grad_(true);
  const at::Tensor mod = rnd({b, 6 * d}, g, at::kBFloat16, 0.5).requires_grad_(true);
  const at::Tensor bias_a = rnd({d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor bias_b = rnd({d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dout = rnd({b, t, d}, g, at::kFloat);
  for (const bool with_bias : {false, true}) {
    auto step = [&] {
      const at::Tensor ba = with_bias ? bias_a : at::Tensor(), bb = with_bias ? bias_b : at::Tensor();
      const auto c = mod.chunk(6, 1);
      const auto [x1, h1] = residual_adaln(x, c[2], y0, c[0], c[1], at::kBFloat16, 1e-6, ba);
      const auto [x2, h2] = residual_adaln(x1, c[5], h1 * 2, c[3], c[4], at::kBFloat16, 1e-6, bb);
      const at::Tensor out = gated_residual(x2, c[2], h2 * 3, ba);
      const auto grads = with_bias ? torch::autograd::grad({out}, {x, y0, mod, bias_a, bias_b}, {dout})
                                   : torch::autograd::grad({out}, {x, y0, mod}, {dout});
      std::vector<at::Tensor> result = {out.detach()};
      result.insert(result.end(), grads.begin(), grads.end());
      return result;
    };
    perftrain::testing::expect_graph_replays_match_eager(step, with_bias ? "with bias " : "");
  }
}

}  // namespace
}  // namespace perftrain::ops
