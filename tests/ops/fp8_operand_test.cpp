// The norms handing their outputs to fp8 linears as codes (ops/fp8_cast.h,
// Fp8Operand), on the CPU: adaln_layernorm_fp8, residual_adaln_fp8,
// rms_adaln_fp8 and residual_rms_adaln_fp8 give the bytes and amax of fp8_cast of the unfused norm's h; fp8_linear on such
// an operand gives the y, the gradients (x's back through the norm, the
// weight's from the transposed codes) and the state of fp8_linear on h;
// fp8_transpose is the transpose; codes of the wrong shape or format raise
// UsageError; a fused norm makes no h. fp8_linear_gelu and fp8_linear_swiglu
// (their references on the CPU) give what their ops apart give. (The CUDA
// kernels' bytes: kernels.emu_fp8_norm, kernels.emu_fp8 and fp8_gpu_test.cpp.)
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "base/error.h"
#include "ops/adaln_layernorm.h"
#include "ops/fp8_cast.h"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_gelu.h"
#include "ops/fp8_linear_swiglu.h"
#include "ops/residual_adaln.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "ops/row_norm_op.h"
#include "ops/swiglu.h"

namespace perftrain::ops {
namespace {

const at::Device kCpu(at::kCPU);

// A state whose x scale saturates some of h (|h| > 448 / x_scale).
Fp8Scaling state_with_scales(float x_scale = 150.f) {
  Fp8Scaling s = make_fp8_linear_scaling(4, kCpu);
  s.scale[kFp8X].fill_(x_scale);
  s.scale[kFp8W].fill_(60.f);
  s.scale[kFp8Dy].fill_(8.f);
  s.scale_inv.copy_(1 / s.scale);
  return s;
}

at::Tensor bits(const at::Tensor& q) { return q.view(at::kByte); }

// 448 / 600: |h| past 0.75 saturates, which some of the 240 values of h exceed whatever the draw (at 150,
// past 2.99, a draw with none was seen).
constexpr float kSaturatingScale = 600.f;

TEST(Fp8Operand, NormsWriteTheCodesAndAmaxOfTheCastOfH) {
  const at::Tensor x = at::randn({2, 5, 24}), y = at::randn({2, 5, 24}).to(at::kBFloat16);
  const at::Tensor mod = at::randn({2, 3, 24}) * 0.5, bias = at::randn({24});
  const at::Tensor gate = mod.select(1, 0), shift = mod.select(1, 1), scale = mod.select(1, 2);
  const at::Tensor h1 = adaln_layernorm(x, shift, scale, at::kBFloat16);
  const at::Tensor h2 = residual_adaln(x, gate, y, shift, scale, at::kBFloat16, 1e-6, bias).second;
  const at::Tensor w = at::randn({24}) * 0.3 + 1;
  const at::Tensor h3 = rms_adaln(x, w, scale, at::kBFloat16);
  const at::Tensor h4 = residual_rms_adaln(x, gate, y, bias, w, scale, at::kBFloat16).second;
  for (int which = 0; which < 4; ++which) {
    const at::Tensor h = which == 0 ? h1 : which == 1 ? h2 : which == 2 ? h3 : h4;
    const Fp8Scaling fused = state_with_scales(kSaturatingScale), plain = state_with_scales(kSaturatingScale);
    const Fp8Target t = fp8_linear_input_target(fused);
    const Fp8Operand op = which == 0   ? adaln_layernorm_fp8(x, shift, scale, at::kBFloat16, t)
                          : which == 1 ? residual_adaln_fp8(x, gate, y, shift, scale, at::kBFloat16, t, 1e-6, bias).second
                          : which == 2 ? rms_adaln_fp8(x, w, scale, at::kBFloat16, t)
                                       : residual_rms_adaln_fp8(x, gate, y, bias, w, scale, at::kBFloat16, t).second;
    const Fp8Target p = fp8_linear_input_target(plain);
    const at::Tensor want = fp8_cast(h.reshape({-1, 24}), p.scale, p.amax, Fp8Format::kE4M3);
    ASSERT_EQ(op.codes.sizes(), want.sizes());
    EXPECT_TRUE(at::equal(bits(op.codes), bits(want))) << which;
    EXPECT_TRUE(at::equal(fused.amax, plain.amax)) << which;
    EXPECT_GT(fused.amax[kFp8X].item<float>(), 448.f / kSaturatingScale) << "nothing saturated";
    EXPECT_TRUE(at::equal(op.x, h)) << which;  // the CPU writes h: the operand's x is it
  }
}

// fp8_linear on the norm's operand: the same y, the same gradients of the
// norm's inputs and of the weight and bias, the same state.
TEST(Fp8Operand, LinearOnTheCodesTrainsAsTheLinearOnH) {
  const at::Tensor x0 = at::randn({2, 8, 32}), mod0 = at::randn({2, 2, 32}) * 0.5;
  const at::Tensor w0 = at::randn({16, 32}) * 0.2, b0 = at::randn({16});
  const at::Tensor dy = at::randn({2, 8, 16});
  struct Run {
    at::Tensor y, dx, dmod, dw, db, amax;
  };
  auto run = [&](bool codes) {
    const at::Tensor x = x0.clone().requires_grad_(), mod = mod0.clone().requires_grad_();
    const at::Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const Fp8Scaling s = state_with_scales();
    const at::Tensor shift = mod.select(1, 0), scale = mod.select(1, 1);
    const Fp8Operand in = codes ? adaln_layernorm_fp8(x, shift, scale, at::kFloat, fp8_linear_input_target(s))
                                : Fp8Operand{adaln_layernorm(x, shift, scale, at::kFloat), at::Tensor()};
    const at::Tensor y = fp8_linear(in, w, b, s);
    const auto g = torch::autograd::grad({y}, {x, mod, w, b}, {dy});
    return Run{y.detach(), g[0], g[1], g[2], g[3], s.amax.clone()};
  };
  const Run fused = run(true), plain = run(false);
  EXPECT_TRUE(at::equal(fused.y, plain.y));
  EXPECT_TRUE(at::equal(fused.dx, plain.dx));
  EXPECT_TRUE(at::equal(fused.dmod, plain.dmod));
  EXPECT_TRUE(at::equal(fused.dw, plain.dw));
  EXPECT_TRUE(at::equal(fused.db, plain.db));
  EXPECT_TRUE(at::equal(fused.amax, plain.amax));
  EXPECT_GT(fused.dx.abs().sum().item<float>(), 0.f);
}

// fp8_linear_gelu on the CPU is its reference: fc1 as fp8_linear, the codes
// and amax of the cast of at::gelu(pre, "tanh") for fc2, so fc2 on them gives
// the y, gradients (x's, W1's and b1's back through GELU's backward and
// fc1's dY cast) and states of the three ops apart. (The CUDA function's
// prologues: kernels.emu_fp8 and fp8_gpu_test.cpp.)
TEST(Fp8Operand, LinearGeluIsFc1ThenTheCastOfGelu) {
  const at::Tensor x0 = at::randn({2, 5, 24}).to(at::kBFloat16), w1 = at::randn({32, 24}) / 4,
                   b1 = at::randn({32}) * 0.1, w2 = at::randn({16, 32}) / 6;
  const at::Tensor dy = at::randn({2, 5, 16}).to(at::kBFloat16);
  auto run = [&](bool fused) {
    const Fp8Scaling s1 = state_with_scales(), s2 = state_with_scales();
    const at::Tensor x = x0.clone().requires_grad_(), w1l = w1.clone().requires_grad_(),
                     b1l = b1.clone().requires_grad_(), w2l = w2.clone().requires_grad_();
    const at::Tensor y =
        fused ? fp8_linear(fp8_linear_gelu({x, at::Tensor()}, w1l, b1l, s1, fp8_linear_input_target(s2)), w2l,
                           at::Tensor(), s2)
              : fp8_linear(at::gelu(fp8_linear(x, w1l, b1l, s1), "tanh"), w2l, at::Tensor(), s2);
    const auto g = torch::autograd::grad({y}, {x, w1l, b1l, w2l}, {dy});
    return std::vector<at::Tensor>{y, g[0], g[1], g[2], g[3], s1.amax.clone(), s2.amax.clone()};
  };
  const auto fused = run(true), plain = run(false);
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(at::equal(fused[i], plain[i])) << i;
  EXPECT_GT(fused[1].abs().sum().item<float>(), 0.f);
  EXPECT_GT(fused[5][kFp8Dy].item<float>(), 0.f) << "fc1's dY amax is taken";
  const Fp8Scaling s1 = state_with_scales(), s2 = state_with_scales();
  const Fp8Operand op = fp8_linear_gelu({x0, at::Tensor()}, w1, b1, s1, fp8_linear_input_target(s2));
  const at::Tensor pre = fp8_linear(x0, w1, b1, state_with_scales());
  EXPECT_TRUE(at::equal(bits(op.codes), bits(fp8_quantize_reference(at::gelu(pre, "tanh").reshape({10, 32}),
                                                                      s2.scale.select(0, kFp8X), Fp8Format::kE4M3))));
  EXPECT_FALSE(op.codes_t.defined()) << "the reference leaves the transpose to fp8_linear";
  EXPECT_THROW(fp8_linear_gelu({x0, at::Tensor()}, w1.narrow(1, 0, 16), b1, s1, fp8_linear_input_target(s2)),
               UsageError);
  EXPECT_THROW(fp8_linear_gelu({x0, at::Tensor()}, w1, b1, s1, Fp8Target{}), UsageError);
  Fp8Operand wrong = op;
  wrong.codes_t = op.codes;  // [10, 32], not [32, 10]
  EXPECT_THROW(fp8_linear(wrong, w2, at::Tensor(), s2), UsageError);
}

// fp8_linear_swiglu on the CPU is its reference: the gate-up product as
// fp8_linear on the row blocks, the codes and amax of the cast of
// ops::swiglu for down, so down on them gives the y, gradients and states
// of the ops apart.
TEST(Fp8Operand, LinearSwigluIsTheProductThenTheCastOfSwiglu) {
  const at::Tensor x0 = at::randn({2, 5, 24}).to(at::kBFloat16), wg = at::randn({32, 24}) / 4,
                   wu = at::randn({32, 24}) / 4, wd = at::randn({16, 32}) / 6;
  const at::Tensor dy = at::randn({2, 5, 16}).to(at::kBFloat16);
  auto run = [&](bool fused) {
    const Fp8Scaling s1 = state_with_scales(), s2 = state_with_scales();
    const at::Tensor x = x0.clone().requires_grad_(), wgl = wg.clone().requires_grad_(),
                     wul = wu.clone().requires_grad_(), wdl = wd.clone().requires_grad_();
    const at::Tensor y =
        fused ? fp8_linear(fp8_linear_swiglu({x, at::Tensor()}, {wgl, wul}, s1, fp8_linear_input_target(s2)), wdl,
                           at::Tensor(), s2)
              : fp8_linear(swiglu(fp8_linear(x, std::vector<at::Tensor>{wgl, wul}, s1)), wdl, at::Tensor(), s2);
    const auto g = torch::autograd::grad({y}, {x, wgl, wul, wdl}, {dy});
    return std::vector<at::Tensor>{y, g[0], g[1], g[2], g[3], s1.amax.clone(), s2.amax.clone()};
  };
  const auto fused = run(true), plain = run(false);
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(at::equal(fused[i], plain[i])) << i;
  EXPECT_GT(fused[2].abs().sum().item<float>(), 0.f);
  EXPECT_GT(fused[5][kFp8Dy].item<float>(), 0.f) << "the product's dY amax is taken";
  const Fp8Scaling s1 = state_with_scales(), s2 = state_with_scales();
  const Fp8Operand op = fp8_linear_swiglu({x0, at::Tensor()}, {wg, wu}, s1, fp8_linear_input_target(s2));
  const at::Tensor h = swiglu(fp8_linear(x0, std::vector<at::Tensor>{wg, wu}, state_with_scales()));
  EXPECT_TRUE(at::equal(bits(op.codes), bits(fp8_quantize_reference(h.reshape({10, 32}), s2.scale.select(0, kFp8X),
                                                                      Fp8Format::kE4M3))));
  EXPECT_THROW(fp8_linear_swiglu({x0, at::Tensor()}, {wg}, s1, fp8_linear_input_target(s2)), UsageError);
  EXPECT_THROW(fp8_linear_swiglu({x0, at::Tensor()}, {wg, wu.narrow(0, 0, 16)}, s1, fp8_linear_input_target(s2)),
               UsageError);
}

TEST(Fp8Operand, TransposeAndStandIn) {
  const at::Tensor q = (at::randn({5, 7}) * 10).to(at::kFloat8_e4m3fn);
  const at::Tensor t = fp8_transpose(q);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(at::equal(bits(t), bits(q.t().contiguous())));
  EXPECT_THROW(fp8_transpose(at::zeros({5, 7})), UsageError);
  const at::Tensor s = fp8_stand_in({2, 3, 4}, at::TensorOptions().dtype(at::kBFloat16));
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(s.isnan().all().item<bool>());
}

TEST(Fp8Operand, CodesOfTheWrongShapeOrFormatRaiseUsageError) {
  const Fp8Scaling s = state_with_scales();
  const at::Tensor x = at::randn({4, 32}), w = at::randn({16, 32});
  const at::Tensor good = x.to(at::kFloat8_e4m3fn);
  EXPECT_NO_THROW(fp8_linear(Fp8Operand{x, good}, w, at::Tensor(), s));
  EXPECT_THROW(fp8_linear(Fp8Operand{x, good.narrow(0, 0, 3)}, w, at::Tensor(), s), UsageError);
  EXPECT_THROW(fp8_linear(Fp8Operand{x, x.to(at::kFloat8_e5m2)}, w, at::Tensor(), s), UsageError);
  EXPECT_THROW(adaln_layernorm_fp8(at::randn({1, 2, 32}), at::zeros({1, 32}), at::zeros({1, 32}), at::kBFloat16,
                                   Fp8Target{at::ones({2}), s.amax.select(0, 0)}),
               UsageError);
}

// A norm whose fp8 output is fused writes only the codes: its forward's
// tensors make no h (nothing would write or read it), and the h it hands on is
// the stand-in (no storage of its own); unfused (no fp8 output, or a residual
// op whose y is not in out_dtype) h is made as before.
TEST(Fp8Operand, AFusedNormMakesNoH) {
  const at::Tensor x = at::randn({2, 3, 16}), y32 = at::randn({2, 3, 16});
  const Fp8Scaling s = state_with_scales();
  const Fp8Target t = fp8_linear_input_target(s);
  const detail::RowNormTensors fused = detail::row_norm_tensors(x, at::Tensor(), at::kBFloat16, true, false, &t);
  EXPECT_FALSE(fused.h.defined());
  const detail::FusedFp8Output q = detail::fused_fp8_output(&t, fused, at::kBFloat16, "test");
  ASSERT_TRUE(q.fused);
  const detail::FinishedFp8Output out = detail::finish_fp8_output(q, &t, fused, at::kBFloat16, "test");
  EXPECT_EQ(out.h.sizes(), x.sizes());
  EXPECT_EQ(out.h.scalar_type(), at::kBFloat16);
  EXPECT_EQ(out.h.stride(0), 0) << "the stand-in, one element seen at every index";
  EXPECT_TRUE(out.h.isnan().all().item<bool>());
  EXPECT_TRUE(detail::row_norm_tensors(x, at::Tensor(), at::kBFloat16, true, false).h.defined());
  const detail::RowNormTensors residual = detail::row_norm_tensors(x, y32, at::kBFloat16, true, true, &t);
  EXPECT_TRUE(residual.h.defined()) << "y in fp32: the op casts h afterwards";
  EXPECT_FALSE(detail::fused_fp8_output(&t, residual, at::kBFloat16, "test").fused);
}

}  // namespace
}  // namespace perftrain::ops
