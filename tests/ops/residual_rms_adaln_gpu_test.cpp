// On a GPU: residual_rms_adaln against its reference computed in float64 on
// the same (upcast) inputs, forward and backward (all six gradients), with
// both outputs used and with only one of them, with and without the weights
// and the scale, at bf16/fp16/fp32 storage and odd widths; every element
// written (outputs and scratch pre-filled with NaN through the kernel
// launches); bit-identical reruns; capture of a chain of blocks' worth of
// forward + backward in a CUDA graph, with the weight gradients inline and on
// the weight-gradient stream. Skips without a GPU. Failures print the max error.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/residual_rms_adaln.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "ops/weight_grad_stream.h"
#include "support/graph_checks.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

// One row; odd widths (37, 1003: the scalar path); 72 and 200 (16-byte
// vectors, a warp per row with idle lanes); the DiT widths 384 and 1152 (a
// warp per row forward, one vector a thread backward) and 2048 (a block per
// row); 4104 and 8192 (two vectors a thread backward); 256 samples.
const std::vector<Shape> kShapes = {{1, 1, 37},    {1, 1, 1152},  {2, 3, 200},    {2, 77, 72},  {3, 256, 384},
                                    {2, 5, 1003},  {2, 256, 1152}, {2, 9, 2048}, {2, 7, 4104}, {1, 3, 8192},
                                    {2, 5, 5003}, {256, 64, 384}};

