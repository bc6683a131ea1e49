// On a GPU: qk_norm_rope against its reference computed in float64 on the
// same (upcast) inputs, forward and backward (the projection's qkv, of which
// q | k is read in place and v not at all; q_weight, k_weight), at
// head dims 32/64/72/96/128/256, token counts 288, 257 and 1, in bf16, fp16
// and fp32 storage, with and without weights; every element written (outputs
// and scratch pre-filled with NaN through the kernel launches, nothing
// outside q | k), bit-identical reruns, q and k as views of one dense q | k,
// a misaligned view, gradients of q and k apart (as cuDNN writes them) or one
// of them absent, the kernels' vector path and pair kernel on offsets that
// pick each, and capture of forward + backward in a CUDA graph.
// Skips without a GPU. Every failure prints the case and the largest error.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/qk_norm_rope.h"
#include "ops/qk_norm_rope.h"
#include "support/graph_checks.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

struct Case {
  int64_t b, t, heads, hd;
};
const std::vector<Case> kCases = {{2, 288, 3, 64}, {1, 257, 2, 72}, {2, 288, 2, 96}, {1, 257, 2, 128},
                                  {3, 1, 4, 72},   {2, 5, 2, 32},   {1, 33, 1, 256}, {4, 288, 16, 72}};

std::string name(const Case& c, at::ScalarType dt) {
  return "B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) + " H=" + std::to_string(c.heads) +
         " hd=" + std::to_string(c.hd) + " " + c10::toString(dt) + " ";
}

// cos, sin [T, hd/2] fp32 on the GPU, of random angles in [-3pi, 3pi].
std::pair<at::Tensor, at::Tensor> tables(int64_t t, int64_t hd, at::Generator& g) {
  const at::Tensor a = (at::rand({t, hd / 2}, g, at::kDouble) * 2 - 1) * 3 * M_PI;
  return {a.cos().to(at::kFloat).to(kCuda), a.sin().to(at::kFloat).to(kCuda)};
}

// q | k of a packed [B, T, 3D]: its first 2D columns, a view (the projection's layout).
at::Tensor qk_of(const at::Tensor& qkv) { return qkv.narrow(2, 0, qkv.size(2) / 3 * 2); }
// The op's q and k side by side, [B, T, 2D].
at::Tensor joined(const std::array<at::Tensor, 2>& qk) { return at::cat({qk[0], qk[1]}, 2); }
// The op's gradients from dout [B, T, 2D] (q | k): its halves, as two gradients.
std::vector<at::Tensor> halves(const at::Tensor& dout) {
  const int64_t d = dout.size(2) / 2;
  return {dout.narrow(2, 0, d), dout.narrow(2, d, d)};
}
// The op on qk_of(x), and the gradients of `inputs` for dout.
std::vector<at::Tensor> op_and_grads(const at::Tensor& x, int64_t heads, const at::Tensor& qw, const at::Tensor& kw,
                                     const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& dout,
                                     const std::vector<at::Tensor>& inputs) {
  const auto out = qk_norm_rope(qk_of(x), heads, qw, kw, cos, sin);
  std::vector<at::Tensor> res = {joined(out).detach()};
  for (const at::Tensor& gr : torch::autograd::grad({out[0], out[1]}, inputs, halves(dout))) res.push_back(gr);
  return res;
}
// The float64 reference on qk_of(x64), and the gradients of `inputs` for dout.
std::vector<at::Tensor> reference_and_grads(const at::Tensor& x64, int64_t heads, const at::Tensor& q64,
                                            const at::Tensor& k64, const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& dout, const std::vector<at::Tensor>& inputs) {
  const at::Tensor out64 =
      joined(qk_norm_rope_reference(qk_of(x64), heads, q64, k64, cos.to(at::kDouble), sin.to(at::kDouble)));
  std::vector<at::Tensor> res = {out64.detach()};
  for (const at::Tensor& gr : torch::autograd::grad({out64}, inputs, {dout.to(at::kDouble)})) res.push_back(gr);
  return res;
}

// Tolerances, by the result's dtype (row_op_checks.h): out and dqkv
// elementwise, bf16/fp16 2e-2 (one rounding of an O(1) value), fp32 1e-4 (a
// norm over <= 256 terms); the weight gradients (fp32 parameters: sums over
// B*T*H heads of fp32 products) relative L2 5e-5 (sqrt(4600) * 6e-8 * a margin
// of ~10), bf16 parameters 1e-2.
constexpr double kWeightGradTolFp32 = 5e-5;

