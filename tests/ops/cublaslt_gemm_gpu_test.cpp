// cuBLASLt products on the GPU (kernels::gemm_lt through ops::cublaslt_context,
// as ops::try_gemm_lt runs them): every epilogue against float64 on
// NaN-poisoned outputs (and which ones cuBLASLt takes, printed); tuned
// products stay right, are timed once and recorded; tuning deferred over a
// scope waits for the next call; cuBLASLt's GELU and its derivative are the
// tanh form. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones_like.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "gpu_products.h"
#include "kernels/gemm_lt.h"
#include "ops/cublaslt_workspace.h"

namespace perftrain::ops {
namespace {

using namespace gpu_products;
using kernels::GemmArgs;
using kernels::GemmEpilogue;

struct LtCase {
  int64_t m, n, k;
  bool ta, tb;
};

std::string describe(const LtCase& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         (c.ta ? " A^T" : "") + (c.tb ? " B^T" : "");
}

// Runs one epilogue; returns false (and prints) when cuBLASLt refuses it.
// tune_candidates: GemmContext's (0: the heuristic's first pick).
bool run_epilogue(const LtCase& c, GemmEpilogue ep, at::ScalarType dt, at::ScalarType d_dt, at::ScalarType bias_dt,
                  at::Generator& g, std::string* support_log, int tune_candidates = 0) {
  const at::Tensor a = c.ta ? rnd({c.k, c.m}, g, dt) : rnd({c.m, c.k}, g, dt);
  const at::Tensor b = c.tb ? rnd({c.n, c.k}, g, dt, 1.0 / std::sqrt(double(c.k)))
                            : rnd({c.k, c.n}, g, dt, 1.0 / std::sqrt(double(c.k)));
  const at::Tensor op_a = (c.ta ? a.t() : a).to(at::kDouble), op_b = (c.tb ? b.t() : b).to(at::kDouble);
  const at::Tensor prod = at::matmul(op_a, op_b);
  at::Tensor d = nan_like({c.m, c.n}, d_dt);
  at::Tensor bias, aux;
  const bool reads_bias = ep == GemmEpilogue::kBias || ep == GemmEpilogue::kGeluAuxBias;
  const bool writes_bias = ep == GemmEpilogue::kDGeluBGrad;
  if (reads_bias) bias = rnd({c.n}, g, bias_dt);
  if (writes_bias) bias = nan_like({c.n}, bias_dt);
  if (ep == GemmEpilogue::kGeluAuxBias) aux = nan_like({c.m, c.n}, d_dt);
  if (ep == GemmEpilogue::kDGelu || ep == GemmEpilogue::kDGeluBGrad) aux = rnd({c.m, c.n}, g, d_dt, 1.5);

  GemmArgs args;
  args.m = c.m, args.n = c.n, args.k = c.k;
  args.a = a.data_ptr(), args.trans_a = c.ta;
  args.b = b.data_ptr(), args.trans_b = c.tb;
  args.ab_type = gemm_dtype(dt, "A");
  args.d = d.data_ptr(), args.d_type = gemm_dtype(d_dt, "D");
  args.epilogue = ep;
  if (bias.defined()) args.bias = bias.data_ptr(), args.bias_type = gemm_dtype(bias_dt, "bias");
  if (aux.defined()) args.aux = aux.data_ptr();
  kernels::GemmContext ctx = cublaslt_context();
  ctx.tune_candidates = tune_candidates;
  const bool ok = kernels::gemm_lt_supported(args, ctx);
  *support_log += std::string(ok ? "  yes  " : "  NO   ") + kernels::gemm_describe(args) + "\n";
  if (!ok) {
    EXPECT_THROW(kernels::gemm_lt(args, ctx), kernels::GemmUnsupported);
    return false;
  }
  kernels::gemm_lt(args, ctx);

  const std::string what = std::string(kernels::gemm_epilogue_name(ep)) + " " + describe(c) + " ";
  const double tol = tolerance(dt);
  at::Tensor want_d = prod;
  if (reads_bias) want_d = want_d + bias.to(at::kDouble);
  if (ep == GemmEpilogue::kGeluAuxBias) {
    EXPECT_LT(rel_l2(aux, want_d), tol) << what << "aux (pre-activation)";
    want_d = at::gelu(want_d, "tanh");
  }
  if (ep == GemmEpilogue::kDGelu || ep == GemmEpilogue::kDGeluBGrad)
    want_d = at::gelu_backward(prod, aux.to(at::kDouble), "tanh");
  EXPECT_LT(rel_l2(d, want_d), tol) << what << "D";
  if (ep == GemmEpilogue::kDGeluBGrad) EXPECT_LT(rel_l2(bias, want_d.sum(0)), tol) << what << "bias gradient";
  return true;
}

TEST(CublasLtGemmGpu, EveryEpilogueMatchesFloat64OnPoisonedOutputs) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(1);
  std::string log;
  // The transposes the ops use: forward (B^T), input gradient (none),
  // weight gradient (A^T); a DiT size, a single row and odd sizes.
  const std::vector<LtCase> cases = {{1024, 1152, 384, false, true}, {1000, 384, 1536, false, false},
                                     {384, 1536, 1000, true, false}, {1, 1536, 384, false, true},
                                     {7, 24, 40, false, true},        {40, 24, 7, true, false}};
  const at::ScalarType bf = at::kBFloat16, f32 = at::kFloat;
  int refused_on_dit = 0;
  for (const LtCase& c : cases) {
    const bool dit = c.m >= 384 && c.n >= 384;
    auto run = [&](GemmEpilogue ep, at::ScalarType dt, at::ScalarType d_dt, at::ScalarType bias_dt) {
      return run_epilogue(c, ep, dt, d_dt, bias_dt, g, &log);
    };
    EXPECT_TRUE(run(GemmEpilogue::kDefault, bf, bf, f32)) << "plain bf16 product refused: " << describe(c);
    EXPECT_TRUE(run(GemmEpilogue::kDefault, f32, f32, f32)) << "plain TF32 product refused: " << describe(c);
    run(GemmEpilogue::kDefault, bf, f32, f32);  // bf16 in, fp32 out (weight gradients)
    // Which bias dtypes each epilogue takes (fp32 is what the ops try first).
    bool bias_ok = false, gelu_ok = false, dgelu_ok = false;
    for (const auto bias_dt : {f32, bf}) {
      bias_ok |= run(GemmEpilogue::kBias, bf, bf, bias_dt);
      if (c.n % 8 == 0) {
        gelu_ok |= run(GemmEpilogue::kGeluAuxBias, bf, bf, bias_dt);
        dgelu_ok |= run(GemmEpilogue::kDGeluBGrad, bf, bf, bias_dt);
      }
    }
    if (c.n % 8 == 0) dgelu_ok |= run(GemmEpilogue::kDGelu, bf, bf, f32);
    run(GemmEpilogue::kBias, f32, f32, f32);
    if (c.n % 8 == 0) run(GemmEpilogue::kGeluAuxBias, f32, f32, f32);
    if (dit) refused_on_dit += !bias_ok + !gelu_ok + !dgelu_ok;
  }
  std::printf("[gemm] cuBLASLt support (yes/NO per configuration):\n%s", log.c_str());
  EXPECT_EQ(refused_on_dit, 0) << "an epilogue family is refused at every bias dtype on a DiT shape";
}

// With tuning on, the first call of each configuration times the
// heuristic's candidates on the real (NaN-poisoned) buffers and then runs the
// chosen one: the results are still right, each configuration is timed once,
// and what was chosen is recorded. Shapes used nowhere else, so their plans
// are new here.
TEST(CublasLtGemmGpu, TunedProductsMatchFloat64AndAreRecorded) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(2);
  std::string log;
  const size_t before = kernels::gemm_tune_records().size();
  const std::vector<LtCase> cases = {{4104, 1544, 392, false, false}, {4104, 1160, 392, false, true},
                                     {392, 1544, 4104, true, false}};
  const at::ScalarType bf = at::kBFloat16, f32 = at::kFloat;
  for (const LtCase& c : cases) {
    EXPECT_TRUE(run_epilogue(c, GemmEpilogue::kDefault, bf, bf, f32, g, &log, 8)) << describe(c);
    run_epilogue(c, GemmEpilogue::kDGelu, bf, bf, f32, g, &log, 8);
    run_epilogue(c, GemmEpilogue::kBias, bf, bf, f32, g, &log, 8);
    // Second call of the same configuration: no second timing.
    EXPECT_TRUE(run_epilogue(c, GemmEpilogue::kDefault, bf, bf, f32, g, &log, 8)) << describe(c);
  }
  const auto records = kernels::gemm_tune_records();
  ASSERT_GT(records.size(), before) << "no configuration offered two candidates";
  std::printf("[gemm] tuning (8 candidates):\n");
  for (size_t i = before; i < records.size(); ++i) {
    const auto& r = records[i];
    std::printf("  %s: first pick %.4f ms, chosen %d of %d %.4f ms\n", r.what.c_str(), r.heuristic_ms, r.chosen,
                r.candidates, r.chosen_ms);
    EXPECT_GE(r.candidates, 2) << r.what;
    EXPECT_GE(r.chosen, 0) << r.what;
    EXPECT_LT(r.chosen, r.candidates) << r.what;
    EXPECT_GT(r.heuristic_ms, 0.0) << r.what;
    EXPECT_LE(r.chosen_ms, r.heuristic_ms) << r.what;
    for (size_t j = before; j < i; ++j) EXPECT_NE(records[j].what, r.what) << "timed twice";
  }
}