// Dtypes of x, of y, of gate/scale, of the weights, and out_dtype: the
// training case (fp32 residual stream, bf16 y/h/modulation, fp32 weights:
// xhat kept), pure fp32, all bf16, y not in out_dtype (the fp32 detour), and
// half.
struct Case {
  at::ScalarType x, y, mod, w, out;
};
const std::vector<Case> kCases = {{at::kFloat, at::kBFloat16, at::kBFloat16, at::kFloat, at::kBFloat16},
                                  {at::kFloat, at::kFloat, at::kFloat, at::kFloat, at::kFloat},
                                  {at::kBFloat16, at::kBFloat16, at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                  {at::kFloat, at::kFloat, at::kBFloat16, at::kFloat, at::kBFloat16},
                                  {at::kFloat, at::kHalf, at::kHalf, at::kFloat, at::kHalf}};

std::string name(const Case& c) {
  return dtype_names({{"x", c.x}, {"y", c.y}, {"mod", c.mod}, {"w", c.w}, {"out", c.out}});
}


// Whether the op keeps xhat (not x1) for this case (see ops/residual_rms_adaln.h).
bool keeps_xhat(const Case& c) { return c.x == at::kFloat && reduced(c.out) && c.y == c.out; }

// Runs the op (or the float64 reference) with gate = chunk 1 of one [B, 4D]
// modulation and scale = chunk 2 of another (row stride 4D, as the model
// chains blocks) and differentiates the used outputs. Returns {x1, h, dx, dy,
// dmod_a, dmod_b, dpost_weight, dpre_weight}; gradients of absent inputs are
// undefined, and so are those the used outputs do not reach.
std::vector<at::Tensor> run(bool reference, Use use, const at::Tensor& x, const at::Tensor& mod_a,
                            const at::Tensor& y, const at::Tensor& pw, const at::Tensor& qw,
                            const at::Tensor& mod_b, at::ScalarType out, const at::Tensor& dx1,
                            const at::Tensor& dh) {
  auto leaf = [&](const at::Tensor& t) {
    return t.defined() ? (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true) : at::Tensor();
  };
  const at::Tensor xl = leaf(x), yl = leaf(y), ma = leaf(mod_a), mb = leaf(mod_b), pl = leaf(pw), ql = leaf(qw);
  const at::Tensor gate = ma.chunk(4, 1)[1], scale = mb.defined() ? mb.chunk(4, 1)[2] : at::Tensor();
  const auto [x1, h] = reference ? residual_rms_adaln_reference(xl, gate, yl, pl, ql, scale, at::kDouble)
                                 : residual_rms_adaln(xl, gate, yl, pl, ql, scale, out);
  auto as_ref = [&](const at::Tensor& t) { return reference ? t.to(at::kDouble) : t; };
  std::vector<at::Tensor> inputs = {xl, yl, ma};
  for (const at::Tensor& t : {mb, pl, ql})
    if (t.defined()) inputs.push_back(t);
  const std::vector<at::Tensor> all = outputs_and_grads(x1, h, inputs, use, as_ref(dx1), as_ref(dh));
  const at::Tensor* g = all.data() + 2;  // the gradients
  size_t k = 3;
  const at::Tensor g_mb = mb.defined() ? g[k++] : at::Tensor();
  const at::Tensor g_pw = pl.defined() ? g[k++] : at::Tensor();
  const at::Tensor g_qw = ql.defined() ? g[k++] : at::Tensor();
  return {x1.detach(), h.detach(), g[0], g[1], g[2], g_mb, g_pw, g_qw};
}

// Every case, shape and use, with all optional inputs and with none.
// Tolerances: values elementwise by their dtype (row_op_checks.h); column sums
// (dgate, dscale, the weights') by relative L2, 1e-5 for fp32 results and
// 1e-2 for 16-bit ones. Looser where a rounding the float64 reference does not
// make enters: a kept bf16/fp16 xhat (2^-9 / 2^-12 relative) in x1's norm
// gradient, and a 16-bit x1 (rounded before its norm, as the reference in
// float64 does not) in everything downstream of it: dx then 2e-2
// elementwise, the sums 1e-2.
TEST(ResidualRmsAdaLNGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const bool from_xhat = keeps_xhat(c);
    for (const Shape& s : kShapes) {
      for (const Use use : kUses) {
        for (const bool with_opt : {true, false}) {
          const std::string where = name(c) + (from_xhat ? " (xhat kept) " : " ") + name(s) + " " + name(use) +
                                    (with_opt ? " with weights and scale: " : " without: ");
          at::Generator g = gen(seed++);
          const at::Tensor mod_a = rnd({s.b, 4 * s.d}, g, c.mod, 0.7);
          const at::Tensor mod_b = with_opt ? rnd({s.b, 4 * s.d}, g, c.mod, 0.5) : at::Tensor();
          const at::Tensor x = rnd({s.b, s.t, s.d}, g, c.x, 2.0, 0.3);
          const at::Tensor y = rnd({s.b, s.t, s.d}, g, c.y, 3.0);
          const at::Tensor pw = with_opt ? rnd({s.d}, g, c.w, 0.3, 1.0) : at::Tensor();
          const at::Tensor qw = with_opt ? rnd({s.d}, g, c.w, 0.3, 1.0) : at::Tensor();
          const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, c.x), dh = rnd({s.b, s.t, s.d}, g, c.out);

          const auto got = run(false, use, x, mod_a, y, pw, qw, mod_b, c.out, dx1, dh);
          const auto ref = run(true, use, x, mod_a, y, pw, qw, mod_b, c.out, dx1, dh);
          const bool h_grad = use != Use::kX1Only;
          const bool loose = reduced(c.x) || (from_xhat && h_grad);
          ASSERT_EQ(got[0].scalar_type(), c.x) << where;
          ASSERT_EQ(got[1].scalar_type(), c.out) << where;
          expect_close(got[0], ref[0], where + "x1");
          expect_close(got[1], ref[1], where + "h");
          ASSERT_TRUE(got[2].defined() && got[3].defined() && got[4].defined()) << where;
          EXPECT_EQ(got[2].scalar_type(), c.x) << where << "dx dtype";
          EXPECT_EQ(got[3].scalar_type(), c.y) << where << "dy dtype";
          EXPECT_EQ(got[4].scalar_type(), c.mod) << where << "dgate dtype";
          expect_close(got[2], ref[2], where + "dx", loose ? 2e-2 : 0);
          expect_close(got[3], ref[3], where + "dy", loose ? 2e-2 : 0);
          const double sums_tol = loose ? 1e-2 : 0;
          expect_rel_l2(got[4].chunk(4, 1)[1], ref[4].chunk(4, 1)[1], where + "dgate", sums_tol);
          EXPECT_EQ(got[4].chunk(4, 1)[0].abs().max().item<double>(), 0.0) << where << "dgate outside its chunk";
          if (use == Use::kX1Only) EXPECT_TRUE(at::equal(got[2], dx1)) << where << "dx must equal dx1";
          if (with_opt) {
            ASSERT_TRUE(got[6].defined()) << where << "no dpost_weight";
            EXPECT_EQ(got[6].scalar_type(), c.w) << where << "dpost_weight dtype";
            expect_rel_l2(got[6], ref[6], where + "dpost_weight", sums_tol);
            if (h_grad) {
              ASSERT_TRUE(got[5].defined() && got[7].defined()) << where;
              EXPECT_EQ(got[5].scalar_type(), c.mod) << where << "dscale dtype";
              EXPECT_EQ(got[7].scalar_type(), c.w) << where << "dpre_weight dtype";
              expect_rel_l2(got[5].chunk(4, 1)[2], ref[5].chunk(4, 1)[2], where + "dscale", sums_tol);
              EXPECT_EQ(got[5].chunk(4, 1)[3].abs().max().item<double>(), 0.0) << where << "dscale outside";
              expect_rel_l2(got[7], ref[7], where + "dpre_weight", sums_tol);
            } else {
              EXPECT_FALSE(got[5].defined() || got[7].defined()) << where << "h unused: no dscale/dpre_weight";
            }
          }

          expect_same_bits(got, run(false, use, x, mod_a, y, pw, qw, mod_b, c.out, dx1, dh), where);
        }
      }
    }
  }
}