TEST(QkNormRopeGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 2000;
  for (const Case& c : kCases) {
    for (const auto dt : {at::kBFloat16, at::kFloat, at::kHalf}) {
      for (const bool weights : {true, false}) {
        const std::string where = name(c, dt) + (weights ? "weights " : "no weights ");
        at::Generator g = gen(seed++);
        const int64_t d = c.heads * c.hd;
        const at::Tensor qkv = rnd({c.b, c.t, 3 * d}, g, dt, 1.5, 0.1);
        const at::Tensor qw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0), kw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0);
        const auto [cos, sin] = tables(c.t, c.hd, g);
        const at::Tensor dout = rnd({c.b, c.t, 2 * d}, g, dt);

        auto run = [&] {
          const at::Tensor x = qkv.detach().requires_grad_(true);
          const at::Tensor wq = weights ? qw.detach().requires_grad_(true) : at::Tensor();
          const at::Tensor wk = weights ? kw.detach().requires_grad_(true) : at::Tensor();
          std::vector<at::Tensor> inputs = {x};
          if (weights) inputs.insert(inputs.end(), {wq, wk});
          return op_and_grads(x, c.heads, wq, wk, cos, sin, dout, inputs);
        };
        const auto got = run();
        ASSERT_EQ(got[0].scalar_type(), dt) << where;
        ASSERT_EQ(got[1].scalar_type(), dt) << where;

        const at::Tensor x64 = qkv.to(at::kDouble).requires_grad_(true);
        const at::Tensor q64 = weights ? qw.to(at::kDouble).requires_grad_(true) : at::Tensor();
        const at::Tensor k64 = weights ? kw.to(at::kDouble).requires_grad_(true) : at::Tensor();
        std::vector<at::Tensor> inputs64 = {x64};
        if (weights) inputs64.insert(inputs64.end(), {q64, k64});
        const auto ref = reference_and_grads(x64, c.heads, q64, k64, cos, sin, dout, inputs64);

        expect_close(got[0], ref[0], where + "out");
        expect_close(got[1], ref[1], where + "dqkv");
        // v is no input: its gradient through the op is zero.
        EXPECT_EQ(got[1].narrow(2, 2 * d, d).abs().max().item<double>(), 0.0) << where << "dqkv v";
        if (weights) {
          ASSERT_EQ(got[2].scalar_type(), at::kFloat) << where;
          expect_rel_l2(got[2], ref[2], where + "dq_weight", kWeightGradTolFp32);
          expect_rel_l2(got[3], ref[3], where + "dk_weight", kWeightGradTolFp32);
        }

        expect_same_bits(got, run(), where);
      }
    }
  }
}

