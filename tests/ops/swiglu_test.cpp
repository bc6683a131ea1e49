// swiglu on the CPU: the op is its reference; the reference's values and
// gradients agree with at::silu(gate) * up on narrow() views of a leaf and
// with the closed-form derivative (odd F, 1-d to 4-d inputs, no rows);
// reduced dtypes compute in fp32 and keep their dtype, fp64 stays fp64 in
// the reference; strided inputs; bad inputs raise UsageError; the kernels'
// host-side access-width rule and size checks. swiglu_product (the gate-up
// product and SwiGLU as one op) on the CPU against the fp32 composition.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cuda_bf16.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/swiglu.h"
#include "ops/linear.h"
#include "ops/swiglu.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
at::Generator gen(uint64_t seed) { return perftrain::testing::seeded_cpu_generator(seed); }

// gate_up shapes [..., 2F]: odd and even F, one to four dimensions, one row.
const std::vector<std::vector<int64_t>> kShapes = {{2},        {1, 2},        {6},          {3, 14},
                                                   {2, 5, 74}, {1, 1, 2002},  {2, 3, 4, 16}, {7, 256}};

std::string name(at::IntArrayRef s, at::ScalarType dt) {
  std::ostringstream o;
  o << c10::toString(dt) << " " << s;
  return o.str();
}

std::vector<int64_t> out_shape(at::IntArrayRef s) {
  std::vector<int64_t> o(s.begin(), s.end());
  o.back() /= 2;
  return o;
}

TEST(Swiglu, CpuOpIsTheReference) {
  uint64_t seed = 1;
  for (const auto& s : kShapes)
    for (const auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Generator g = gen(seed++);
      const at::Tensor gu = (at::randn(s, g) * 3).to(dt);
      const at::Tensor out = swiglu(gu);
      EXPECT_EQ(out.scalar_type(), dt) << name(s, dt);
      EXPECT_EQ(out.sizes(), at::IntArrayRef(out_shape(s))) << name(s, dt);
      EXPECT_TRUE(at::equal(out, swiglu_reference(gu))) << name(s, dt);
      EXPECT_FALSE(out.isnan().any().item<bool>()) << name(s, dt);
    }
}

// fp32, random upstream gradient: the reference against the composition on
// narrow() views of the same leaf (the same ATen ops: equal up to 1e-7), and
// both against the closed form
//   d(gate) = dout * up * s * (1 + gate * (1 - s)), s = sigmoid(gate);  d(up) = dout * silu(gate)
// (a different formula: fp32 rounding, atol 1e-5 + rtol 1e-5).
TEST(Swiglu, CpuReferenceMatchesCompositionAndClosedForm) {
  uint64_t seed = 100;
  for (const auto& s : kShapes) {
    at::Generator g = gen(seed++);
    const int64_t f = s.back() / 2;
    const at::Tensor gu0 = at::randn(s, g) * 3;
    const at::Tensor dout = at::randn(out_shape(s), g);
    auto run = [&](bool ours) {
      const at::Tensor gu = gu0.clone().requires_grad_(true);
      const at::Tensor out =
          ours ? swiglu_reference(gu) : at::silu(gu.narrow(-1, 0, f)) * gu.narrow(-1, f, f);
      const at::Tensor dgu = torch::autograd::grad({out}, {gu}, {dout})[0];
      return std::vector<at::Tensor>{out.detach(), dgu};
    };
    const auto ours = run(true), comp = run(false);
    const std::string where = name(s, at::kFloat);
    expect_close(ours[0], comp[0], 1e-7, 1e-7, where + " out");
    expect_close(ours[1], comp[1], 1e-7, 1e-7, where + " d(gate_up)");
    EXPECT_EQ(ours[1].sizes(), gu0.sizes()) << where;

    const at::Tensor gate = gu0.narrow(-1, 0, f), up = gu0.narrow(-1, f, f);
    const at::Tensor sg = at::sigmoid(gate);
    const at::Tensor want_out = gate * sg * up;
    const at::Tensor want_grad =
        at::cat({dout * up * sg * (1 + gate * (1 - sg)), dout * gate * sg}, -1);
    expect_close(ours[0], want_out, 1e-5, 1e-5, where + " out (closed form)");
    expect_close(ours[1], want_grad, 1e-5, 1e-5, where + " d(gate_up) (closed form)");
  }
}