// Inside a GemmTuningDeferred (a training run's first step) a new shape runs
// on the first pick and is not timed; its first call after the scope times it.
TEST(CublasLtGemmGpu, DeferredTuningWaitsForTheNextCall) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(3);
  std::string log;
  const LtCase c{4112, 1552, 400, false, false};  // used nowhere else
  const size_t before = kernels::gemm_tune_records().size();
  {
    const GemmTuningDeferred deferred;
    EXPECT_TRUE(run_epilogue(c, GemmEpilogue::kDefault, at::kBFloat16, at::kBFloat16, at::kFloat, g, &log, 8));
  }
  EXPECT_EQ(kernels::gemm_tune_records().size(), before) << "timed inside the deferred scope";
  EXPECT_TRUE(run_epilogue(c, GemmEpilogue::kDefault, at::kBFloat16, at::kBFloat16, at::kFloat, g, &log, 8));
  const auto records = kernels::gemm_tune_records();
  ASSERT_EQ(records.size(), before + 1) << "not timed on the first call after the scope";
  EXPECT_NE(records.back().what.find("m=4112 n=1552 k=400"), std::string::npos) << records.back().what;
}

// Where `got` sits between two candidate functions a and b, by least
// squares: got ~ a + c (b - a). c ~ 0 means a, c ~ 1 means b; noise in got
// (an approximate tanh in the epilogue) averages out over the points.
double blend(const at::Tensor& got, const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor diff = b - a;
  return ((got.to(at::kDouble) - a) * diff).sum().item<double>() / (diff * diff).sum().item<double>();
}