// Weights in bf16 (gradients in bf16), only one weight, and only the weights'
// gradients wanted; against float64.
TEST(QkNormRopeGpu, WeightDtypesAndPartialGradients) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(2500);
  const Case c{2, 257, 3, 72};
  const int64_t d = c.heads * c.hd;
  const at::Tensor qkv = rnd({c.b, c.t, 3 * d}, g, at::kBFloat16);
  const at::Tensor qw = rnd({c.hd}, g, at::kBFloat16, 0.5, 1.0), kw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0);
  const auto [cos, sin] = tables(c.t, c.hd, g);
  const at::Tensor dout = rnd({c.b, c.t, 2 * d}, g, at::kBFloat16);
  {  // bf16 q weight, fp32 k weight, weight gradients only
    const at::Tensor wq = qw.detach().requires_grad_(true), wk = kw.detach().requires_grad_(true);
    const auto gr = op_and_grads(qkv, c.heads, wq, wk, cos, sin, dout, {wq, wk});
    ASSERT_EQ(gr[1].scalar_type(), at::kBFloat16);
    ASSERT_EQ(gr[2].scalar_type(), at::kFloat);
    const at::Tensor q64 = qw.to(at::kDouble).requires_grad_(true), k64 = kw.to(at::kDouble).requires_grad_(true);
    const auto ref = reference_and_grads(qkv.to(at::kDouble), c.heads, q64, k64, cos, sin, dout, {q64, k64});
    expect_rel_l2(gr[1], ref[1], "bf16 dq_weight");
    expect_rel_l2(gr[2], ref[2], "fp32 dk_weight (weights only)", kWeightGradTolFp32);
  }
  {  // only a k weight: q normalised without one
    const at::Tensor x = qkv.detach().requires_grad_(true), wk = kw.detach().requires_grad_(true);
    const auto gr = op_and_grads(x, c.heads, at::Tensor(), wk, cos, sin, dout, {x, wk});
    const at::Tensor x64 = qkv.to(at::kDouble).requires_grad_(true), k64 = kw.to(at::kDouble).requires_grad_(true);
    const auto ref = reference_and_grads(x64, c.heads, at::Tensor(), k64, cos, sin, dout, {x64, k64});
    expect_close(gr[0], ref[0], "k weight only: out");
    expect_close(gr[1], ref[1], "k weight only: dqkv");
    expect_rel_l2(gr[2], ref[2], "k weight only: dk_weight", kWeightGradTolFp32);
  }
  {  // only a q weight: k normalised without one (the k weight's input edge is absent)
    const at::Tensor x = qkv.detach().requires_grad_(true), wq = kw.detach().requires_grad_(true);
    const auto gr = op_and_grads(x, c.heads, wq, at::Tensor(), cos, sin, dout, {x, wq});
    const at::Tensor x64 = qkv.to(at::kDouble).requires_grad_(true), q64 = kw.to(at::kDouble).requires_grad_(true);
    const auto ref = reference_and_grads(x64, c.heads, q64, at::Tensor(), cos, sin, dout, {x64, q64});
    expect_close(gr[0], ref[0], "q weight only: out");
    expect_close(gr[1], ref[1], "q weight only: dqkv");
    expect_rel_l2(gr[2], ref[2], "q weight only: dq_weight", kWeightGradTolFp32);
  }
}

// q and k are views of one dense [B, T, 2D] (rows 2D apart), the input is
// read in place (its q | k block of the projection's rows); only k used
// downstream (q's gradient absent) gives what a zero gradient of q gives;
// dq and dk in separate buffers (as cuDNN writes them) give what their
// packed join gives, bit for bit.
TEST(QkNormRopeGpu, OutputsShareOneBufferAndGradientsArriveApart) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(2700);
  const int64_t b = 2, t = 288, heads = 3, hd = 64, d = heads * hd;
  const at::Tensor qkv = rnd({b, t, 3 * d}, g, at::kBFloat16);
  const at::Tensor w = rnd({hd}, g, at::kFloat, 0.5, 1.0);
  const auto [cos, sin] = tables(t, hd, g);
  const auto out = qk_norm_rope(qk_of(qkv), heads, w, w, cos, sin);
  EXPECT_EQ(out[0].sizes(), at::IntArrayRef({b, t, d}));
  EXPECT_EQ(out[0].stride(1), 2 * d);
  EXPECT_EQ(static_cast<const char*>(out[1].data_ptr()) - static_cast<const char*>(out[0].data_ptr()),
            d * int64_t(sizeof(__nv_bfloat16)));
  const at::Tensor dq = rnd({b, t, d}, g, at::kBFloat16), dk = rnd({b, t, d}, g, at::kBFloat16);
  const at::Tensor x = qkv.detach().requires_grad_(true);
  const auto apart = qk_norm_rope(qk_of(x), heads, w, w, cos, sin);
  const at::Tensor g_apart = torch::autograd::grad({apart[0], apart[1]}, {x}, {dq, dk})[0];
  const auto joint = qk_norm_rope(qk_of(x), heads, w, w, cos, sin);
  const at::Tensor dqk = at::cat({dq, dk}, 2);
  const at::Tensor g_joint = torch::autograd::grad({joint[0], joint[1]}, {x}, halves(dqk))[0];
  EXPECT_TRUE(at::equal(g_apart, g_joint)) << "dq, dk apart vs packed";
  const auto only_k = qk_norm_rope(qk_of(x), heads, w, w, cos, sin);
  const at::Tensor g_k = torch::autograd::grad({only_k[1]}, {x}, {dk})[0];
  const auto zero_q = qk_norm_rope(qk_of(x), heads, w, w, cos, sin);
  const at::Tensor g_zero = torch::autograd::grad({zero_q[0], zero_q[1]}, {x}, {at::zeros_like(dq), dk})[0];
  EXPECT_TRUE(at::equal(g_k, g_zero)) << "absent dq vs zero dq";
}

