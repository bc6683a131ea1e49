// fp8 on the GPU (issue 39): the cast and cast-transpose kernels against the
// CPU reference bit for bit (bf16 and fp32 inputs, both formats, odd sizes,
// a misaligned input, NaN/Inf/huge/tiny values) with the amax; the delayed
// scaling kernel against the reference bit for bit (more slots than one
// table, histories up to the longest), also captured in a CUDA graph; the
// fp8 products against float64 (of the quantised values: fp32 accumulation;
// of the unquantised ones: within fp8's bound) and cuBLASLt's refusals;
// fp8_linear forward and backward against its reference, captured equals
// eager, bit-identical reruns; a weight as row blocks (cast in place) equal to
// its concatenation bit for bit; the GELU prologues against ATen's GELU and
// its backward, the SwiGLU ones against ops::swiglu, and fp8_linear_gelu and
// fp8_linear_swiglu against their ops apart. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "fp8_test_codes.h"
#include "gpu_products.h"
#include "ops/adaln_layernorm.h"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_gelu.h"
#include "ops/fp8_linear_swiglu.h"
#include "ops/residual_adaln.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "ops/swiglu.h"
#include "support/graph_checks.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace gpu_products;
const at::Device kCpu(at::kCPU);
const Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

// Codes equal, or both NaN (NaN's sign and payload are not the rule's).
::testing::AssertionResult same_codes(const at::Tensor& got, const at::Tensor& want, Fp8Format f) {
  const at::Tensor g = got.cpu().contiguous().view(at::kByte), w = want.cpu().contiguous().view(at::kByte);
  if (g.sizes() != w.sizes()) return ::testing::AssertionFailure() << "sizes " << g.sizes() << " vs " << w.sizes();
  const uint8_t *a = g.data_ptr<uint8_t>(), *b = w.data_ptr<uint8_t>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const bool ok = a[i] == b[i] || (fp8_codes::is_nan_code(a[i], f) && fp8_codes::is_nan_code(b[i], f));
    if (!ok && first < 0) first = i;
    bad += !ok;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << g.numel() << " codes differ; first at " << first << ": "
                                       << int(a[first]) << " vs " << int(b[first]);
}

// fp32 bits equal, any NaN equal to any NaN: the kernels keep a NaN's payload
// (a bf16 NaN made from a float one is 0xffff), ATen's amax gives its own.
bool same_floats(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().contiguous(), w = want.cpu().contiguous();
  const at::Tensor both_nan = g.isnan() & w.isnan();
  return g.sizes() == w.sizes() && at::equal(g.view(at::kInt).masked_fill(both_nan, 0), w.view(at::kInt).masked_fill(both_nan, 0));
}

// rows x cols over the whole fp8 range: N(0, 1) * 2^e, e in [-24, 20], with
// NaN, +-Inf, a huge and a subnormal value where there is room.
at::Tensor wide(int64_t rows, int64_t cols, uint64_t seed) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(seed);
  at::Tensor x = at::randn({rows, cols}, g) * at::exp2(at::randint(-24, 21, {rows, cols}, g, at::kFloat));
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 3e38f, 1e-40f};
  const at::Tensor flat = x.view({-1});
  for (int i = 0; i < 5 && 3 * i < flat.numel(); ++i) flat[3 * i].fill_(special[i]);
  return x;
}

// A CUDA copy 2 bytes past a 256-byte boundary when misalign (no vector path).
at::Tensor on_gpu(const at::Tensor& t, bool misalign) {
  if (!misalign) return t.to(kCuda);
  at::Tensor buf = at::empty({t.numel() + 1}, t.options().device(kCuda));
  at::Tensor view = buf.narrow(0, 1, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

TEST(Fp8Gpu, CastsMatchTheReferenceBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {7, 13}, {33, 65}, {64, 64}, {130, 257},
                                                           {256, 1152}};
  uint64_t seed = 1;
  for (const auto& [rows, cols] : shapes) {
    for (const auto dt : {at::kBFloat16, at::kFloat}) {
      for (const Fp8Format f : kFormats) {
        for (const bool misalign : {false, true}) {
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + c10::toString(dt) +
                                   " " + kernels::fp8_format_name(f) + (misalign ? " misaligned" : "");
          const at::Tensor x = wide(rows, cols, seed++).to(dt);
          const at::Tensor scale = at::full({1}, 3.7f), amax0 = at::full({1}, 0.f);
          const at::Tensor want = fp8_quantize_reference(x, scale, f);
          const at::Tensor want_amax = fp8_amax_reference(x).reshape({1});
          const at::Tensor xg = on_gpu(x, misalign), sg = scale.to(kCuda);
          at::Tensor amax = amax0.to(kCuda);
          EXPECT_TRUE(same_codes(fp8_cast(xg, sg, amax, f), want, f)) << what << " cast";
          EXPECT_TRUE(same_floats(amax, want_amax)) << what << " cast amax " << amax.item<float>();
          amax = amax0.to(kCuda);
          const Fp8Casts both = fp8_cast_transpose(xg, sg, amax, f);
          EXPECT_TRUE(same_codes(both.q, want, f)) << what << " cast-transpose q";
          EXPECT_TRUE(same_codes(both.q_t, want.t().contiguous(), f)) << what << " cast-transpose q_t";
          EXPECT_TRUE(same_floats(amax, want_amax)) << what << " cast-transpose amax";
          const Fp8Casts only_t = fp8_cast_transpose(xg, sg, at::Tensor(), f, false);
          EXPECT_TRUE(same_codes(only_t.q_t, want.t().contiguous(), f)) << what << " transpose only";
        }
      }
    }
  }
}

// States with random histories and amaxes (NaN, Inf, zero, subnormal among
// them), 700 slots in all (two tables), history lengths 1 .. 1024.
std::vector<Fp8Scaling> random_states(uint64_t seed) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(seed);
  std::vector<Fp8Scaling> states;
  const int64_t lengths[] = {1, 2, 16, 1024};
  for (int i = 0; i < 175; ++i) {
    Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE5M2, Fp8Format::kE4M3, Fp8Format::kE5M2},
                                    lengths[i % 4], kCpu);
    s.history.copy_(at::randn(s.history.sizes(), g).abs() * 10);
    s.amax.copy_(at::randn({4}, g).abs() * 10);
    s.scale.copy_(at::randn({4}, g).abs() + 0.5);
    const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.f,
                             1e-40f};
    if (i % 5 < 4) s.amax[i % 4].fill_(special[i % 5]);
    states.push_back(s);
  }
  return states;
}