// The kernel launches write every element of their outputs and read no
// scratch they did not write: outputs and scratch start as NaN; results must
// match the op (checked against the reference above). From the kept xhat (the
// forward's, NaN-poisoned before) the op's bits exactly; from x1 the same
// values to the xhat rounding. With and without dx1_ext; the 16-byte paths
// (one and two vectors a thread) and the scalar ones (37, 1003, 5003).
TEST(ResidualRmsAdaLNGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  using bf16 = __nv_bfloat16;
  auto bp = [](const at::Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  auto fp = [](const at::Tensor& t) { return t.data_ptr<float>(); };
  uint64_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 3, 200}, Shape{3, 256, 384}, Shape{2, 256, 1152},
                         Shape{4, 17, 1003}, Shape{2, 9, 2048}, Shape{2, 7, 5003}, Shape{2, 7, 8192}}) {
    const std::string where_s = name(s);
    const int b = int(s.b), t = int(s.t), d = int(s.d);
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat, 2.0, 0.3), y = rnd({s.b, s.t, s.d}, g, at::kBFloat16, 3.0);
    const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16, 0.7), scale = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);
    const at::Tensor pw = rnd({s.d}, g, at::kFloat, 0.3, 1.0), qw = rnd({s.d}, g, at::kFloat, 0.3, 1.0);

    at::Tensor x1 = nan_like({s.b, s.t, s.d}, at::kFloat), h = nan_like({s.b, s.t, s.d}, at::kBFloat16);
    at::Tensor y_rstd = nan_like({s.b * s.t}, at::kFloat), rstd = nan_like({s.b * s.t}, at::kFloat);
    at::Tensor xhat = nan_like({s.b, s.t, s.d}, at::kBFloat16);
    kernels::residual_rms_adaln_forward<float, bf16, bf16>(fp(x), bp(gate), d, bp(y), fp(pw), fp(qw), bp(scale), d,
                                                           fp(x1), bp(h), fp(y_rstd), fp(rstd), bp(xhat), b, t, d,
                                                           1e-6f, launch.stream);
    {
      const auto [x1_op, h_op] = residual_rms_adaln(x, gate, y, pw, qw, scale, at::kBFloat16);
      EXPECT_TRUE(at::equal(x1, x1_op)) << where_s << " forward x1";
      EXPECT_TRUE(at::equal(h, h_op)) << where_s << " forward h";
      EXPECT_FALSE(y_rstd.isnan().any().item<bool>() || rstd.isnan().any().item<bool>()) << where_s;
      expect_close(xhat, x1 * rstd.view({s.b, s.t, 1}), where_s + " forward xhat");
    }

    const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, at::kFloat), dh = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
    const int tiles = kernels::residual_rms_adaln_backward_tiles(b, t, d, launch.sms);
    for (const bool with_ext : {true, false})
      for (const bool from_xhat : {true, false}) {
        const std::string where =
            where_s + (with_ext ? " with dx1_ext" : " without dx1_ext") + (from_xhat ? ", xhat kept: " : ", x1 kept: ");
        at::Tensor dx = nan_like({s.b, s.t, s.d}, at::kFloat), dy = nan_like({s.b, s.t, s.d}, at::kBFloat16);
        at::Tensor dgate = nan_like({s.b, s.d}, at::kBFloat16), dscale = nan_like({s.b, s.d}, at::kBFloat16);
        at::Tensor dpw_ps = nan_like({s.b, s.d}, at::kFloat), dqw_ps = nan_like({s.b, s.d}, at::kFloat);
        at::Tensor partials = nan_like({kernels::residual_rms_adaln_backward_partials(b, tiles, d)}, at::kFloat);
        kernels::residual_rms_adaln_backward<float, bf16, bf16>(
            with_ext ? fp(dx1) : nullptr, bp(dh), from_xhat ? nullptr : fp(x1), from_xhat ? bp(xhat) : nullptr, bp(y),
            fp(pw), fp(qw), bp(gate), d, bp(scale), d, fp(y_rstd), fp(rstd), fp(dx), bp(dy), bp(dgate), bp(dscale),
            fp(dpw_ps), fp(dqw_ps), fp(partials), b, t, d, tiles, launch.stream);
        std::vector<at::Tensor> in = {x, gate, y, pw, qw, scale};
        for (at::Tensor& v : in) v = v.detach().requires_grad_(true);
        const auto [x1_op, h_op] = residual_rms_adaln(in[0], in[1], in[2], in[3], in[4], in[5], at::kBFloat16);
        const auto gr = with_ext ? torch::autograd::grad({x1_op, h_op}, in, {dx1, dh})
                                 : torch::autograd::grad({h_op}, in, {dh});
        EXPECT_FALSE(dpw_ps.isnan().any().item<bool>() || dqw_ps.isnan().any().item<bool>()) << where;
        if (from_xhat) {  // what the op keeps for these dtypes: the same bits
          EXPECT_TRUE(at::equal(dx, gr[0])) << where << "dx";
          EXPECT_TRUE(at::equal(dgate, gr[1])) << where << "dgate";
          EXPECT_TRUE(at::equal(dy, gr[2])) << where << "dy";
          EXPECT_TRUE(at::equal(dscale, gr[5])) << where << "dscale";
          expect_rel_l2(at::sum(dpw_ps, {0}), gr[3], where + "dpost_weight", 1e-6);  // batch sum: ATen's vs ours
          expect_rel_l2(at::sum(dqw_ps, {0}), gr[4], where + "dpre_weight", 1e-6);
        } else {  // from x1: the op's xhat rounding apart, the same values (NaN fails)
          expect_close(dx, gr[0], where + "dx", 2e-2);
          expect_rel_l2(dgate, gr[1], where + "dgate");
          expect_close(dy, gr[2], where + "dy");
          expect_rel_l2(dscale, gr[5], where + "dscale");
          expect_rel_l2(at::sum(dpw_ps, {0}), gr[3], where + "dpost_weight", 1e-2);
          expect_rel_l2(at::sum(dqw_ps, {0}), gr[4], where + "dpre_weight", 1e-2);
        }
      }
    // Only x1 used (no dh): dx is dx1_ext itself, dscale and dpre_weight are not asked for.
    {
      at::Tensor dx = nan_like({s.b, s.t, s.d}, at::kFloat), dy = nan_like({s.b, s.t, s.d}, at::kBFloat16);
      at::Tensor dgate = nan_like({s.b, s.d}, at::kBFloat16), dpw_ps = nan_like({s.b, s.d}, at::kFloat);
      at::Tensor partials = nan_like({kernels::residual_rms_adaln_backward_partials(b, tiles, d)}, at::kFloat);
      kernels::residual_rms_adaln_backward<float, bf16, bf16>(
          fp(dx1), nullptr, nullptr, nullptr, bp(y), fp(pw), fp(qw), bp(gate), d, bp(scale), d, fp(y_rstd), nullptr,
          fp(dx), bp(dy), bp(dgate), nullptr, fp(dpw_ps), nullptr, fp(partials), b, t, d, tiles, launch.stream);
      std::vector<at::Tensor> in = {x, gate, y, pw};
      for (at::Tensor& v : in) v = v.detach().requires_grad_(true);
      const auto gr =
          torch::autograd::grad({residual_rms_adaln(in[0], in[1], in[2], in[3], qw, scale, at::kBFloat16).first}, in,
                                {dx1});
      const std::string where = where_s + " x1 only: ";
      EXPECT_TRUE(at::equal(dx, dx1)) << where << "dx";
      EXPECT_TRUE(at::equal(dgate, gr[1])) << where << "dgate";
      EXPECT_TRUE(at::equal(dy, gr[2])) << where << "dy";
      expect_rel_l2(at::sum(dpw_ps, {0}), gr[3], where + "dpost_weight", 1e-6);
    }
  }
}