// t [B, T, W] as the kernels' rows: q at column 0, k at column d.
template <typename T>
kernels::QkRows<T> rows_of(const at::Tensor& t, int64_t d) {
  T* p = static_cast<T*>(t.data_ptr());
  return {p, p + d, t.stride(1)};
}

// The kernels write every element of out, rstd, dx and the partials: all
// start as NaN; the results must equal the op's (checked against float64
// above) bit for bit, and the partials summed must give its weight gradients.
// x is read in place from the projection's rows of 3D; out and dx are dense
// q | k; the gradient arrives as dq and dk apart.
TEST(QkNormRopeGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  using bf16 = __nv_bfloat16;
  uint64_t seed = 3000;
  for (const Case& c : {Case{1, 257, 2, 72}, Case{3, 1, 4, 64}, Case{2, 288, 3, 96}, Case{1, 7, 1, 128}}) {
    const std::string where = name(c, at::kBFloat16);
    at::Generator g = gen(seed++);
    const int64_t d = c.heads * c.hd;
    const int rows = int(c.b * c.t), heads = int(c.heads), hd = int(c.hd), tokens = int(c.t);
    const at::Tensor qkv = rnd({c.b, c.t, 3 * d}, g, at::kBFloat16);
    const at::Tensor qw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0), kw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0);
    const auto [cos, sin] = tables(c.t, c.hd, g);
    const at::Tensor dq = rnd({c.b, c.t, d}, g, at::kBFloat16), dk = rnd({c.b, c.t, d}, g, at::kBFloat16);
    const kernels::QkRows<const bf16> grad{static_cast<const bf16*>(dq.data_ptr()),
                                           static_cast<const bf16*>(dk.data_ptr()), d};

    at::Tensor out = nan_like({c.b, c.t, 2 * d}, at::kBFloat16), rstd = nan_like({c.b, c.t, 2, c.heads}, at::kFloat);
    kernels::qk_norm_rope_forward<bf16>(rows_of<const bf16>(qkv, d), qw.data_ptr<float>(), kw.data_ptr<float>(),
                                        cos.data_ptr<float>(), sin.data_ptr<float>(), rows_of<bf16>(out, d),
                                        rstd.data_ptr<float>(), rows, tokens, heads, hd, 1e-6f, launch.stream);
    const at::Tensor x = qkv.detach().requires_grad_(true);
    const at::Tensor wq = qw.detach().requires_grad_(true), wk = kw.detach().requires_grad_(true);
    const auto op_out = qk_norm_rope(qk_of(x), c.heads, wq, wk, cos, sin);
    EXPECT_TRUE(at::equal(out, joined(op_out))) << where << "forward";
    EXPECT_FALSE(rstd.isnan().any().item<bool>()) << where << "rstd";
    // rstd: of each head of q and k, against float64.
    const at::Tensor heads64 = qkv.to(at::kDouble).view({c.b, c.t, 3, c.heads, c.hd}).narrow(2, 0, 2);
    expect_close(rstd, (heads64.pow(2).mean(-1) + 1e-6).rsqrt(), where + "rstd", 1e-5);

    const int tiles = kernels::qk_norm_rope_backward_tiles(rows, heads, launch.sms);
    at::Tensor dx = nan_like({c.b, c.t, 2 * d}, at::kBFloat16);
    at::Tensor partials = nan_like({kernels::qk_norm_rope_backward_partials(tiles, hd)}, at::kFloat);
    kernels::qk_norm_rope_backward<bf16>(grad, rows_of<const bf16>(qkv, d), rstd.data_ptr<float>(),
                                         qw.data_ptr<float>(), kw.data_ptr<float>(), cos.data_ptr<float>(),
                                         sin.data_ptr<float>(), rows_of<bf16>(dx, d), partials.data_ptr<float>(),
                                         rows, tokens, heads, hd, tiles, launch.stream);
    const auto gr = torch::autograd::grad({op_out[0], op_out[1]}, {x, wq, wk}, {dq, dk});
    EXPECT_TRUE(at::equal(dx, qk_of(gr[0]))) << where << "dx";
    EXPECT_FALSE(partials.isnan().any().item<bool>()) << where << "partials";
    const at::Tensor p = partials.view({2, tiles, hd});
    expect_close(at::sum(p.select(0, 0), {0}), gr[1], where + "partials q", 1e-5);
    expect_close(at::sum(p.select(0, 1), {0}), gr[2], where + "partials k", 1e-5);

    // Without weight partials (no weight gradient wanted): dx the same bits.
    at::Tensor dx2 = nan_like({c.b, c.t, 2 * d}, at::kBFloat16);
    kernels::qk_norm_rope_backward<bf16>(grad, rows_of<const bf16>(qkv, d), rstd.data_ptr<float>(),
                                         qw.data_ptr<float>(), kw.data_ptr<float>(), cos.data_ptr<float>(),
                                         sin.data_ptr<float>(), rows_of<bf16>(dx2, d), nullptr, rows, tokens, heads,
                                         hd, tiles, launch.stream);
    EXPECT_TRUE(at::equal(dx2, dx)) << where << "dx without weight partials";
  }
}