// bf16/fp16: computed in fp32 from the stored values and rounded once; the
// gradient comes back in the input's dtype. fp64 (the reference only) stays
// fp64 and matches the closed form to 1e-12.
TEST(Swiglu, CpuReducedDtypesComputeInFp32AndFp64StaysFp64) {
  uint64_t seed = 200;
  for (const auto& s : kShapes) {
    const int64_t f = s.back() / 2;
    for (const auto dt : {at::kBFloat16, at::kHalf}) {
      at::Generator g = gen(seed++);
      const at::Tensor gu = (at::randn(s, g) * 3).to(dt);
      const at::Tensor gf = gu.to(at::kFloat);
      const at::Tensor want = (at::silu(gf.narrow(-1, 0, f)) * gf.narrow(-1, f, f)).to(dt);
      EXPECT_TRUE(at::equal(swiglu(gu), want)) << name(s, dt);
      const at::Tensor leaf = gu.clone().requires_grad_(true);
      const at::Tensor dout = at::randn(out_shape(s), g).to(dt);
      const at::Tensor dgu = torch::autograd::grad({swiglu(leaf)}, {leaf}, {dout})[0];
      EXPECT_EQ(dgu.scalar_type(), dt) << name(s, dt);
      EXPECT_EQ(dgu.sizes(), gu.sizes()) << name(s, dt);
      // Against fp32 autograd on the same stored values: one rounding of each gradient element.
      const at::Tensor leaf32 = gf.clone().requires_grad_(true);
      const at::Tensor d32 = torch::autograd::grad({swiglu(leaf32)}, {leaf32}, {dout.to(at::kFloat)})[0];
      expect_close(dgu, d32, 1e-3, 1e-2, name(s, dt) + " d(gate_up)");
    }
    at::Generator g = gen(seed++);
    const at::Tensor gu = at::randn(s, g, at::TensorOptions().dtype(at::kDouble)) * 3;
    const at::Tensor out = swiglu_reference(gu);
    EXPECT_EQ(out.scalar_type(), at::kDouble);
    const at::Tensor gate = gu.narrow(-1, 0, f), up = gu.narrow(-1, f, f);
    expect_close(out, gate * at::sigmoid(gate) * up, 1e-12, 1e-12, name(s, at::kDouble));
  }
}

// A strided gate_up (a column block of a wider tensor, a transposed view)
// gives what its dense copy gives, values and gradient; no rows gives no rows.
TEST(Swiglu, CpuStridedAndEmptyInputs) {
  at::Generator g = gen(7);
  const at::Tensor wide = at::randn({5, 40}, g);
  const at::Tensor block = wide.narrow(1, 3, 22);  // [5, 22], row stride 40
  EXPECT_TRUE(at::equal(swiglu(block), swiglu(block.contiguous())));
  const at::Tensor t = at::randn({18, 4}, g).t();  // [4, 18], last dim strided
  EXPECT_TRUE(at::equal(swiglu(t), swiglu(t.contiguous())));
  const at::Tensor leaf = wide.clone().requires_grad_(true);
  const at::Tensor dout = at::randn({5, 11}, g);
  const at::Tensor d = torch::autograd::grad({swiglu(leaf.narrow(1, 3, 22))}, {leaf}, {dout})[0];
  const at::Tensor dense = block.contiguous().requires_grad_(true);
  const at::Tensor dd = torch::autograd::grad({swiglu(dense)}, {dense}, {dout})[0];
  expect_close(d.narrow(1, 3, 22), dd, 0, 0, "strided gradient");
  EXPECT_EQ(d.narrow(1, 0, 3).abs().max().item<double>(), 0.0);
  const at::Tensor none = swiglu(at::randn({0, 3, 10}, g));
  EXPECT_EQ(none.sizes(), at::IntArrayRef({0, 3, 5}));
}

