// On a GPU: rms_adaln against its reference computed in float64 on the same
// (upcast) inputs, forward and backward (x, weight, scale), with and without
// the weight and the scale, at bf16/fp16/fp32 storage and odd widths; every
// element written (outputs and scratch pre-filled with NaN through the kernel
// launches); bit-identical reruns; capture of forward + backward in a CUDA
// graph, with the weight gradient inline and on the weight-gradient stream.
// Skips without a GPU. Failures print the max error.
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
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/rms_adaln.h"
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
// warp per row) and 1536+ (a block per row); 4104 and 8192 (the widest);
// 256 samples (many tiles' order).
const std::vector<Shape> kShapes = {{1, 1, 37},     {1, 1, 1152},  {2, 3, 200},    {2, 77, 72},  {3, 256, 384},
                                    {2, 5, 1003},   {2, 256, 1152}, {2, 9, 2048}, {2, 7, 4104}, {1, 3, 8192},
                                    {256, 64, 384}};

// Dtypes of x, of scale, of the weight, and out_dtype: the training case (fp32
// residual stream, bf16 modulation and output, fp32 weight: xhat kept), pure
// fp32, all bf16, fp32 x into fp32 out with bf16 modulation, and half.
struct Case {
  at::ScalarType x, mod, w, out;
};
const std::vector<Case> kCases = {{at::kFloat, at::kBFloat16, at::kFloat, at::kBFloat16},
                                  {at::kFloat, at::kFloat, at::kFloat, at::kFloat},
                                  {at::kBFloat16, at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                  {at::kFloat, at::kBFloat16, at::kFloat, at::kFloat},
                                  {at::kFloat, at::kHalf, at::kFloat, at::kHalf}};

std::string name(const Case& c) { return dtype_names({{"x", c.x}, {"mod", c.mod}, {"w", c.w}, {"out", c.out}}); }

// Whether the op keeps xhat (not x) for this case (see ops/rms_adaln.h).
bool keeps_xhat(const Case& c) { return c.x == at::kFloat && reduced(c.out); }

// Runs the op (or the float64 reference) on scale = chunk 1 of a [B, 3D]
// modulation (row stride 3D) and differentiates h. Returns {h, dx, dweight,
// dmod}; dweight undefined without a weight, dmod undefined without a scale.
std::vector<at::Tensor> run(bool reference, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& mod,
                            at::ScalarType out, const at::Tensor& dh) {
  auto leaf = [&](const at::Tensor& t) {
    return t.defined() ? (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true) : at::Tensor();
  };
  const at::Tensor xl = leaf(x), wl = leaf(weight), ml = leaf(mod);
  const at::Tensor scale = ml.defined() ? ml.chunk(3, 1)[1] : at::Tensor();
  const at::Tensor h = reference ? rms_adaln_reference(xl, wl, scale, at::kDouble) : rms_adaln(xl, wl, scale, out);
  std::vector<at::Tensor> inputs = {xl};
  if (wl.defined()) inputs.push_back(wl);
  if (ml.defined()) inputs.push_back(ml);
  const auto g = torch::autograd::grad({h}, inputs, {reference ? dh.to(at::kDouble) : dh});
  return {h.detach(), g[0], wl.defined() ? g[1] : at::Tensor(), ml.defined() ? g.back() : at::Tensor()};
}

// Every case, shape, with and without weight and scale. Tolerances: h and dx
// elementwise by their dtype (row_op_checks.h); a kept bf16/fp16 xhat puts its
// rounding (2^-9 / 2^-12 relative) into the gradient, so dx is then held to
// 2e-2 and the column sums (dweight, dscale) to 1e-2 relative L2; otherwise
// the column sums to 1e-5 (fp32) or 1e-2 (16-bit results).
TEST(RmsAdaLNGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const bool from_xhat = keeps_xhat(c);
    for (const Shape& s : kShapes) {
      for (const bool with_w : {true, false}) {
        for (const bool with_scale : {true, false}) {
          const std::string where = name(c) + (from_xhat ? " (xhat kept) " : " ") + name(s) +
                                    (with_w ? " weight" : " no weight") + (with_scale ? " scale: " : " no scale: ");
          at::Generator g = gen(seed++);
          const at::Tensor x = rnd({s.b, s.t, s.d}, g, c.x, 2.0, 0.3);
          const at::Tensor w = with_w ? rnd({s.d}, g, c.w, 0.3, 1.0) : at::Tensor();
          const at::Tensor mod = with_scale ? rnd({s.b, 3 * s.d}, g, c.mod, 0.5) : at::Tensor();
          const at::Tensor dh = rnd({s.b, s.t, s.d}, g, c.out);

          const auto got = run(false, x, w, mod, c.out, dh);
          const auto ref = run(true, x, w, mod, c.out, dh);
          ASSERT_EQ(got[0].scalar_type(), c.out) << where;
          expect_close(got[0], ref[0], where + "h");
          ASSERT_TRUE(got[1].defined()) << where;
          EXPECT_EQ(got[1].scalar_type(), c.x) << where << "dx dtype";
          expect_close(got[1], ref[1], where + "dx", from_xhat ? 2e-2 : 0);
          const double sums_tol = from_xhat ? 1e-2 : 0;
          if (with_w) {
            ASSERT_TRUE(got[2].defined()) << where;
            EXPECT_EQ(got[2].scalar_type(), c.w) << where << "dweight dtype";
            expect_rel_l2(got[2], ref[2], where + "dweight", sums_tol);
          }
          if (with_scale) {
            ASSERT_TRUE(got[3].defined()) << where;
            EXPECT_EQ(got[3].scalar_type(), c.mod) << where << "dmod dtype";
            expect_rel_l2(got[3].chunk(3, 1)[1], ref[3].chunk(3, 1)[1], where + "dscale", sums_tol);
            EXPECT_EQ(got[3].chunk(3, 1)[0].abs().max().item<double>(), 0.0) << where << "outside the chunk";
            EXPECT_EQ(got[3].chunk(3, 1)[2].abs().max().item<double>(), 0.0) << where << "outside the chunk";
          }

          expect_same_bits(got, run(false, x, w, mod, c.out, dh), where);
        }
      }
    }
  }
}