// The kernels' vector path (8 or 4 elements a lane) and the pair kernel, called
// directly on the model family's head dims (and 36: V = 4 by shape; 130: pairs
// by shape), odd row counts, and data offsets that pick each path (0: V = 8 by
// alignment; 8 bytes: V = 4; 4 bytes: pairs). x in rows of 3D, out, dout and
// dx in rows of 2D. Each result against float64 (out, rstd, dx, the weight
// partials summed over tiles), every element written (NaN-prefilled), and
// vector = false (the pair kernel) on the same inputs within one rounding of
// the vector path. Prints the path and max errors.
template <typename T>
void vector_and_pair_paths(const Case& c, at::ScalarType dt, int64_t off, uint64_t seed) {
  const testing::KernelLaunch launch;
  const std::string where = name(c, dt) + "offset " + std::to_string(off) + " ";
  at::Generator g = gen(seed);
  const int64_t d = c.heads * c.hd;
  const int rows = int(c.b * c.t), heads = int(c.heads), hd = int(c.hd), tokens = int(c.t);
  // [b, t, w] views `off` elements into a NaN-filled buffer (the allocator's base is 256-byte aligned)
  auto at_offset = [&](const at::Tensor& fill, int64_t w) {
    const int64_t n = c.b * c.t * w;
    at::Tensor buf = nan_like({n + off + 16}, dt);
    at::Tensor v = buf.narrow(0, off, n).view({c.b, c.t, w});
    if (fill.defined()) v.copy_(fill);
    return v;
  };
  const at::Tensor qkv = at_offset(rnd({c.b, c.t, 3 * d}, g, dt, 1.5, 0.1), 3 * d);
  const at::Tensor dout = at_offset(rnd({c.b, c.t, 2 * d}, g, dt), 2 * d);
  const at::Tensor qw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0), kw = rnd({c.hd}, g, at::kFloat, 0.5, 1.0);
  const auto [cos, sin] = tables(c.t, c.hd, g);
  auto a = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
  const int tiles = kernels::qk_norm_rope_backward_tiles(rows, heads, launch.sms);

  // float64 reference: out, dx, the weight gradients, rstd
  const at::Tensor x64 = qkv.to(at::kDouble).requires_grad_(true);
  const at::Tensor q64 = qw.to(at::kDouble).requires_grad_(true), k64 = kw.to(at::kDouble).requires_grad_(true);
  const auto ref = reference_and_grads(x64, c.heads, q64, k64, cos, sin, dout, {x64, q64, k64});
  const at::Tensor dx64 = qk_of(ref[1]);
  const at::Tensor heads64 = qkv.to(at::kDouble).view({c.b, c.t, 3, c.heads, c.hd}).narrow(2, 0, 2);
  const at::Tensor rstd64 = (heads64.pow(2).mean(-1) + 1e-6).rsqrt();

  std::vector<at::Tensor> results[2];
  for (const bool vector : {true, false}) {
    at::Tensor out = at_offset(at::Tensor(), 2 * d), dx = at_offset(at::Tensor(), 2 * d);
    const uintptr_t strides = uintptr_t(2 * d * int64_t(sizeof(T))) | uintptr_t(3 * d * int64_t(sizeof(T)));
    const int v = vector ? kernels::qk_norm_rope_vector_elems(hd, int(sizeof(T)),
                                                              a(qkv) | a(out) | a(dout) | a(dx) | strides,
                                                              a(qw) | a(kw) | a(cos) | a(sin))
                         : 0;
    const std::string w = where + (vector ? "vector path (V = " + std::to_string(v) + ") " : "pair kernel ");
    std::printf("%s\n", w.c_str());
    const int want = !vector                                                        ? 0
                     : hd % 8 == 0 && (off * sizeof(T)) % std::min<size_t>(16, 8 * sizeof(T)) == 0 ? 8
                     : hd % 4 == 0 && hd <= 128 && (off * sizeof(T)) % std::min<size_t>(16, 4 * sizeof(T)) == 0
                         ? 4
                         : 0;
    EXPECT_EQ(v, want) << w << "path";
    at::Tensor rstd = nan_like({c.b, c.t, 2, c.heads}, at::kFloat);
    at::Tensor partials = nan_like({kernels::qk_norm_rope_backward_partials(tiles, hd)}, at::kFloat);
    kernels::qk_norm_rope_forward<T>(rows_of<const T>(qkv, d), qw.data_ptr<float>(), kw.data_ptr<float>(),
                                     cos.data_ptr<float>(), sin.data_ptr<float>(), rows_of<T>(out, d),
                                     rstd.data_ptr<float>(), rows, tokens, heads, hd, 1e-6f, launch.stream, vector);
    kernels::qk_norm_rope_backward<T>(rows_of<const T>(dout, d), rows_of<const T>(qkv, d), rstd.data_ptr<float>(),
                                      qw.data_ptr<float>(), kw.data_ptr<float>(), cos.data_ptr<float>(),
                                      sin.data_ptr<float>(), rows_of<T>(dx, d), partials.data_ptr<float>(), rows,
                                      tokens, heads, hd, tiles, launch.stream, vector);
    expect_close(out, ref[0], w + "out");
    expect_close(rstd, rstd64, w + "rstd", 1e-5);
    expect_close(dx, dx64, w + "dx");
    EXPECT_FALSE(partials.isnan().any().item<bool>()) << w << "partials";
    const at::Tensor pt = partials.view({2, tiles, hd});
    expect_rel_l2(at::sum(pt.select(0, 0), {0}), ref[2], w + "dq_weight", kWeightGradTolFp32);
    expect_rel_l2(at::sum(pt.select(0, 1), {0}), ref[3], w + "dk_weight", kWeightGradTolFp32);
    std::printf("  max |out - f64| %.3g, max |dx - f64| %.3g\n",
                (out.to(at::kDouble) - ref[0]).abs().max().item<double>(),
                (dx.to(at::kDouble) - dx64).abs().max().item<double>());
    results[vector ? 0 : 1] = {out, dx, rstd};
  }
  // The two paths: the same math, sums of squares in another order (rstd a few fp32 ulps apart).
  expect_close(results[0][0], results[1][0], where + "vector vs pair out");
  expect_close(results[0][1], results[1][1], where + "vector vs pair dx");
  expect_close(results[0][2], results[1][2], where + "vector vs pair rstd", 1e-6);
}