// Inputs whose dtypes the kernels do not take as they are: gate bf16 with
// scale fp32 (both go through fp32 copies), y bf16 into an fp32 h (y and h
// through fp32), a float64 post-norm weight and a bf16 pre-norm weight (read as
// fp32 copies; gradients back in their own dtypes); against float64, both
// outputs used. Tolerances as in MatchesFloat64Reference for a kept-x1 fp32
// residual stream; the bf16 results (dgate, dy, dpre_weight) by theirs.
TEST(ResidualRmsAdaLNGpu, MixedDtypes) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 7000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 77, 72}, Shape{2, 256, 1152}}) {
    const std::string where = name(s) + ": ";
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat, 2.0, 0.3), y = rnd({s.b, s.t, s.d}, g, at::kBFloat16, 3.0);
    const at::Tensor gate = rnd({s.b, s.d}, g, at::kBFloat16, 0.7), scale = rnd({s.b, s.d}, g, at::kFloat, 0.5);
    const at::Tensor pw = rnd({s.d}, g, at::kDouble, 0.3, 1.0), qw = rnd({s.d}, g, at::kBFloat16, 0.3, 1.0);
    const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, at::kFloat), dh = rnd({s.b, s.t, s.d}, g, at::kFloat);
    auto grads = [&](bool reference) {
      std::vector<at::Tensor> in = {x, gate, y, pw, qw, scale};
      for (at::Tensor& t : in) t = (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true);
      const auto [x1, h] =
          reference ? residual_rms_adaln_reference(in[0], in[1], in[2], in[3], in[4], in[5], at::kDouble)
                    : residual_rms_adaln(in[0], in[1], in[2], in[3], in[4], in[5], at::kFloat);
      auto gr = torch::autograd::grad({x1, h}, in, {reference ? dx1.to(at::kDouble) : dx1,
                                                     reference ? dh.to(at::kDouble) : dh});
      gr.insert(gr.begin(), {x1.detach(), h.detach()});
      return gr;
    };
    const auto got = grads(false), ref = grads(true);
    EXPECT_EQ(got[1].scalar_type(), at::kFloat) << where << "h dtype";
    expect_results(got, ref,
                   {{"x1", at::kFloat, true},
                    {"h", at::kFloat, true},
                    {"dx", at::kFloat, true},
                    {"dgate", at::kBFloat16, false},
                    {"dy", at::kBFloat16, true},
                    {"dpost_weight", at::kDouble, false},
                    {"dpre_weight", at::kBFloat16, false},
                    {"dscale", at::kFloat, false}},
                   where);
  }
}