// The kernel launches write every element of their outputs and read no
// scratch they did not write: outputs and scratch start as NaN; results must
// match the op (checked against the reference above). From the kept xhat (the
// forward's, NaN-poisoned before) the op's bits exactly; from x the same
// values to the xhat rounding. The 16-byte paths (a warp per row, a block per
// row) and the scalar one (D = 37, 1003).
TEST(RmsAdaLNGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  using bf16 = __nv_bfloat16;
  auto bp = [](const at::Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  uint64_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 3, 200}, Shape{3, 256, 384}, Shape{2, 256, 1152},
                         Shape{4, 17, 1003}, Shape{2, 9, 2048}, Shape{2, 7, 4104}}) {
    const std::string where_s = name(s);
    const int b = int(s.b), t = int(s.t), d = int(s.d);
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat, 2.0, 0.3);
    const at::Tensor w = rnd({s.d}, g, at::kFloat, 0.3, 1.0);
    const at::Tensor scale = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);

    at::Tensor h = nan_like({s.b, s.t, s.d}, at::kBFloat16), xhat = nan_like({s.b, s.t, s.d}, at::kBFloat16);
    at::Tensor rstd = nan_like({s.b * s.t}, at::kFloat);
    kernels::rms_adaln_forward<float, bf16, bf16>(x.data_ptr<float>(), w.data_ptr<float>(), bp(scale), d, bp(h),
                                                  rstd.data_ptr<float>(), bp(xhat), b, t, d, 1e-6f, launch.stream);
    EXPECT_TRUE(at::equal(h, rms_adaln(x, w, scale, at::kBFloat16))) << where_s << " forward h";
    EXPECT_FALSE(rstd.isnan().any().item<bool>()) << where_s << " rstd";
    expect_close(xhat, x * rstd.view({s.b, s.t, 1}), where_s + " forward xhat");

    const at::Tensor dh = rnd({s.b, s.t, s.d}, g, at::kBFloat16);
    const int tiles = kernels::rms_adaln_backward_tiles(b, t, d, launch.sms);
    std::vector<at::Tensor> in = {x, w, scale};
    for (at::Tensor& v : in) v = v.detach().requires_grad_(true);
    const auto gr = torch::autograd::grad({rms_adaln(in[0], in[1], in[2], at::kBFloat16)}, in, {dh});
    for (const bool from_xhat : {true, false}) {
      const std::string where = where_s + (from_xhat ? ", xhat kept: " : ", x kept: ");
      at::Tensor dx = nan_like({s.b, s.t, s.d}, at::kFloat), dscale = nan_like({s.b, s.d}, at::kBFloat16);
      at::Tensor dw_ps = nan_like({s.b, s.d}, at::kFloat);
      at::Tensor partials = nan_like({kernels::rms_adaln_backward_partials(b, tiles, d)}, at::kFloat);
      kernels::rms_adaln_backward<float, bf16, bf16>(
          bp(dh), from_xhat ? nullptr : x.data_ptr<float>(), from_xhat ? bp(xhat) : nullptr, w.data_ptr<float>(),
          bp(scale), d, rstd.data_ptr<float>(), dx.data_ptr<float>(), bp(dscale), dw_ps.data_ptr<float>(),
          partials.data_ptr<float>(), b, t, d, tiles, launch.stream);
      EXPECT_FALSE(dw_ps.isnan().any().item<bool>()) << where << "dweight_per_sample";
      if (from_xhat) {  // what the op keeps for these dtypes: the same bits
        EXPECT_TRUE(at::equal(dx, gr[0])) << where << "dx";
        EXPECT_TRUE(at::equal(dscale, gr[2])) << where << "dscale";
        expect_rel_l2(at::sum(dw_ps, {0}), gr[1], where + "dweight", 1e-6);  // batch sum: ATen's vs ours
      } else {
        expect_close(dx, gr[0], where + "dx", 2e-2);
        expect_rel_l2(dscale, gr[2], where + "dscale");
        expect_rel_l2(at::sum(dw_ps, {0}), gr[1], where + "dweight", 1e-2);
      }
    }
  }
}