TEST(QkNormRopeGpu, VectorPathAndPairKernel) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 3200;
  for (const Case& c : {Case{1, 37, 12, 64}, Case{1, 288, 12, 64}, Case{3, 257, 2, 72}, Case{1, 289, 3, 96},
                        Case{1, 33, 5, 128}, Case{1, 37, 3, 36}, Case{1, 9, 2, 130}}) {
    for (const int64_t off : {0, 4, 2}) {  // bf16: 0, 8, 4 bytes
      vector_and_pair_paths<__nv_bfloat16>(c, at::kBFloat16, off, seed++);
      if (HasFatalFailure()) return;
    }
    vector_and_pair_paths<__half>(c, at::kHalf, 0, seed++);
    vector_and_pair_paths<float>(c, at::kFloat, 0, seed++);  // 16-byte words, two a lane
    vector_and_pair_paths<float>(c, at::kFloat, 2, seed++);  // 8 bytes: pairs
  }
}

// A view of odd row stride, a contiguous one whose data is not aligned to
// two elements (both copied inside the op) and non-contiguous incoming
// gradients give the contiguous results.
TEST(QkNormRopeGpu, MisalignedViewAndStridedGradient) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(3500);
  const int64_t b = 2, t = 33, heads = 2, hd = 64, d = heads * hd;
  const at::Tensor wide = rnd({b, t, 2 * d + 1}, g, at::kBFloat16);
  const at::Tensor view = wide.narrow(2, 1, 2 * d);  // rows 2D + 1 apart: not pair-aligned
  const at::Tensor w = rnd({hd}, g, at::kFloat, 0.5, 1.0);
  const auto [cos, sin] = tables(t, hd, g);
  const at::Tensor dout = rnd({b, t, 2 * d}, g, at::kBFloat16);
  const at::Tensor dout_t = dout.transpose(0, 1).contiguous().transpose(0, 1);  // same values, other strides
  auto run = [&](const at::Tensor& in, const at::Tensor& go) {
    const at::Tensor x = in.detach().requires_grad_(true);
    const auto out = qk_norm_rope(x, heads, w, w, cos, sin);
    return std::make_pair(joined(out).detach(), torch::autograd::grad({out[0], out[1]}, {x}, halves(go))[0]);
  };
  const auto a = run(view, dout_t), ref = run(view.contiguous(), dout);
  EXPECT_TRUE(at::equal(a.first, ref.first)) << "out";
  EXPECT_TRUE(at::equal(a.second, ref.second)) << "dqk";
  // Contiguous but one element off a pair boundary (so .contiguous() alone
  // would keep it: the op must copy it to an aligned one, not throw).
  const at::Tensor flat = rnd({b * t * 2 * d + 1}, g, at::kBFloat16);
  flat.narrow(0, 1, b * t * 2 * d).view({b, t, 2 * d}).copy_(view);
  const at::Tensor odd = flat.narrow(0, 1, b * t * 2 * d).view({b, t, 2 * d});
  ASSERT_TRUE(odd.is_contiguous());
  ASSERT_NE(reinterpret_cast<uintptr_t>(odd.data_ptr()) % 4, 0u);
  const auto o = run(odd, dout);
  EXPECT_TRUE(at::equal(o.first, ref.first)) << "out (odd offset)";
  EXPECT_TRUE(at::equal(o.second, ref.second)) << "dqk (odd offset)";
}