TEST(Swiglu, BadInputsRaiseUsageError) {
  using testing::error_of;
  for (auto f : {&swiglu, &swiglu_reference}) {
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn({4, 7})); }).find("swiglu: gate_up's last dimension must be 2F"),
              std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn({3})); }).find("last dimension must be 2F"), std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn({4, 0})); }).find("last dimension must be 2F"),
              std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn(at::IntArrayRef{})); }).find("0-d"), std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::Tensor()); }).find("defined"), std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn({4, 8}).to(at::kInt)); })
                  .find("swiglu: gate_up must be float32, bfloat16 or float16"),
              std::string::npos);
    EXPECT_NE(error_of<UsageError>([&] { f(at::randn({4, 8}).to(at::kLong)); }).find("gate_up must be float32"),
              std::string::npos);
  }
  // fp64 is for the reference (the float64 comparisons of the GPU tests), not the op.
  EXPECT_NE(error_of<UsageError>([&] { swiglu(at::randn({4, 8}).to(at::kDouble)); }).find("gate_up must be float32"),
            std::string::npos);
}

// swiglu_linear on the CPU is the composition linear(swiglu(.)), values and
// gradients; a weight that does not take F inputs is refused.
TEST(Swiglu, CpuSwigluLinearIsTheComposition) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor gate_up = at::randn({2, 5, 22}, g), w = at::randn({6, 11}, g), gout = at::randn({2, 5, 6}, g);
  const auto run = [&](bool fused) {
    const at::Tensor x = gate_up.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    const at::Tensor y = fused ? swiglu_linear(x, wl) : ops::linear(swiglu(x), wl);
    const auto d = torch::autograd::grad({y}, {x, wl}, {gout});
    return std::vector<at::Tensor>{y.detach(), d[0], d[1]};
  };
  const auto got = run(true), want = run(false);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "output/gradient " << i;
  EXPECT_THROW(swiglu_linear(gate_up, at::randn({6, 22}, g)), UsageError);
  EXPECT_THROW(swiglu_linear(at::randn({2, 5, 21}, g), w), UsageError);
}