// A float64 weight (read as an fp32 copy; its gradient back in float64) and
// x bf16 with fp32 scale into an fp32 h; against float64.
TEST(RmsAdaLNGpu, MixedDtypes) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 7000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 77, 72}, Shape{2, 256, 1152}}) {
    const std::string where = name(s) + ": ";
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kBFloat16, 2.0, 0.3);
    const at::Tensor w = rnd({s.d}, g, at::kDouble, 0.3, 1.0), scale = rnd({s.b, s.d}, g, at::kFloat, 0.5);
    const at::Tensor dh = rnd({s.b, s.t, s.d}, g, at::kFloat);
    auto grads = [&](bool reference) {
      std::vector<at::Tensor> in = {x, w, scale};
      for (at::Tensor& t : in) t = (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true);
      const at::Tensor h = reference ? rms_adaln_reference(in[0], in[1], in[2], at::kDouble)
                                     : rms_adaln(in[0], in[1], in[2], at::kFloat);
      auto gr = torch::autograd::grad({h}, in, {reference ? dh.to(at::kDouble) : dh});
      gr.insert(gr.begin(), h.detach());
      return gr;
    };
    const auto got = grads(false), ref = grads(true);
    expect_results(got, ref,
                   {{"h", at::kFloat, true},
                    {"dx", at::kBFloat16, true},
                    {"dweight", at::kDouble, false},
                    {"dscale", at::kFloat, false}},
                   where);
  }
}

// Views the kernels must not read with 16-byte vectors although D % 8 == 0:
// x, the weight and the scale one element off a 16-byte boundary (contiguous,
// so the op passes them as they are; the scale's row stride 3D + 1), and a
// transposed (non-contiguous) x the op copies. The training dtypes (fp32 x and
// weight, bf16 scale and h: xhat kept) and all fp32; against float64.
TEST(RmsAdaLNGpu, MisalignedAndStridedViews) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 8000;
  for (const Case& c : {kCases[0], kCases[1]}) {
    for (const Shape& s : {Shape{2, 77, 72}, Shape{2, 9, 2048}}) {
      for (const bool transposed : {false, true}) {
        const std::string where = name(c) + " " + name(s) + (transposed ? " transposed x: " : " misaligned x: ");
        const int64_t n = s.b * s.t * s.d;
        at::Generator g = gen(seed++);
        const at::Tensor xs = transposed ? rnd({s.b, s.d, s.t}, g, c.x, 2.0, 0.3) : rnd({n + 1}, g, c.x, 2.0, 0.3);
        const at::Tensor ws = rnd({s.d + 1}, g, c.w, 0.3, 1.0), ms = rnd({s.b, 3 * s.d + 1}, g, c.mod, 0.5);
        const at::Tensor dh = rnd({s.b, s.t, s.d}, g, c.out);
        auto grads = [&](bool reference) {
          std::vector<at::Tensor> in = {xs, ws, ms};
          for (at::Tensor& t : in) t = (reference ? t.to(at::kDouble) : t).detach().requires_grad_(true);
          const at::Tensor x = transposed ? in[0].transpose(1, 2) : in[0].narrow(0, 1, n).view({s.b, s.t, s.d});
          const at::Tensor w = in[1].narrow(0, 1, s.d), scale = in[2].narrow(1, s.d + 1, s.d);
          if (!reference && !transposed) EXPECT_NE(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16, 0u) << where;
          const at::Tensor h = reference ? rms_adaln_reference(x, w, scale, at::kDouble) : rms_adaln(x, w, scale, c.out);
          auto gr = torch::autograd::grad({h}, in, {reference ? dh.to(at::kDouble) : dh});
          gr[0] = transposed ? gr[0] : gr[0].narrow(0, 1, n);
          gr[1] = gr[1].narrow(0, 1, s.d);
          gr[2] = gr[2].narrow(1, s.d + 1, s.d);
          gr.insert(gr.begin(), h.detach());
          return gr;
        };
        const auto got = grads(false), ref = grads(true);
        expect_close(got[0], ref[0], where + "h");
        expect_close(got[1], ref[1], where + "dx", keeps_xhat(c) ? 2e-2 : 0);
        expect_rel_l2(got[2], ref[2], where + "dweight", keeps_xhat(c) ? 1e-2 : 0);
        expect_rel_l2(got[3], ref[3], where + "dscale", keeps_xhat(c) ? 1e-2 : 0);
      }
    }
  }
}