// Bad inputs that only exist on a GPU: tables on the CPU, a head too wide.
TEST(QkNormRopeGpu, GpuOnlyBadInputsRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(3600);
  const at::Tensor qk = rnd({1, 4, 2 * 16}, g, at::kBFloat16);
  const auto [cos, sin] = tables(4, 8, g);
  EXPECT_THROW(qk_norm_rope(qk, 2, at::Tensor(), at::Tensor(), cos.cpu(), sin), UsageError);
  EXPECT_THROW(qk_norm_rope(qk, 2, at::randn({8}), at::Tensor(), cos, sin), UsageError);  // weight on the CPU
  const at::Tensor wide = rnd({1, 2, 2 * 258}, g, at::kBFloat16);
  const auto [c2, s2] = tables(2, 258, g);
  EXPECT_THROW(qk_norm_rope(wide, 1, at::Tensor(), at::Tensor(), c2, s2), UsageError);
}

// Forward and backward (with weight gradients) captured in one CUDA graph
// and replayed: fails loudly on a host sync or a data-dependent allocation,
// and the replay reproduces the eager results bit for bit.
TEST(QkNormRopeGpu, ForwardAndBackwardCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = gen(4000);
  const int64_t b = 2, t = 257, heads = 4, hd = 72, d = heads * hd;
  const at::Tensor qkv = rnd({b, t, 3 * d}, g, at::kBFloat16).requires_grad_(true);
  const at::Tensor qw = rnd({hd}, g, at::kFloat, 0.5, 1.0).requires_grad_(true);
  const at::Tensor kw = rnd({hd}, g, at::kFloat, 0.5, 1.0).requires_grad_(true);
  const auto [cos, sin] = tables(t, hd, g);
  const at::Tensor dout = rnd({b, t, 2 * d}, g, at::kBFloat16);
  auto step = [&] { return op_and_grads(qkv * 2, heads, qw, kw, cos, sin, dout, {qkv, qw, kw}); };
  perftrain::testing::expect_graph_replays_match_eager(step, "qk_norm_rope ");
}

}  // namespace
}  // namespace perftrain::ops