Fp8Scaling to_device(const Fp8Scaling& s, const at::Device& d) {
  Fp8Scaling out = s;
  out.amax = s.amax.to(d, false, true);
  out.history = s.history.to(d, false, true);
  out.scale = s.scale.to(d, false, true);
  out.scale_inv = s.scale_inv.to(d, false, true);
  out.events = s.events.to(d, false, true);
  return out;
}

std::vector<const Fp8Scaling*> pointers(const std::vector<Fp8Scaling>& states) {
  std::vector<const Fp8Scaling*> out;
  for (const auto& s : states) out.push_back(&s);
  return out;
}

void expect_same_states(const std::vector<Fp8Scaling>& got, const std::vector<Fp8Scaling>& want,
                        const std::string& when) {
  for (size_t i = 0; i < got.size(); ++i) {
    const auto a = got[i].named_tensors(), b = want[i].named_tensors();
    for (size_t j = 0; j < a.size(); ++j)
      EXPECT_TRUE(same_floats(a[j].second, b[j].second)) << when << ": state " << i << " " << a[j].first;
  }
}

TEST(Fp8Gpu, ScalingUpdateMatchesTheReferenceBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  std::vector<Fp8Scaling> cpu = random_states(7), gpu;
  for (const auto& s : cpu) gpu.push_back(to_device(s, kCuda));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < cpu.size(); ++i) {  // the next step's amaxes
      const at::Tensor a = at::full({4}, float(step + 1) * (i % 7), at::kFloat);
      if (step > 0) {
        cpu[i].amax.copy_(a);
        gpu[i].amax.copy_(a);
      }
    }
    fp8_scaling_update(pointers(cpu), step);
    fp8_scaling_update(pointers(gpu), step);
    expect_same_states(gpu, cpu, "step " + std::to_string(step));
  }
}

TEST(Fp8Gpu, ScalingUpdateCapturesInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const std::vector<Fp8Scaling> start = random_states(8);
  std::vector<Fp8Scaling> eager, graphed;
  for (const auto& s : start) {
    eager.push_back(to_device(s, kCuda));
    graphed.push_back(to_device(s, kCuda));
  }
  compat::synchronize(kCuda);
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  fp8_scaling_update(pointers(graphed), 1);
  graph.capture_end();  // capturing ran nothing: graphed is still `start`
  for (int i = 0; i < 2; ++i) {
    fp8_scaling_update(pointers(eager), 1);
    graph.replay();
  }
  at::cuda::getCurrentCUDAStream().synchronize();
  expect_same_states(graphed, eager, "two replays");
}

// Quantised random operands [rows, k] at the scale their amax gives.
struct Quantised {
  at::Tensor x, q, scale_inv;  // x fp32 (GPU), q fp8 (GPU), scale_inv [1] (GPU)
};
Quantised quantise(int64_t rows, int64_t k, Fp8Format f, at::Generator& g, double sd) {
  Quantised out;
  out.x = rnd({rows, k}, g, at::kFloat, sd);
  const float scale = kernels::fp8_max(f) / out.x.abs().max().item<float>();
  const at::Tensor s = at::full({1}, scale, at::TensorOptions().device(kCuda));
  out.q = fp8_cast(out.x, s, at::Tensor(), f);
  out.scale_inv = s.reciprocal();
  return out;
}

// The forward product (E4M3 x E4M3, fast accumulation, bias, bf16 D) and the
// gradient ones (E5M2 x E4M3 and E4M3 x E5M2, fp32 D) at DiT's shapes.
TEST(Fp8Gpu, ProductsMatchFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  struct Case {
    int64_t m, k, n;
  };
  const std::vector<Case> cases = {{16, 32, 48}, {256, 1152, 3456}, {8192, 1152, 4608}, {512, 4608, 1152}};
  at::Generator g = cuda_gen(11);
  const int64_t fallbacks = gemm_fallback_count();
  for (const Case& c : cases) {
    const std::string what = "m=" + std::to_string(c.m) + " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n);
    const at::Tensor bias = rnd({c.n}, g, at::kBFloat16);
    struct Kind {
      Fp8Format fa, fb;
      at::ScalarType d;
      bool fast, with_bias;
    };
    for (const Kind& kind : {Kind{Fp8Format::kE4M3, Fp8Format::kE4M3, at::kBFloat16, true, true},
                             Kind{Fp8Format::kE5M2, Fp8Format::kE4M3, at::kFloat, false, false},
                             Kind{Fp8Format::kE4M3, Fp8Format::kE5M2, at::kFloat, false, false}}) {
      const Quantised a = quantise(c.m, c.k, kind.fa, g, 1.0), b = quantise(c.n, c.k, kind.fb, g, 0.05);
      const at::Tensor d = nan_like({c.m, c.n}, kind.d);
      ASSERT_TRUE(try_gemm_lt_fp8(a.q, a.scale_inv, b.q, b.scale_inv, d, kind.fast,
                                  kind.with_bias ? bias : at::Tensor()))
          << what << ": cuBLASLt refused a DiT-shaped fp8 product";
      const at::Tensor ad = fp8_dequantize_reference(a.q, a.scale_inv).to(at::kDouble),
                       bd = fp8_dequantize_reference(b.q, b.scale_inv).to(at::kDouble);
      at::Tensor exact = at::matmul(ad, bd.t()), unquantised = at::matmul(a.x.to(at::kDouble), b.x.to(at::kDouble).t());
      if (kind.with_bias) {
        exact = exact + bias.to(at::kDouble);
        unquantised = unquantised + bias.to(at::kDouble);
      }
      const double unit_a = kind.fa == Fp8Format::kE4M3 ? 1.0 / 16 : 1.0 / 8,
                   unit_b = kind.fb == Fp8Format::kE4M3 ? 1.0 / 16 : 1.0 / 8;
      EXPECT_LT(rel_l2(d, exact), kind.d == at::kBFloat16 ? 1e-2 : 2e-3) << what << " against its operands";
      EXPECT_LT(rel_l2(d, unquantised), unit_a + unit_b) << what << " against the unquantised product";
    }
  }
  EXPECT_EQ(gemm_fallback_count(), fallbacks);
}