// No tokens: empty x and xhat have no data pointer; the backward must not
// take that for a missing input, and the weight's and scale's gradients are zero.
TEST(RmsAdaLNGpu, ZeroTokens) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(8500);
  std::vector<at::Tensor> in = {rnd({2, 0, 64}, g, at::kFloat), rnd({64}, g, at::kFloat, 0.3, 1.0),
                                rnd({2, 64}, g, at::kBFloat16, 0.5)};
  for (at::Tensor& t : in) t.requires_grad_(true);
  const at::Tensor h = rms_adaln(in[0], in[1], in[2], at::kBFloat16);
  ASSERT_EQ(h.numel(), 0);
  const auto gr = torch::autograd::grad({h}, in, {at::ones_like(h)});
  EXPECT_EQ(gr[0].numel(), 0);
  EXPECT_EQ(gr[1].abs().max().item<double>(), 0.0) << "dweight";
  EXPECT_EQ(gr[2].abs().max().item<double>(), 0.0) << "dscale";
}

// Bad inputs that only exist on a GPU: tensors on different devices.
TEST(RmsAdaLNGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Tensor x = at::randn({2, 3, 8}).to(kCuda);
  const at::Tensor m = at::randn({2, 8}), w = at::randn({8});
  EXPECT_THROW(rms_adaln(x, w, m.to(kCuda), at::kBFloat16), UsageError);  // weight on the CPU
  EXPECT_THROW(rms_adaln(x, w.to(kCuda), m, at::kBFloat16), UsageError);  // scale on the CPU
  EXPECT_NO_THROW(rms_adaln(x, w.to(kCuda), m.to(kCuda), at::kBFloat16));
}

// rms_adaln -> a stand-in product -> rms_adaln, forward and backward (x,
// weights, modulation) captured in one CUDA graph and replayed: fails loudly on
// a host sync or a data-dependent allocation, and the replay reproduces the
// eager outputs and gradients bit for bit; with the weight gradients inline
// and on the weight-gradient stream.
TEST(RmsAdaLNGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(9000);
  const int64_t b = 4, t = 64, d = 384;
  const at::Tensor x = rnd({b, t, d}, g, at::kFloat).requires_grad_(true);
  const at::Tensor w1 = rnd({d}, g, at::kFloat, 0.3, 1.0).requires_grad_(true);
  const at::Tensor w2 = rnd({d}, g, at::kFloat, 0.3, 1.0).requires_grad_(true);
  const at::Tensor mod = rnd({b, 3 * d}, g, at::kBFloat16, 0.5).requires_grad_(true);
  const at::Tensor dout = rnd({b, t, d}, g, at::kBFloat16);
  for (const bool overlap : {false, true}) {
    auto step = [&] {
      std::vector<at::Tensor> grads;
      at::Tensor out;
      {
        const WeightGradStream lane(overlap, kCuda);
        const auto c = mod.chunk(3, 1);
        const at::Tensor h1 = rms_adaln(x, w1, c[0], at::kBFloat16);
        out = rms_adaln(h1 * 2, w2, c[1], at::kBFloat16);
        grads = torch::autograd::grad({out}, {x, w1, w2, mod}, {dout});
      }  // joins the weight-gradient stream
      std::vector<at::Tensor> result = {out.detach()};
      result.insert(result.end(), grads.begin(), grads.end());
      return result;
    };
    perftrain::testing::expect_graph_replays_match_eager(step, overlap ? "weight-gradient stream " : "inline ");
  }
}

}  // namespace
}  // namespace perftrain::ops
