// cuBLASLt products on the GPU: every epilogue of kernels::gemm_lt against
// float64 on poisoned outputs (and which ones cuBLASLt takes, printed);
// cuBLASLt's GELU is the tanh form; ops::linear and ops::gelu_mlp forward and
// backward against float64 over the DiT shapes and odd ones, with the
// fallback count (0 expected on the DiT shapes); the ATen fallback is right
// where the fused GELU cannot run; both ops capture into a CUDA graph and
// replay to the eager result. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/gemm_lt.h"
#include "compat/compat.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"

namespace perftrain::ops {
namespace {

using kernels::GemmArgs;
using kernels::GemmEpilogue;

const at::Device kCuda(at::kCUDA, 0);

at::Generator cuda_gen(uint64_t seed) {
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(seed);
  return g;
}

// N(shift, scale^2) in dtype dt on the GPU.
at::Tensor rnd(at::IntArrayRef shape, at::Generator& g, at::ScalarType dt, double scale = 1.0, double shift = 0.0) {
  return (at::randn(shape, g, at::TensorOptions().device(kCuda)) * scale + shift).to(dt);
}

// fp32 master values exactly representable in dt, so that the per-call
// cast inside the ops is exact and the float64 reference multiplies the
// very numbers the Tensor Cores see.
at::Tensor master(at::IntArrayRef shape, at::Generator& g, at::ScalarType dt, double scale) {
  return rnd(shape, g, at::kFloat, scale).to(dt).to(at::kFloat);
}

// ||got - ref|| / ||ref||, NaN if got has any NaN.
double rel_l2(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor g = got.to(at::kDouble), r = ref.to(at::kDouble);
  if (g.isnan().any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
  return (g - r).norm().item<double>() / r.norm().item<double>();
}

// Relative L2 tolerances per compute dtype: bf16 8 mantissa bits (outputs
// rounded to 2^-9 relative), fp32 through TF32 (inputs rounded to 2^-11),
// fp16 11 bits. A NaN fails (NaN < tol is false).
double tolerance(at::ScalarType dt) { return dt == at::kBFloat16 ? 1e-2 : dt == at::kHalf ? 5e-3 : 2e-3; }

at::Tensor nan_like(at::IntArrayRef shape, at::ScalarType dt) {
  return at::full(shape, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().device(kCuda).dtype(dt));
}

// ---------------------------------------------------------------------------
// kernels::gemm_lt, each epilogue, on outputs poisoned with NaN.

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
  const bool writes_bias = ep == GemmEpilogue::kDGeluBGrad || ep == GemmEpilogue::kBGradB;
  if (reads_bias) bias = rnd({c.n}, g, bias_dt);
  if (writes_bias) bias = nan_like({ep == GemmEpilogue::kBGradB ? c.m : c.n}, bias_dt);
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
  if (ep == GemmEpilogue::kBGradB) EXPECT_LT(rel_l2(bias, op_a.sum(1)), tol) << what << "bias gradient (BGRADB)";
  return true;
}

TEST(GemmGpu, EveryEpilogueMatchesFloat64OnPoisonedOutputs) {
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
      const bool ok = run_epilogue(c, ep, dt, d_dt, bias_dt, g, &log);
      return ok;
    };
    EXPECT_TRUE(run(GemmEpilogue::kDefault, bf, bf, f32)) << "plain bf16 product refused: " << describe(c);
    EXPECT_TRUE(run(GemmEpilogue::kDefault, f32, f32, f32)) << "plain TF32 product refused: " << describe(c);
    run(GemmEpilogue::kDefault, bf, f32, f32);  // bf16 in, fp32 out (weight gradients)
    // Which bias dtypes each epilogue takes (fp32 is what the ops try first).
    bool bias_ok = false, gelu_ok = false, dgelu_ok = false, bgradb_ok = false;
    for (const auto bias_dt : {f32, bf}) {
      bias_ok |= run(GemmEpilogue::kBias, bf, bf, bias_dt);
      if (c.n % 8 == 0) {
        gelu_ok |= run(GemmEpilogue::kGeluAuxBias, bf, bf, bias_dt);
        dgelu_ok |= run(GemmEpilogue::kDGeluBGrad, bf, bf, bias_dt);
      }
    }
    if (c.n % 8 == 0) dgelu_ok |= run(GemmEpilogue::kDGelu, bf, bf, f32);
    bgradb_ok |= run(GemmEpilogue::kBGradB, bf, f32, f32);
    bgradb_ok |= run(GemmEpilogue::kBGradB, bf, bf, bf);
    run(GemmEpilogue::kBias, f32, f32, f32);
    if (c.n % 8 == 0) run(GemmEpilogue::kGeluAuxBias, f32, f32, f32);
    run(GemmEpilogue::kBGradB, f32, f32, f32);
    // BGRADB is optional: the ops take bias gradients with at::sum unless
    // PERFTRAIN_BGRAD_EPILOGUE=1 (see ops/cublaslt_workspace.h).
    (void)bgradb_ok;
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
TEST(GemmGpu, TunedProductsMatchFloat64AndAreRecorded) {
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
TEST(GemmGpu, DeferredTuningWaitsForTheNextCall) {
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
TEST(GemmGpu, CublasLtGeluIsTheTanhForm) {
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

// ---------------------------------------------------------------------------
// The ops against float64, forward and backward.

struct KN {
  int64_t k, n;
  bool dit;
};
const std::vector<KN> kLinearShapes = {{384, 1152, true}, {384, 1536, true}, {1536, 384, true},
                                       {1152, 4608, true}, {40, 24, false}};
const std::vector<int64_t> kRows = {1, 7, 8192, 65536};

std::string case_name(const char* op, at::ScalarType dt, int64_t m, int64_t k, int64_t n) {
  return std::string(op) + " " + c10::toString(dt) + " M=" + std::to_string(m) + " K=" + std::to_string(k) +
         " N=" + std::to_string(n);
}

// Runs `body` and checks the fallback count: 0 expected on the DiT shapes at
// training batch sizes; every case that fell back is printed.
template <class F>
void count_fallbacks(const std::string& name, bool must_be_fused, F body) {
  const int64_t before = gemm_fallback_count();
  body();
  const int64_t fell_back = gemm_fallback_count() - before;
  if (fell_back != 0) std::printf("[gemm] %s: %lld product(s) fell back to ATen\n", name.c_str(), (long long)fell_back);
  if (must_be_fused) EXPECT_EQ(fell_back, 0) << name << ": cuBLASLt refused a fused epilogue on a DiT shape";
}

void check_linear(at::ScalarType dt, int64_t m, int64_t k, int64_t n, bool dit, uint64_t seed) {
  at::Generator g = cuda_gen(seed);
  const std::string name = case_name("linear", dt, m, k, n);
  const at::Tensor x = rnd({m, k}, g, dt, 1.0, 0.3).requires_grad_(true);
  const at::Tensor w = master({n, k}, g, dt, 1.0 / std::sqrt(double(k))).requires_grad_(true);
  const at::Tensor b = rnd({n}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dy = rnd({m, n}, g, dt);
  std::vector<at::Tensor> got;
  count_fallbacks(name, dit && m >= 8192, [&] {
    const at::Tensor y = linear(x, w, b);
    const auto grads = torch::autograd::grad({y}, {x, w, b}, {dy});
    got = {y, grads[0], grads[1], grads[2]};
  });
  ASSERT_EQ(got[0].scalar_type(), dt) << name;
  ASSERT_EQ(got[1].scalar_type(), dt) << name << " dx";
  ASSERT_EQ(got[2].scalar_type(), at::kFloat) << name << " dW";
  ASSERT_EQ(got[3].scalar_type(), at::kFloat) << name << " db";
  const at::Tensor xd = x.detach().to(at::kDouble), wd = w.detach().to(at::kDouble), dyd = dy.to(at::kDouble);
  const std::vector<at::Tensor> want = {at::matmul(xd, wd.t()) + b.detach().to(at::kDouble), at::matmul(dyd, wd),
                                        at::matmul(dyd.t(), xd), dyd.sum(0)};
  const char* what[] = {"y", "dx", "dW", "db"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel_l2(got[i], want[i]), tolerance(dt)) << name << " " << what[i];
}

TEST(GemmGpu, LinearMatchesFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 100;
  for (const auto dt : {at::kBFloat16, at::kFloat})
    for (const KN& s : kLinearShapes)
      for (const int64_t m : kRows) check_linear(dt, m, s.k, s.n, s.dit, seed++);
  check_linear(at::kHalf, 8192, 384, 1536, true, seed++);
  check_linear(at::kHalf, 7, 40, 24, false, seed++);
}

// keep_activation: gelu_mlp's (nullopt: the default).
void check_gelu_mlp(at::ScalarType dt, int64_t m, int64_t c, int64_t h, bool dit, uint64_t seed,
                    std::optional<bool> keep_activation = std::nullopt) {
  at::Generator g = cuda_gen(seed);
  const std::string name = case_name("gelu_mlp", dt, m, c, h);
  const at::Tensor x = rnd({m, c}, g, dt, 1.0, 0.2).requires_grad_(true);
  const at::Tensor w1 = master({h, c}, g, dt, 1.5 / std::sqrt(double(c))).requires_grad_(true);
  const at::Tensor b1 = rnd({h}, g, at::kFloat, 0.5).requires_grad_(true);
  const at::Tensor w2 = master({c, h}, g, dt, 1.0 / std::sqrt(double(h))).requires_grad_(true);
  const at::Tensor b2 = rnd({c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dy = rnd({m, c}, g, dt);
  const std::vector<at::Tensor> params = {x, w1, b1, w2, b2};
  std::vector<at::Tensor> got;
  count_fallbacks(name, dit && m >= 8192, [&] {
    const at::Tensor y = gelu_mlp(x, w1, b1, w2, b2, keep_activation);
    got = torch::autograd::grad({y}, params, {dy});
    got.insert(got.begin(), y);
  });
  ASSERT_EQ(got[0].scalar_type(), dt) << name;
  std::vector<at::Tensor> ref;
  for (const auto& p : params) ref.push_back(p.detach().to(at::kDouble).requires_grad_(true));
  const at::Tensor yr = at::linear(at::gelu(at::linear(ref[0], ref[1], ref[2]), "tanh"), ref[3], ref[4]);
  std::vector<at::Tensor> want = torch::autograd::grad({yr}, ref, {dy.to(at::kDouble)});
  want.insert(want.begin(), yr.detach());
  const char* what[] = {"y", "dx", "dW1", "db1", "dW2", "db2"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel_l2(got[i], want[i]), tolerance(dt)) << name << " " << what[i];
}

TEST(GemmGpu, GeluMlpMatchesFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  struct CH {
    int64_t c, h;
    bool dit;
  };
  const std::vector<CH> shapes = {{384, 1536, true}, {1152, 4608, true}, {40, 24, false}};
  uint64_t seed = 500;
  // The DGELU epilogue first (the default picks the split form for the
  // smaller products), then the split form on the same shapes.
  set_gelu_mlp_dgelu_path(DGeluPath::kEpilogue);
  for (const auto dt : {at::kBFloat16, at::kFloat})
    for (const CH& s : shapes)
      for (const int64_t m : kRows) check_gelu_mlp(dt, m, s.c, s.h, s.dit, seed++);
  check_gelu_mlp(at::kHalf, 8192, 384, 1536, true, seed++);
  // Keeping only the pre-activation (GELU computed again by ATen for dW2,
  // where the forward's came from cuBLASLt's epilogue): same tolerance.
  for (const CH& s : shapes) check_gelu_mlp(at::kBFloat16, 8192, s.c, s.h, s.dit, seed++, false);
  check_gelu_mlp(at::kBFloat16, 77, 384, 1536, true, seed++, false);
  // pre's gradient from a plain product and GELU's backward in place
  // (PERFTRAIN_DGELU=split), by ATen's pass and by the fused one that also
  // gives db1 (these sizes would pick ATen's): same tolerance.
  set_gelu_mlp_dgelu_path(DGeluPath::kSplit);
  for (const GeluBackwardForm form : {GeluBackwardForm::kAten, GeluBackwardForm::kFused}) {
    set_gelu_mlp_gelu_backward_form(form);
    for (const CH& s : shapes) check_gelu_mlp(at::kBFloat16, 8192, s.c, s.h, s.dit, seed++);
    check_gelu_mlp(at::kBFloat16, 77, 384, 1536, true, seed++);
  }
  check_gelu_mlp(at::kFloat, 77, 40, 24, false, seed++);  // the fused pass in fp32, odd widths
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAuto);
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
}

// H = 20 is no multiple of 8: the fused GELU cannot run, the products fall
// back to ATen (counted), and the result is still right. The DGELU epilogue
// is forced: by default so small a product takes the split form, which
// never tries it.
TEST(GemmGpu, GeluMlpFallbackIsCountedAndRight) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  set_gelu_mlp_dgelu_path(DGeluPath::kEpilogue);
  const int64_t before = gemm_fallback_count();
  check_gelu_mlp(at::kBFloat16, 77, 40, 20, false, 900);
  EXPECT_GE(gemm_fallback_count() - before, 2) << "GELU_AUX_BIAS and DGELU should both have fallen back";
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
  const int64_t split_before = gemm_fallback_count();
  check_gelu_mlp(at::kBFloat16, 77, 40, 20, false, 901);
  EXPECT_GE(gemm_fallback_count() - split_before, 1) << "GELU_AUX_BIAS should have fallen back";
}

TEST(GemmGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(3);
  const at::Tensor x = rnd({4, 40}, g, at::kBFloat16);
  const at::Tensor w = at::randn({24, 40});
  EXPECT_THROW(linear(x, w, at::Tensor()), UsageError);
  EXPECT_THROW(linear(x, w.to(kCuda), at::randn({24})), UsageError);
  EXPECT_THROW(gelu_mlp(x, w.to(kCuda), at::randn({24}).to(kCuda), at::randn({40, 24}), at::randn({40}).to(kCuda)),
               UsageError);
}

// ---------------------------------------------------------------------------
// CUDA graphs: a qkv-like linear and the MLP, forward and backward, captured
// after one eager warm-up and replayed: no host sync, no data-dependent
// allocation, and the replay reproduces the eager values (the same plans and
// algorithms run), also after the static input changes.
TEST(GemmGpu, LinearAndGeluMlpCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(77);
  const at::ScalarType bf = at::kBFloat16;
  const int64_t b = 4, t = 256, c = 384;
  const at::Tensor x = rnd({b, t, c}, g, bf).requires_grad_(true);
  const at::Tensor wq = master({3 * c, c}, g, bf, 0.05).requires_grad_(true);
  const at::Tensor bq = rnd({3 * c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor w1 = master({4 * c, c}, g, bf, 0.07).requires_grad_(true);
  const at::Tensor b1 = rnd({4 * c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor w2 = master({c, 4 * c}, g, bf, 0.03).requires_grad_(true);
  const at::Tensor b2 = rnd({c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dq = rnd({b, t, 3 * c}, g, bf), dm = rnd({b, t, c}, g, bf);
  const at::Tensor x_next = rnd({b, t, c}, g, bf);
  auto step = [&] {
    const at::Tensor q = linear(x, wq, bq);
    const at::Tensor y = gelu_mlp(x, w1, b1, w2, b2);
    std::vector<at::Tensor> out = torch::autograd::grad({q, y}, {x, wq, bq, w1, b1, w2, b2}, {dq, dm});
    out.push_back(q.detach());
    out.push_back(y.detach());
    return out;
  };
  compat::synchronize(kCuda);  // the inputs were made on the default stream
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
  const int64_t fallbacks = gemm_fallback_count();
  const auto eager = step();  // warm-up: plans, workspace, handles
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  const auto captured = step();
  graph.capture_end();
  auto expect_same = [&](const std::vector<at::Tensor>& want, const std::string& when) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (at::equal(captured[i], want[i])) continue;
      ADD_FAILURE() << when << ": output " << i << " differs from eager, relative L2 "
                    << rel_l2(captured[i], want[i]);
    }
  };
  for (int i = 0; i < 2; ++i) {
    graph.replay();
    at::cuda::getCurrentCUDAStream().synchronize();
    expect_same(eager, "replay " + std::to_string(i));
  }
  x.detach().copy_(x_next);  // the graph reads x's memory
  const auto eager_next = step();
  graph.replay();
  at::cuda::getCurrentCUDAStream().synchronize();
  expect_same(eager_next, "replay on new input");
  EXPECT_EQ(gemm_fallback_count(), fallbacks) << "the DiT-shaped capture should run fully fused";
}

}  // namespace
}  // namespace perftrain::ops