// cuBLASLt returns NOT_SUPPORTED for a scale read through a pointer 4 or 8
// bytes past a 16-byte boundary (a slot of a packed [S] table), also after a
// plan made with aligned scales: the check refuses it before cuBLASLt is
// asked, and the scaling state keeps its slots 16 bytes apart.
TEST(Fp8Gpu, ProductsRefuseScalesOffSixteenByteBoundaries) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(13);
  const Quantised a = quantise(256, 1152, Fp8Format::kE4M3, g, 1.0), b = quantise(512, 1152, Fp8Format::kE4M3, g, 0.05);
  const at::Tensor aligned = nan_like({256, 512}, at::kBFloat16), offset = nan_like({256, 512}, at::kBFloat16);
  ASSERT_TRUE(try_gemm_lt_fp8(a.q, a.scale_inv, b.q, b.scale_inv, aligned, true)) << gemm_last_refusal();
  const at::Tensor table = at::zeros({8}, at::TensorOptions().device(kCuda));
  table.narrow(0, 1, 1).copy_(a.scale_inv);
  table.narrow(0, 2, 1).copy_(b.scale_inv);
  EXPECT_FALSE(try_gemm_lt_fp8(a.q, table.narrow(0, 1, 1), b.q, table.narrow(0, 2, 1), offset, true));
  EXPECT_NE(gemm_last_refusal().find("scale_inv"), std::string::npos) << gemm_last_refusal();
  const at::Tensor spaced = at::zeros({3, 4}, at::TensorOptions().device(kCuda));
  spaced.select(1, 0).narrow(0, 1, 1).copy_(a.scale_inv);
  spaced.select(1, 0).narrow(0, 2, 1).copy_(b.scale_inv);
  ASSERT_TRUE(try_gemm_lt_fp8(a.q, spaced.select(1, 0).narrow(0, 1, 1), b.q, spaced.select(1, 0).narrow(0, 2, 1),
                              offset, true))
      << gemm_last_refusal();
  EXPECT_TRUE(at::equal(aligned, offset));
  const Fp8Scaling state = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2}, 4, kCuda);
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(state.scale_inv.narrow(0, i, 1).data_ptr()) % 16, 0u) << "slot " << i;
}

TEST(Fp8Gpu, ProductsCuBlasLtCannotRunAreRefused) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(12);
  const Quantised a = quantise(24, 32, Fp8Format::kE4M3, g, 1.0), b = quantise(32, 32, Fp8Format::kE4M3, g, 1.0);
  const at::Tensor d = nan_like({24, 32}, at::kBFloat16);
  EXPECT_FALSE(try_gemm_lt_fp8(a.q, a.scale_inv, b.q, b.scale_inv, d, true)) << "m = 24 is not a multiple of 16";
  const Quantised e = quantise(32, 32, Fp8Format::kE5M2, g, 1.0), e2 = quantise(32, 32, Fp8Format::kE5M2, g, 1.0);
  EXPECT_FALSE(try_gemm_lt_fp8(e.q, e.scale_inv, e2.q, e2.scale_inv, nan_like({32, 32}, at::kFloat), false))
      << "E5M2 x E5M2";
  const at::Tensor x = rnd({24, 32}, g, at::kBFloat16);
  const Fp8Scaling s = make_fp8_linear_scaling(4, kCuda);
  EXPECT_THROW(fp8_linear(x, rnd({32, 32}, g, at::kFloat), at::Tensor(), s), UsageError);
  EXPECT_FALSE(fp8_linear_supported(x, rnd({32, 32}, g, at::kFloat)));
}

struct LinearCase {
  at::Tensor x, w, b, dy;
  Fp8Scaling state;
};

// A DiT-like layer: x [b, t, k] bf16, fp32 master weight and bias; the state
// calibrated by one step's amaxes.
LinearCase linear_case(int64_t b, int64_t t, int64_t k, int64_t n, uint64_t seed) {
  at::Generator g = cuda_gen(seed);
  LinearCase c;
  c.x = rnd({b, t, k}, g, at::kBFloat16, 1.0, 0.3);
  c.w = master({n, k}, g, at::kBFloat16, 1.0 / std::sqrt(double(k)));
  c.b = rnd({n}, g, at::kFloat);
  c.dy = rnd({b, t, n}, g, at::kBFloat16, 1e-3);
  c.state = make_fp8_linear_scaling(16, kCuda);
  c.state.amax[kFp8X].fill_(c.x.abs().max());
  c.state.amax[kFp8W].fill_(c.w.abs().max());
  c.state.amax[kFp8Dy].fill_(c.dy.abs().max());
  fp8_scaling_update({&c.state}, 0);
  return c;
}

std::vector<at::Tensor> linear_step(const LinearCase& c) {
  const at::Tensor x = c.x.detach().requires_grad_(true), w = c.w.detach().requires_grad_(true),
                   b = c.b.detach().requires_grad_(true);
  const at::Tensor y = fp8_linear(x, w, b, c.state);
  std::vector<at::Tensor> out = torch::autograd::grad({y}, {x, w, b}, {c.dy});
  out.insert(out.begin(), y.detach());
  return out;
}