// The kernels' host-side rules (no GPU needed): the access width is the
// widest of 8, 4, 2, 1 elements that divides F and keeps every pointer
// aligned to one access (at most 16 bytes); bad sizes throw before launching.
TEST(Swiglu, KernelVectorWidthAndSizeChecks) {
  using kernels::swiglu_vector_width;
  alignas(16) static unsigned char buf[64];
  const void* a16 = buf;
  for (const int f : {1024, 3072, 2752, 8}) {
    EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(f, a16, a16, nullptr), 8) << f;
    EXPECT_EQ(swiglu_vector_width<float>(f, a16, a16, a16), 8) << f;
  }
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1028, a16, a16, a16), 4);
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1030, a16, a16, a16), 2);
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1001, a16, a16, a16), 1);
  EXPECT_EQ(swiglu_vector_width<float>(1028, a16, a16, a16), 4);
  // Alignment: bf16 8 elements need 16 bytes, 4 need 8, 2 need 4; fp32 8 and 4 need 16, 2 need 8.
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1024, a16, buf + 8, nullptr), 4);
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1024, buf + 4, a16, nullptr), 2);
  EXPECT_EQ(swiglu_vector_width<__nv_bfloat16>(1024, a16, a16, buf + 2), 1);
  EXPECT_EQ(swiglu_vector_width<float>(1024, a16, buf + 8, nullptr), 2);
  EXPECT_EQ(swiglu_vector_width<float>(1024, buf + 4, a16, nullptr), 1);
  EXPECT_EQ(swiglu_vector_width<float>(1024, a16, a16, buf + 16), 8);

  using bf16 = __nv_bfloat16;
  const bf16* in = reinterpret_cast<const bf16*>(buf);
  bf16* out = reinterpret_cast<bf16*>(buf + 32);
  EXPECT_THROW(kernels::swiglu_forward<bf16>(in, out, 1, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(kernels::swiglu_forward<bf16>(in, out, -1, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(kernels::swiglu_forward<bf16>(in, out, 1, kernels::kSwigluMaxCols + 1, nullptr),
               std::invalid_argument);
  EXPECT_THROW(kernels::swiglu_backward<bf16>(in, in, out, 1, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(kernels::swiglu_backward<bf16>(in, nullptr, out, 2, 4, nullptr), std::invalid_argument);
  kernels::swiglu_forward<bf16>(in, out, 0, 4, nullptr);  // no rows: nothing to launch
}

// swiglu_product on the CPU (the references' composition) against the fp32
// composition written out with ATen: silu(x g^T) * (x u^T), values and the
// gradients of x, g and u, at odd sizes (F = 1, 3, 5; K = 7, 9; 1-d to 3-d
// x) in fp32 and bf16 (the gradients' dtype follows the fp32 weights).
TEST(SwigluProduct, CpuMatchesTheFp32ReferenceForwardAndBackward) {
  struct Case {
    std::vector<int64_t> x;
    int64_t f;
  };
  uint64_t seed = 300;
  for (const Case& c : {Case{{7}, 1}, Case{{2, 9}, 3}, Case{{3, 5, 7}, 5}, Case{{1, 2, 9}, 4}})
    for (const auto dt : {at::kFloat, at::kBFloat16}) {
      at::Generator g = gen(seed++);
      const int64_t k = c.x.back();
      const at::Tensor x0 = at::randn(c.x, g).to(dt), gw0 = at::randn({c.f, k}, g) * 0.3,
                       uw0 = at::randn({c.f, k}, g) * 0.3;
      std::vector<int64_t> hs = c.x;
      hs.back() = c.f;
      const at::Tensor dh = at::randn(hs, g).to(dt);
      auto run = [&](bool ours) {
        const at::Tensor x = x0.clone().requires_grad_(true), gw = gw0.clone().requires_grad_(true),
                         uw = uw0.clone().requires_grad_(true);
        at::Tensor h;
        if (ours) {
          h = swiglu_product(x, gw, uw);
        } else {
          const at::Tensor x32 = x.to(at::kFloat);
          h = (at::silu(at::matmul(x32, gw.t())) * at::matmul(x32, uw.t())).to(dt);
        }
        const auto d = torch::autograd::grad({h}, {x, gw, uw}, {dh});
        return std::vector<at::Tensor>{h.detach(), d[0], d[1], d[2]};
      };
      const auto got = run(true), want = run(false);
      const double tol = dt == at::kFloat ? 1e-5 : 2e-2;
      const char* what[] = {"h", "dx", "d(gate_w)", "d(up_w)"};
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what[i];
        EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what[i];
        expect_close(got[i].to(at::kFloat), want[i].to(at::kFloat), tol, tol,
                     name(c.x, dt) + " F " + std::to_string(c.f) + " " + what[i]);
      }
    }
}

// swiglu_product_linear on the CPU is swiglu_linear of stacked_linear: the
// same values and gradients as linear(swiglu_product(...)) (fp32, odd sizes).
TEST(SwigluProduct, CpuProductLinearIsTheComposition) {
  at::Generator g = gen(400);
  const at::Tensor x0 = at::randn({3, 5, 7}, g), gw0 = at::randn({5, 7}, g), uw0 = at::randn({5, 7}, g),
                   dw0 = at::randn({6, 5}, g), dy = at::randn({3, 5, 6}, g);
  auto run = [&](bool ours) {
    const at::Tensor x = x0.clone().requires_grad_(true), gw = gw0.clone().requires_grad_(true),
                     uw = uw0.clone().requires_grad_(true), dw = dw0.clone().requires_grad_(true);
    const at::Tensor y = ours ? swiglu_product_linear(x, gw, uw, dw) : ops::linear(swiglu_product(x, gw, uw), dw);
    const auto d = torch::autograd::grad({y}, {x, gw, uw, dw}, {dy});
    return std::vector<at::Tensor>{y.detach(), d[0], d[1], d[2], d[3]};
  };
  const auto got = run(true), want = run(false);
  for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 1e-5, 1e-5, "result " + std::to_string(i));
  EXPECT_THROW(swiglu_product_linear(x0, gw0, uw0, at::randn({6, 4})), UsageError);  // down takes F = 5
}

TEST(SwigluProduct, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({4, 8});
  EXPECT_THROW(swiglu_product(x, at::randn({3, 8}), at::randn({4, 8})), UsageError);  // F differs
  EXPECT_THROW(swiglu_product(x, at::randn({3, 7}), at::randn({3, 7})), UsageError);  // K differs
  EXPECT_THROW(swiglu_product(x, at::randn({3, 8}), at::randn({3, 8}).to(at::kDouble)), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