// cuBLASLt documents GELU but not which form: x = k/64 and an identity
// weight make the pre-activation exact in TF32, so what is left is the GELU
// itself. The two forms differ by up to 4.7e-4 near |x| = 2.7 (their
// derivatives by 9e-4): the epilogue must sit at the tanh end.
TEST(CublasLtGemmGpu, CublasLtGeluIsTheTanhForm) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const int64_t m = 64, n = 8, k = 8;
  const auto opts = at::TensorOptions().device(kCuda).dtype(at::kFloat);
  const at::Tensor x = (at::arange(m * k, opts) - 256.0).div(64.0).view({m, k});  // [-4, 4) in steps of 1/64
  const at::Tensor w = at::eye(n, opts);                                             // [N, K], used as B^T
  const at::Tensor bias = (at::arange(n, opts) - 4.0).div(8.0);
  at::Tensor act = nan_like({m, n}, at::kFloat), pre = nan_like({m, n}, at::kFloat);
  GemmArgs args;
  args.m = m, args.n = n, args.k = k;
  args.a = x.data_ptr(), args.b = w.data_ptr(), args.trans_b = true;
  args.ab_type = kernels::GemmDtype::kF32, args.d_type = kernels::GemmDtype::kF32;
  args.d = act.data_ptr(), args.aux = pre.data_ptr(), args.bias = bias.data_ptr();
  args.epilogue = GemmEpilogue::kGeluAuxBias;
  const kernels::GemmContext ctx = cublaslt_context();
  if (!kernels::gemm_lt_supported(args, ctx)) GTEST_SKIP() << "GELU_AUX_BIAS refused: " << kernels::gemm_describe(args);
  kernels::gemm_lt(args, ctx);
  const at::Tensor want_pre = (x + bias).to(at::kDouble);
  EXPECT_LT((pre.to(at::kDouble) - want_pre).abs().max().item<double>(), 1e-6) << "aux is the exact pre-activation";
  const at::Tensor tanh_form = at::gelu(want_pre, "tanh"), erf_form = at::gelu(want_pre);
  const double c = blend(act, tanh_form, erf_form);
  const double err = (act.to(at::kDouble) - tanh_form).abs().max().item<double>();
  std::printf("[gemm] GELU epilogue: %.3f of the way from tanh to erf form; max |D - gelu_tanh| = %.3g\n", c, err);
  EXPECT_LT(std::abs(c), 0.25) << "the GELU epilogue is not the tanh form";
  EXPECT_LT(err, 2e-3);

  // The derivative: DGELU with dY = ones times an identity weight, aux = pre.
  const at::Tensor dy = at::ones_like(x);
  at::Tensor dpre = nan_like({m, n}, at::kFloat);
  GemmArgs back = args;
  back.a = dy.data_ptr(), back.b = w.data_ptr(), back.trans_b = false;  // dY [m, k] · W [k, n], W = I
  back.d = dpre.data_ptr(), back.aux = pre.data_ptr(), back.bias = nullptr;
  back.epilogue = GemmEpilogue::kDGelu;
  if (!kernels::gemm_lt_supported(back, ctx)) GTEST_SKIP() << "DGELU refused: " << kernels::gemm_describe(back);
  kernels::gemm_lt(back, ctx);
  const at::Tensor one = at::ones_like(want_pre);
  const at::Tensor dtanh = at::gelu_backward(one, want_pre, "tanh"), derf = at::gelu_backward(one, want_pre);
  const double dc = blend(dpre, dtanh, derf);
  const double derr = (dpre.to(at::kDouble) - dtanh).abs().max().item<double>();
  std::printf("[gemm] DGELU epilogue: %.3f of the way from tanh to erf form; max |D - gelu_tanh'| = %.3g\n", dc, derr);
  EXPECT_LT(std::abs(dc), 0.25) << "the DGELU epilogue is not the tanh form's derivative";
  EXPECT_LT(derr, 4e-3);
}

}  // namespace
}  // namespace perftrain::ops