TEST(Fp8Gpu, LinearMatchesItsReference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const int64_t shapes[][3] = {{1152, 3456, 8}, {1152, 4608, 8}, {4608, 1152, 4}, {48, 32, 1}};
  uint64_t seed = 20;
  for (const auto& s : shapes) {
    const LinearCase c = linear_case(s[2], 256, s[0], s[1], seed++);
    const std::string what = "k=" + std::to_string(s[0]) + " n=" + std::to_string(s[1]);
    std::vector<at::Tensor> got;
    count_fallbacks(what, true, [&] { got = linear_step(c); });
    ASSERT_EQ(got[0].scalar_type(), at::kBFloat16);
    ASSERT_EQ(got[2].scalar_type(), at::kFloat);
    const Fp8Scaling cpu = to_device(c.state, kCpu);
    const at::Tensor xc = c.x.cpu(), wc = c.w.cpu(), dyc = c.dy.cpu();
    const Fp8LinearGrads ref = fp8_linear_backward_reference(dyc, xc, wc, cpu);
    const std::vector<at::Tensor> want = {fp8_linear_reference(xc, wc, c.b.cpu(), cpu), ref.dx, ref.dw, ref.db};
    const char* names[] = {"y", "dx", "dW", "db"};
    for (int i = 0; i < 4; ++i) EXPECT_LT(rel_l2(got[i].cpu(), want[i]), 1e-2) << what << " " << names[i];
    // The casts recorded this step's amaxes.
    EXPECT_EQ(c.state.amax[kFp8X].item<float>(), fp8_amax_reference(c.x).item<float>()) << what;
    EXPECT_EQ(c.state.amax[kFp8Dy].item<float>(), fp8_amax_reference(c.dy).item<float>()) << what;
  }
}

TEST(Fp8Gpu, LinearRerunsAreBitIdentical) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const LinearCase c = linear_case(8, 256, 1152, 3456, 30);
  const auto first = linear_step(c), second = linear_step(c);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(at::equal(first[i], second[i])) << "output " << i;
}

TEST(Fp8Gpu, LinearCapturesInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const LinearCase c = linear_case(4, 256, 1152, 4608, 40);
  at::Generator g = cuda_gen(41);
  const at::Tensor x_next = rnd(c.x.sizes(), g, at::kBFloat16, 1.0, 0.3);
  expect_capture_matches_eager([&] { return linear_step(c); }, c.x, x_next);
}

// The norms' fused fp8 output (ops/fp8_cast.h, Fp8Operand) at DiT-XL/2's
// width and an odd one: the codes and amax of fp8_cast of the unfused norm's
// h, bit for bit; fp8_transpose of the codes the cast-transpose's q_t; and
// fp8_linear on the operand the y and gradients of fp8_linear on h.
TEST(Fp8Gpu, NormCodesAreTheCastOfTheirOutputBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const int64_t d : {1152, 72}) {
    at::Generator g = cuda_gen(50 + d);
    const at::Tensor x = rnd({4, 64, d}, g, at::kFloat, 2.0, 0.3), y = rnd({4, 64, d}, g, at::kBFloat16, 1.5, 0.0);
    const at::Tensor mod = rnd({4, 3, d}, g, at::kFloat, 0.5, 0.0).to(at::kBFloat16), bias = rnd({d}, g, at::kFloat, 0.5, 0.0);
    const at::Tensor gate = mod.select(1, 0), shift = mod.select(1, 1), scale = mod.select(1, 2);
    const at::Tensor w = rnd({d}, g, at::kFloat, 0.3, 1.0);
    const char* names[] = {" adaln_layernorm", " residual_adaln", " rms_adaln", " residual_rms_adaln"};
    for (int which = 0; which < 4; ++which) {
      const std::string what = std::to_string(d) + names[which];
      const Fp8Scaling fused = make_fp8_linear_scaling(4, kCuda), plain = make_fp8_linear_scaling(4, kCuda);
      for (const Fp8Scaling* s : {&fused, &plain}) s->scale[kFp8X].fill_(150.f);  // some of h saturates
      const Fp8Target t = fp8_linear_input_target(fused), p = fp8_linear_input_target(plain);
      const Fp8Operand op =
          which == 0   ? adaln_layernorm_fp8(x, shift, scale, at::kBFloat16, t)
          : which == 1 ? residual_adaln_fp8(x, gate, y, shift, scale, at::kBFloat16, t, 1e-6, bias).second
          : which == 2 ? rms_adaln_fp8(x, w, scale, at::kBFloat16, t)
                       : residual_rms_adaln_fp8(x, gate, y, bias, w, scale, at::kBFloat16, t).second;
      const at::Tensor h = which == 0   ? adaln_layernorm(x, shift, scale, at::kBFloat16)
                           : which == 1 ? residual_adaln(x, gate, y, shift, scale, at::kBFloat16, 1e-6, bias).second
                           : which == 2 ? rms_adaln(x, w, scale, at::kBFloat16)
                                        : residual_rms_adaln(x, gate, y, bias, w, scale, at::kBFloat16).second;
      const Fp8Casts want = fp8_cast_transpose(h.reshape({-1, d}), p.scale, p.amax, Fp8Format::kE4M3);
      EXPECT_TRUE(same_codes(op.codes, want.q, Fp8Format::kE4M3)) << what;
      EXPECT_TRUE(same_floats(fused.amax, plain.amax)) << what;
      EXPECT_TRUE(same_codes(fp8_transpose(op.codes), want.q_t, Fp8Format::kE4M3)) << what << " transpose";
      EXPECT_EQ(op.x.sizes(), h.sizes()) << what;
      EXPECT_TRUE(op.x.isnan().all().item<bool>()) << what << ": the stand-in, not a written h";
    }
  }
}

// Codes that differ from another cast's by at most one step in a few
// elements: our fp32 GELU (and its backward) rounds to ATen's bf16 but for
// at most one element in 10^4 (the compiler's contractions may differ).
void expect_codes_nearly(const at::Tensor& got, const at::Tensor& want, int64_t numel, double step,
                         const std::string& what) {
  const int64_t off = (got.view(at::kByte) != want.view(at::kByte)).sum().item<int64_t>();
  EXPECT_LE(off * 10000, numel) << what << ": " << off << " codes differ";
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat), finite = g.isfinite() & w.isfinite();
  EXPECT_LE((g - w).abs().masked_fill(~finite, 0).max().item<double>(), step) << what << ": a code more than one step off";
}