// Views the kernels must not read with 16-byte vectors although D % 8 == 0:
// x, y and both weights one element off a 16-byte boundary (contiguous, so
// the op passes them as they are), gate and scale with the row stride 4D + 1;
// and transposed (non-contiguous) x and y, which the op copies. The training
// dtypes (xhat kept) and all fp32, both outputs used; against float64.
TEST(ResidualRmsAdaLNGpu, MisalignedAndStridedViews) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 8000;
  for (const Case& c : {kCases[0], kCases[1]}) {
    for (const Shape& s : {Shape{2, 77, 72}, Shape{2, 9, 2048}}) {
      for (const bool transposed : {false, true}) {
        const std::string where = name(c) + " " + name(s) + (transposed ? " transposed x, y: " : " misaligned: ");
        const int64_t n = s.b * s.t * s.d;
        at::Generator g = gen(seed++);
        auto big = [&](at::ScalarType t, double std, double mean) {
          return transposed ? rnd({s.b, s.d, s.t}, g, t, std, mean) : rnd({n + 1}, g, t, std, mean);
        };
        const at::Tensor xs = big(c.x, 2.0, 0.3), ys = big(c.y, 3.0, 0.0);
        const at::Tensor pws = rnd({s.d + 1}, g, c.w, 0.3, 1.0), qws = rnd({s.d + 1}, g, c.w, 0.3, 1.0);
        const at::Tensor ms = rnd({s.b, 4 * s.d + 1}, g, c.mod, 0.6);
        const at::Tensor dx1 = rnd({s.b, s.t, s.d}, g, c.x), dh = rnd({s.b, s.t, s.d}, g, c.out);
        auto grads = [&](bool reference) {
          std::vector<at::Tensor> in = {xs, ys, pws, qws, ms};
          for (at::Tensor& t : in) t = (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true);
          auto act = [&](const at::Tensor& t) {
            return transposed ? t.transpose(1, 2) : t.narrow(0, 1, n).view({s.b, s.t, s.d});
          };
          const at::Tensor x = act(in[0]), y = act(in[1]);
          const at::Tensor pw = in[2].narrow(0, 1, s.d), qw = in[3].narrow(0, 1, s.d);
          const at::Tensor gate = in[4].narrow(1, s.d + 1, s.d), scale = in[4].narrow(1, 2 * s.d + 1, s.d);
          if (!reference && !transposed) EXPECT_NE(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16, 0u) << where;
          const auto [x1, h] = reference ? residual_rms_adaln_reference(x, gate, y, pw, qw, scale, at::kDouble)
                                         : residual_rms_adaln(x, gate, y, pw, qw, scale, c.out);
          auto gr = torch::autograd::grad({x1, h}, in, {reference ? dx1.to(at::kDouble) : dx1,
                                                        reference ? dh.to(at::kDouble) : dh});
          for (int i : {0, 1}) gr[i] = transposed ? gr[i] : gr[i].narrow(0, 1, n).view({s.b, s.t, s.d});
          for (int i : {2, 3}) gr[i] = gr[i].narrow(0, 1, s.d);
          const at::Tensor dmod = gr[4];
          gr[4] = dmod.narrow(1, s.d + 1, s.d);  // dgate
          gr.push_back(dmod.narrow(1, 2 * s.d + 1, s.d));  // dscale
          gr.insert(gr.begin(), {x1.detach(), h.detach()});
          return gr;
        };
        const auto got = grads(false), ref = grads(true);
        const bool loose = keeps_xhat(c);
        const char* names[] = {"x1", "h", "dx", "dy", "dpost_weight", "dpre_weight", "dgate", "dscale"};
        for (size_t i = 0; i < got.size(); ++i) {
          if (i < 4)
            expect_close(got[i], ref[i], where + names[i], loose && i >= 2 ? 2e-2 : 0);
          else
            expect_rel_l2(got[i], ref[i], where + names[i], loose ? 1e-2 : 0);
        }
      }
    }
  }
}