// The cast-transpose's GELU prologues on the GPU (kernels/fp8_cast.h): the
// codes, transposed codes and amax of fp8_cast_transpose(at::gelu(pre)) and
// of fp8_cast_transpose(at::gelu_backward(d, pre)) from one pass, the column
// partials the 64-row sums of the values cast (a whole-tile vector shape and
// odd edges), and a CUDA graph's replay the eager result.
TEST(Fp8Gpu, GeluProloguesCastAtensGeluAndItsBackward) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1024, 3072}, std::pair<int64_t, int64_t>{333, 80}}) {
    at::Generator g = cuda_gen(70 + rows);
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    const at::Tensor pre = rnd({rows, cols}, g, at::kBFloat16, 2.0, -0.2), dact = rnd({rows, cols}, g, at::kBFloat16);
    const Fp8Scaling fused = make_fp8_linear_scaling(4, kCuda), plain = make_fp8_linear_scaling(4, kCuda);
    for (const Fp8Scaling* s : {&fused, &plain}) {
      s->scale[kFp8X].fill_(150.f);   // some of act saturates
      s->scale[kFp8Dy].fill_(20000.f);  // and of d(pre)
    }
    const auto e4 = at::kFloat8_e4m3fn, e5 = at::kFloat8_e5m2;
    auto run = [&](kernels::Fp8Prologue p, const at::Tensor& partials) {
      const bool back = p == kernels::Fp8Prologue::kGeluTanhBackward;
      const int slot = back ? kFp8Dy : kFp8X;
      Fp8Casts out{at::empty({rows, cols}, pre.options().dtype(back ? e5 : e4)),
                   at::empty({cols, rows}, pre.options().dtype(back ? e5 : e4))};
      detail::fp8_cast_transpose_prologue(back ? dact : pre, back ? pre : at::Tensor(), rows, cols, p,
                                          back ? Fp8Format::kE5M2 : Fp8Format::kE4M3, fused.scale.select(0, slot),
                                          fused.amax.select(0, slot), out.q, out.q_t, partials);
      return out;
    };
    const at::Tensor partials = at::full({kernels::fp8_cast_partial_rows(rows), cols}, std::nanf(""),
                                         pre.options().dtype(at::kFloat));
    const Fp8Casts act = run(kernels::Fp8Prologue::kGeluTanh, at::Tensor());
    const Fp8Casts dpre = run(kernels::Fp8Prologue::kGeluTanhBackward, partials);
    const at::Tensor act_ref = at::gelu(pre, "tanh"), dpre_ref = at::gelu_backward(dact, pre, "tanh");
    const Fp8Casts want_act = fp8_cast_transpose(act_ref, plain.scale.select(0, kFp8X), plain.amax.select(0, kFp8X),
                                                 Fp8Format::kE4M3);
    const Fp8Casts want_dpre = fp8_cast_transpose(dpre_ref, plain.scale.select(0, kFp8Dy),
                                                  plain.amax.select(0, kFp8Dy), Fp8Format::kE5M2);
    expect_codes_nearly(act.q, want_act.q, rows * cols, 448.0 / 8, what + " act");
    expect_codes_nearly(dpre.q, want_dpre.q, rows * cols, 57344.0 / 4, what + " d(pre)");
    EXPECT_TRUE(same_codes(fp8_transpose(act.q), act.q_t, Fp8Format::kE4M3)) << what;
    EXPECT_TRUE(same_codes(fp8_transpose(dpre.q), dpre.q_t, Fp8Format::kE5M2)) << what;
    for (const int slot : {kFp8X, kFp8Dy})
      EXPECT_NEAR(fused.amax[slot].item<float>(), plain.amax[slot].item<float>(),
                  1e-2 * plain.amax[slot].item<float>())
          << what << " slot " << slot;
    // The partials: each 64-row group's column sums of d(pre) as stored.
    const int64_t tiles = kernels::fp8_cast_partial_rows(rows), padded = tiles * 64;
    const at::Tensor groups = at::cat({dpre_ref.to(at::kDouble), at::zeros({padded - rows, cols}, dpre_ref.options().dtype(at::kDouble))})
                                  .view({tiles, 64, cols})
                                  .sum(1);
    EXPECT_FALSE(partials.isnan().any().item<bool>()) << what << ": a partial not written";
    EXPECT_LE((partials.to(at::kDouble) - groups).abs().max().item<double>(),
              2e-3 * groups.abs().max().item<double>() + 1e-6)
        << what;
    perftrain::testing::expect_graph_replays_match_eager(
        [&] {
          const Fp8Casts o = run(kernels::Fp8Prologue::kGeluTanhBackward, partials);
          return std::vector<at::Tensor>{o.q.view(at::kByte), o.q_t.view(at::kByte), partials.clone()};
        },
        what);
  }
}

// A product fused with its activation's casts against its ops apart:
// run(fused, x_as_codes) returns y, the gradients and the two states' amax
// (named by `names`; the first state's amax second to last). For x as a
// tensor and as codes: each within 2e-2 of its largest |value| apart (one
// code in 10^4 taking its neighbour), a rerun bit for bit, the first
// product's dY amax taken.
void expect_fused_matches_ops_apart(const std::function<std::vector<at::Tensor>(bool, bool)>& run,
                                    const std::vector<std::string>& names, const std::string& what) {
  for (const bool codes : {false, true}) {
    const auto fused = run(true, codes), plain = run(false, codes), again = run(true, codes);
    ASSERT_EQ(fused.size(), names.size()) << what;
    for (size_t i = 0; i < fused.size(); ++i) {
      const double scale = plain[i].abs().max().item<double>();
      EXPECT_LE((fused[i].to(at::kDouble) - plain[i].to(at::kDouble)).abs().max().item<double>(), 2e-2 * scale)
          << what << " " << names[i] << (codes ? " (x as codes)" : "");
      EXPECT_TRUE(at::equal(fused[i], again[i])) << what << " " << names[i] << ": a rerun differs";
    }
    EXPECT_GT(fused[fused.size() - 2][kFp8Dy].item<float>(), 0.f) << what << ": the first product's dY amax is not taken";
  }
}

// An fp8 MLP's first half (`first`: fc1 and GELU, or the gate-up product
// and SwiGLU, on fresh leaves, states s1 and the second product's s2) and
// the second product on w2, under grad mode and under no-grad: the same y,
// activation codes and both amaxes, and no transposed codes without grad.
void expect_no_grad_forward_matches(const std::function<Fp8Operand(const Fp8Scaling&, const Fp8Scaling&)>& first,
                                    const at::Tensor& w2_0, const std::string& what) {
  auto forward = [&](bool grad) {
    const Fp8Scaling s1 = make_fp8_linear_scaling(4, kCuda), s2 = make_fp8_linear_scaling(4, kCuda);
    const at::Tensor w2 = w2_0.clone().requires_grad_();
    const c10::AutoGradMode mode(grad);
    const Fp8Operand act = first(s1, s2);
    EXPECT_EQ(act.codes_t.defined(), grad) << what;
    const at::Tensor y = fp8_linear(act, w2, at::Tensor(), s2);
    EXPECT_EQ(y.requires_grad(), grad) << what;
    return std::vector<at::Tensor>{y.detach(), act.codes.view(at::kByte).clone(), s1.amax.clone(), s2.amax.clone()};
  };
  const std::vector<at::Tensor> with_grad = forward(true), no_grad = forward(false);
  const char* names[] = {"y", "the activation's codes", "first amax", "second amax"};
  for (size_t i = 0; i < with_grad.size(); ++i)
    EXPECT_TRUE(at::equal(with_grad[i], no_grad[i])) << what << ": " << names[i] << " differs under no-grad";
}

// fp8_linear_gelu (ops/fp8_linear_gelu.h) against fp8_linear, at::gelu and
// fp8_linear apart (fc1, GELU, fc2 of a DiT MLP; x from a norm's codes and
// as a tensor): y, dX, dW1, db1, dW2 and both states' amax, to within what one
// code in 10^4 taking its neighbour moves; act not written; the backward
// captured in a CUDA graph replays the eager gradients; reruns bit for bit;
// under no-grad the same y without act's transposed codes.
TEST(Fp8Gpu, LinearGeluMatchesItsOpsApart) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  struct Shape {
    int64_t m, k, n, n2;
  };
  for (const Shape sh : {Shape{2048, 384, 1536, 384}, Shape{336, 80, 208, 48}}) {
    const std::string what = std::to_string(sh.m) + "x" + std::to_string(sh.k) + "->" + std::to_string(sh.n);
    at::Generator g = cuda_gen(90 + sh.m);
    const at::Tensor x0 = rnd({sh.m / 16, 16, sh.k}, g, at::kBFloat16), w10 = rnd({sh.n, sh.k}, g, at::kFloat, 0.06, 0.0),
                     b10 = rnd({sh.n}, g, at::kFloat, 0.3, 0.0), w20 = rnd({sh.n2, sh.n}, g, at::kFloat, 0.05, 0.0),
                     dy = rnd({sh.m / 16, 16, sh.n2}, g, at::kBFloat16);
    auto run = [&](bool fused, bool codes) {
      const Fp8Scaling s1 = make_fp8_linear_scaling(4, kCuda), s2 = make_fp8_linear_scaling(4, kCuda);
      const at::Tensor x = x0.clone().requires_grad_(), w1 = w10.clone().requires_grad_(),
                       b1 = b10.clone().requires_grad_(), w2 = w20.clone().requires_grad_();
      const Fp8Operand in =
          codes ? fp8_operand_of(x, fp8_linear_input_target(s1), "test") : Fp8Operand{x, at::Tensor(), at::Tensor()};
      at::Tensor y;
      if (fused) {
        const Fp8Operand act = fp8_linear_gelu(in, w1, b1, s1, fp8_linear_input_target(s2));
        EXPECT_TRUE(act.x.isnan().all().item<bool>()) << what << ": act is written";
        y = fp8_linear(act, w2, at::Tensor(), s2);
      } else {
        y = fp8_linear(at::gelu(fp8_linear(in, w1, b1, s1), "tanh"), w2, at::Tensor(), s2);
      }
      auto grads = torch::autograd::grad({y}, {x, w1, b1, w2}, {dy});
      grads.insert(grads.begin(), y.detach());
      grads.push_back(s1.amax.clone());
      grads.push_back(s2.amax.clone());
      return grads;
    };
    expect_fused_matches_ops_apart(run, {"y", "dx", "dw1", "db1", "dw2", "fc1 amax", "fc2 amax"}, what);
    const Fp8Scaling s1 = make_fp8_linear_scaling(4, kCuda), s2 = make_fp8_linear_scaling(4, kCuda);
    perftrain::testing::expect_graph_replays_match_eager(
        [&] {  // the states' amax only max-accumulates the same values again
          const at::Tensor x = x0.clone().requires_grad_(), w1 = w10.clone().requires_grad_(),
                           b1 = b10.clone().requires_grad_(), w2 = w20.clone().requires_grad_();
          const at::Tensor y =
              fp8_linear(fp8_linear_gelu({x, at::Tensor()}, w1, b1, s1, fp8_linear_input_target(s2)), w2, at::Tensor(), s2);
          return torch::autograd::grad({y}, {x, w1, b1, w2}, {dy});
        },
        what);
    // Under no-grad act's codes come from the row pass, with no transpose: the same codes, y and amax.
    expect_no_grad_forward_matches(
        [&](const Fp8Scaling& s1, const Fp8Scaling& s2) {
          return fp8_linear_gelu({x0.clone().requires_grad_(), at::Tensor()}, w10.clone().requires_grad_(),
                                 b10.clone().requires_grad_(), s1, fp8_linear_input_target(s2));
        },
        w20, what);
  }
}