// No tokens: empty dh, x1 and xhat have no data pointer; the backward must
// not take that for "h unused" or a missing input, and the per-sample and
// weight gradients are zero.
TEST(ResidualRmsAdaLNGpu, ZeroTokens) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(8500);
  std::vector<at::Tensor> in = {rnd({2, 0, 64}, g, at::kFloat),     rnd({2, 64}, g, at::kBFloat16, 0.7),
                                rnd({2, 0, 64}, g, at::kBFloat16),  rnd({64}, g, at::kFloat, 0.3, 1.0),
                                rnd({64}, g, at::kFloat, 0.3, 1.0), rnd({2, 64}, g, at::kBFloat16, 0.5)};
  for (at::Tensor& t : in) t.requires_grad_(true);
  const auto [x1, h] = residual_rms_adaln(in[0], in[1], in[2], in[3], in[4], in[5], at::kBFloat16);
  ASSERT_EQ(x1.numel() + h.numel(), 0);
  const auto gr = torch::autograd::grad({x1, h}, in, {at::ones_like(x1), at::ones_like(h)});
  EXPECT_EQ(gr[0].numel() + gr[2].numel(), 0);
  for (int i : {1, 3, 4, 5}) EXPECT_EQ(gr[i].abs().max().item<double>(), 0.0) << "gradient " << i;
}