// The cast-transpose's SwiGLU prologues on the GPU (kernels/fp8_cast.h): h's
// codes from gate_up against fp8_cast_transpose(ops::swiglu(gate_up)), and
// d(gate_up)'s codes from d(h) and gate_up against the cast-transpose of
// ops::swiglu's backward (a whole-tile shape and odd edges), the amax, and a
// CUDA graph's replay the eager result.
TEST(Fp8Gpu, SwigluProloguesCastSwigluAndItsBackward) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const auto& [rows, f] : {std::pair<int64_t, int64_t>{1024, 1536}, std::pair<int64_t, int64_t>{333, 80}}) {
    at::Generator g = cuda_gen(80 + rows);
    const std::string what = std::to_string(rows) + "x" + std::to_string(f);
    const at::Tensor gate_up = rnd({rows, 2 * f}, g, at::kBFloat16, 2.0, -0.2), dh = rnd({rows, f}, g, at::kBFloat16);
    const Fp8Scaling fused = make_fp8_linear_scaling(4, kCuda), plain = make_fp8_linear_scaling(4, kCuda);
    for (const Fp8Scaling* s : {&fused, &plain}) {
      s->scale[kFp8X].fill_(150.f);     // some of h saturates
      s->scale[kFp8Dy].fill_(20000.f);  // and of d(gate_up)
    }
    auto run = [&](bool back) {
      const int64_t out_cols = back ? 2 * f : f;
      const auto dt = back ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
      Fp8Casts out{at::empty({rows, out_cols}, gate_up.options().dtype(dt)),
                   at::empty({out_cols, rows}, gate_up.options().dtype(dt))};
      const int slot = back ? kFp8Dy : kFp8X;
      detail::fp8_cast_transpose_prologue(back ? dh : gate_up, back ? gate_up : at::Tensor(), rows, f,
                                          back ? kernels::Fp8Prologue::kSwigluBackward : kernels::Fp8Prologue::kSwiglu,
                                          back ? Fp8Format::kE5M2 : Fp8Format::kE4M3, fused.scale.select(0, slot),
                                          fused.amax.select(0, slot), out.q, out.q_t, at::Tensor());
      return out;
    };
    const Fp8Casts h = run(false), dgu = run(true);
    const at::Tensor gu = gate_up.clone().requires_grad_();
    const at::Tensor h_ref = swiglu(gu);
    const at::Tensor dgu_ref = torch::autograd::grad({h_ref}, {gu}, {dh})[0];
    const Fp8Casts want_h = fp8_cast_transpose(h_ref.detach(), plain.scale.select(0, kFp8X),
                                               plain.amax.select(0, kFp8X), Fp8Format::kE4M3);
    const Fp8Casts want_dgu = fp8_cast_transpose(dgu_ref, plain.scale.select(0, kFp8Dy), plain.amax.select(0, kFp8Dy),
                                                 Fp8Format::kE5M2);
    expect_codes_nearly(h.q, want_h.q, rows * f, 448.0 / 8, what + " h");
    expect_codes_nearly(dgu.q, want_dgu.q, rows * 2 * f, 57344.0 / 4, what + " d(gate_up)");
    EXPECT_TRUE(same_codes(fp8_transpose(h.q), h.q_t, Fp8Format::kE4M3)) << what;
    EXPECT_TRUE(same_codes(fp8_transpose(dgu.q), dgu.q_t, Fp8Format::kE5M2)) << what;
    for (const int slot : {kFp8X, kFp8Dy})
      EXPECT_NEAR(fused.amax[slot].item<float>(), plain.amax[slot].item<float>(), 1e-2 * plain.amax[slot].item<float>())
          << what << " slot " << slot;
    perftrain::testing::expect_graph_replays_match_eager(
        [&] {
          const Fp8Casts o = run(true);
          return std::vector<at::Tensor>{o.q.view(at::kByte), o.q_t.view(at::kByte)};
        },
        what);
  }
}

// fp8_linear_swiglu (ops/fp8_linear_swiglu.h) against fp8_linear on the row
// blocks, ops::swiglu and fp8_linear apart (the single-stream FFN's gate-up,
// SwiGLU and down; x from a norm's codes and as a tensor): y, dX, dW_gate,
// dW_up, dW_down and both states' amax, to within what one code in 10^4
// taking its neighbour moves; h not written; captured = eager; reruns bit
// for bit; under no-grad the same y, h's codes and amax, no transpose.
TEST(Fp8Gpu, LinearSwigluMatchesItsOpsApart) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  struct Shape {
    int64_t m, k, f, n2;
  };
  for (const Shape sh : {Shape{2048, 384, 1024, 384}, Shape{336, 80, 208, 48}}) {
    const std::string what = std::to_string(sh.m) + "x" + std::to_string(sh.k) + "->2x" + std::to_string(sh.f);
    at::Generator g = cuda_gen(110 + sh.m);
    const at::Tensor x0 = rnd({sh.m / 16, 16, sh.k}, g, at::kBFloat16), wg0 = rnd({sh.f, sh.k}, g, at::kFloat, 0.06, 0.0),
                     wu0 = rnd({sh.f, sh.k}, g, at::kFloat, 0.06, 0.0), wd0 = rnd({sh.n2, sh.f}, g, at::kFloat, 0.05, 0.0),
                     dy = rnd({sh.m / 16, 16, sh.n2}, g, at::kBFloat16);
    auto run = [&](bool fused, bool codes) {
      const Fp8Scaling s1 = make_fp8_linear_scaling(4, kCuda), s2 = make_fp8_linear_scaling(4, kCuda);
      const at::Tensor x = x0.clone().requires_grad_(), wg = wg0.clone().requires_grad_(),
                       wu = wu0.clone().requires_grad_(), wd = wd0.clone().requires_grad_();
      const Fp8Operand in =
          codes ? fp8_operand_of(x, fp8_linear_input_target(s1), "test") : Fp8Operand{x, at::Tensor(), at::Tensor()};
      at::Tensor y;
      if (fused) {
        const Fp8Operand h = fp8_linear_swiglu(in, {wg, wu}, s1, fp8_linear_input_target(s2));
        EXPECT_TRUE(h.x.isnan().all().item<bool>()) << what << ": h is written";
        y = fp8_linear(h, wd, at::Tensor(), s2);
      } else {
        y = fp8_linear(swiglu(fp8_linear(in, std::vector<at::Tensor>{wg, wu}, s1)), wd, at::Tensor(), s2);
      }
      auto grads = torch::autograd::grad({y}, {x, wg, wu, wd}, {dy});
      grads.insert(grads.begin(), y.detach());
      grads.push_back(s1.amax.clone());
      grads.push_back(s2.amax.clone());
      return grads;
    };
    expect_fused_matches_ops_apart(run, {"y", "dx", "dw_gate", "dw_up", "dw_down", "gate_up amax", "down amax"}, what);
    const Fp8Scaling s1 = make_fp8_linear_scaling(4, kCuda), s2 = make_fp8_linear_scaling(4, kCuda);
    perftrain::testing::expect_graph_replays_match_eager(
        [&] {  // the states' amax only max-accumulates the same values again
          const at::Tensor x = x0.clone().requires_grad_(), wg = wg0.clone().requires_grad_(),
                           wu = wu0.clone().requires_grad_(), wd = wd0.clone().requires_grad_();
          const at::Tensor y =
              fp8_linear(fp8_linear_swiglu({x, at::Tensor()}, {wg, wu}, s1, fp8_linear_input_target(s2)), wd, at::Tensor(), s2);
          return torch::autograd::grad({y}, {x, wg, wu, wd}, {dy});
        },
        what);
    // Under no-grad h's codes come from the row kernel, with no transpose: the same codes, y and amax.
    expect_no_grad_forward_matches(
        [&](const Fp8Scaling& s1, const Fp8Scaling& s2) {
          return fp8_linear_swiglu({x0.clone().requires_grad_(), at::Tensor()},
                                   {wg0.clone().requires_grad_(), wu0.clone().requires_grad_()}, s1,
                                   fp8_linear_input_target(s2));
        },
        wd0, what);
  }
}