// Bad inputs that only exist on a GPU: tensors on different devices.
TEST(ResidualRmsAdaLNGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Tensor x = at::randn({2, 3, 8}).to(kCuda);
  const at::Tensor m = at::randn({2, 8}).to(kCuda), w = at::randn({8}).to(kCuda);
  EXPECT_THROW(residual_rms_adaln(x, m.cpu(), x, w, w, m, at::kBFloat16), UsageError);
  EXPECT_THROW(residual_rms_adaln(x, m, x.cpu(), w, w, m, at::kBFloat16), UsageError);
  EXPECT_THROW(residual_rms_adaln(x, m, x, w.cpu(), w, m, at::kBFloat16), UsageError);
  EXPECT_THROW(residual_rms_adaln(x, m, x, w, w.cpu(), m, at::kBFloat16), UsageError);
  EXPECT_THROW(residual_rms_adaln(x, m, x, w, w, m.cpu(), at::kBFloat16), UsageError);
  EXPECT_NO_THROW(residual_rms_adaln(x, m, x, w, w, m, at::kBFloat16));
}

// Two single-stream blocks' worth of chaining (rms_adaln -> stand-in for the
// branch -> residual_rms_adaln -> stand-in -> residual_rms_adaln, whose x1
// and h both go on), forward and backward captured in one CUDA graph and
// replayed: fails loudly on a host sync or a data-dependent allocation, and
// the replay reproduces the eager outputs and gradients (x, y, modulation,
// all four weights) bit for bit; with the weight gradients inline and on the
// weight-gradient stream.
TEST(ResidualRmsAdaLNGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(9000);
  const int64_t b = 4, t = 64, d = 384;
  const at::Tensor x = rnd({b, t, d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor mod = rnd({b, 6 * d}, g, at::kBFloat16, 0.5).requires_grad_(true);
  std::vector<at::Tensor> ws;
  for (int i = 0; i < 5; ++i) ws.push_back(rnd({d}, g, at::kFloat, 0.3, 1.0).requires_grad_(true));
  const at::Tensor dout = rnd({b, t, d}, g, at::kFloat), dh_out = rnd({b, t, d}, g, at::kBFloat16);
  for (const bool overlap : {false, true}) {
    auto step = [&] {
      std::vector<at::Tensor> grads;
      at::Tensor x3, h3;
      {
        const WeightGradStream lane(overlap, kCuda);
        const auto c = mod.chunk(6, 1);
        const at::Tensor h0 = rms_adaln(x, ws[0], c[0], at::kBFloat16);
        const auto [x1, h1] = residual_rms_adaln(x, c[1], h0 * 2, ws[1], ws[2], c[2], at::kBFloat16);
        std::tie(x3, h3) = residual_rms_adaln(x1, c[3], h1 * 3, ws[3], ws[4], c[4], at::kBFloat16);
        std::vector<at::Tensor> wrt = {x, mod};
        wrt.insert(wrt.end(), ws.begin(), ws.end());
        grads = torch::autograd::grad({x3, h3}, wrt, {dout, dh_out});
      }  // joins the weight-gradient stream
      std::vector<at::Tensor> result = {x3.detach(), h3.detach()};
      result.insert(result.end(), grads.begin(), grads.end());
      return result;
    };
    perftrain::testing::expect_graph_replays_match_eager(step, overlap ? "weight-gradient stream " : "inline ");
  }
}

}  // namespace
}  // namespace perftrain::ops