TEST(Fp8Gpu, LinearOnNormCodesMatchesTheLinearOnH) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(60);
  const at::Tensor x0 = rnd({4, 64, 1152}, g, at::kFloat, 2.0, 0.3);
  const at::Tensor mod0 = rnd({4, 2, 1152}, g, at::kFloat, 0.5, 0.0).to(at::kBFloat16);
  const at::Tensor w0 = rnd({3456, 1152}, g, at::kFloat, 0.03, 0.0), dy = rnd({4, 64, 3456}, g, at::kBFloat16, 1.0, 0.0);
  auto run = [&](bool codes) {
    const at::Tensor x = x0.clone().requires_grad_(), mod = mod0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const Fp8Scaling s = make_fp8_linear_scaling(4, kCuda);
    const at::Tensor shift = mod.select(1, 0), scale = mod.select(1, 1);
    const Fp8Operand in = codes ? adaln_layernorm_fp8(x, shift, scale, at::kBFloat16, fp8_linear_input_target(s))
                                : Fp8Operand{adaln_layernorm(x, shift, scale, at::kBFloat16), at::Tensor()};
    const at::Tensor y = fp8_linear(in, w, at::Tensor(), s);
    auto grads = torch::autograd::grad({y}, {x, mod, w}, {dy});
    grads.insert(grads.begin(), y.detach());
    grads.push_back(s.amax.clone());
    return grads;
  };
  run(false);  // a first call settles any product tuning, so both runs below get the same algorithms
  const auto fused = run(true), plain = run(false);
  const char* names[] = {"y", "dx", "dmod", "dW", "amax"};
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(at::equal(fused[i], plain[i])) << names[i];
}

// A weight given as row blocks (ffn.gate_up's gate and up, then three blocks
// of which one is off the 16-byte column alignment of the transposed codes:
// the cast-transpose's element path) equals the product on the concatenation
// bit for bit: y, dX, each block's dW, the amax. The blocks are cast in place:
// the forward's peak memory stays at least the fp32 concatenation below the
// concatenating forward's.
TEST(Fp8Gpu, RowBlocksReadInPlaceEqualTheConcatenatedProductBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const std::vector<int64_t> sizes[] = {{3072, 3072}, {48, 40, 40}};
  uint64_t seed = 70;
  for (const auto& rows : sizes) {
    at::Generator g = cuda_gen(seed++);
    const int64_t k = 1152;
    int64_t n = 0;
    std::vector<at::Tensor> blocks;
    for (const int64_t r : rows) {
      blocks.push_back(master({r, k}, g, at::kBFloat16, 1.0 / std::sqrt(double(k))));
      n += r;
    }
    const at::Tensor x0 = rnd({4, 72, k}, g, at::kBFloat16, 1.0, 0.3), dy = rnd({4, 72, n}, g, at::kBFloat16, 1e-3);
    std::string what = "rows";
    for (const int64_t r : rows) what += " " + std::to_string(r);
    auto run = [&](bool as_blocks) {
      const Fp8Scaling s = make_fp8_linear_scaling(4, kCuda);
      s.amax.fill_(2.f);
      fp8_scaling_update({&s}, 0);
      const at::Tensor x = x0.clone().requires_grad_(true);
      std::vector<at::Tensor> ws;
      for (const at::Tensor& b : blocks) ws.push_back(b.clone().requires_grad_(true));
      compat::synchronize(kCuda);
      compat::reset_peak_memory(kCuda);
      const int64_t before = compat::allocated_bytes(kCuda);
      const at::Tensor y = as_blocks ? fp8_linear(x, ws, s) : fp8_linear(x, at::cat(ws, 0), at::Tensor(), s);
      compat::synchronize(kCuda);
      const int64_t peak = compat::peak_memory_bytes(kCuda) - before;
      std::vector<at::Tensor> inputs = {x};
      inputs.insert(inputs.end(), ws.begin(), ws.end());
      std::vector<at::Tensor> out = torch::autograd::grad({y}, inputs, {dy});
      out.insert(out.begin(), y.detach());
      out.push_back(s.amax.clone());
      return std::pair{out, peak};
    };
    run(false);  // a first call settles any product tuning
    const auto [got, got_peak] = run(true);
    const auto [want, want_peak] = run(false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(at::equal(got[i], want[i])) << what << " output " << i << " (y, dx, dW_0, ..., amax)";
    EXPECT_LE(got_peak + n * k * 4, want_peak) << what << ": the row blocks were concatenated";
  }
}

}  // namespace
}  // namespace perftrain::ops
