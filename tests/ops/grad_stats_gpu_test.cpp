// The fused gradient statistics and histogram kernel (ops::grad_stats_into on
// CUDA, kernels/grad_stats.cu) against the reference (the former monitor's
// ATen code, grad_stat_rows_reference and grad_histogram_rows_reference) on
// the same gradients: counts, min and max exactly, norms and sums to fp32
// tolerance. Values on every bucket edge and its float neighbours, zeros,
// subnormals, NaN/Inf, huge and tiny magnitudes, empty, undefined, odd-sized,
// multi-chunk and strided gradients, fp32/bf16/fp16, misaligned pointers,
// more gradients than one table holds, a loss scale on the device, poisoned
// outputs, bit-identical reruns, and capture in a CUDA graph. Each check
// prints its largest error. Skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "ops/grad_stats.h"
#include "grad_stats_inputs.h"
#include "support/graph_checks.h"

namespace perftrain::ops {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const at::Device kCuda(at::kCUDA, 0);
constexpr int64_t kWidth = kGradHistLead + 115;

using grad_stats_inputs::edge_and_special_values;
using grad_stats_inputs::monitor_edges;

// Random values over 18 decades of both signs with `specials` planted, on the GPU.
at::Tensor planted(at::IntArrayRef shape, const std::vector<float>& specials, at::ScalarType dtype) {
  return grad_stats_inputs::planted(shape, specials, dtype).to(kCuda);
}

// A CUDA copy of t starting `offset` elements into a larger buffer (a pointer
// off the 16-byte boundary for offset % (16 / element size) != 0).
at::Tensor shifted(const at::Tensor& t, int64_t offset) {
  at::Tensor buf = at::zeros({t.numel() + offset}, t.options().device(kCuda));
  at::Tensor view = buf.narrow(0, offset, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

struct Errors {
  double norm = 0, sums = 0;
  int64_t count_mismatches = 0, exact_mismatches = 0;
};

bool same_exact(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Kernel rows against the reference rows for the same gradients; the
// reference runs on the gradients as float32 (the kernel's math), so its
// norms are fp32 whatever the storage type.
Errors compare(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
               const at::Tensor& edges, const at::Tensor& scale, const std::string& what) {
  std::vector<at::Tensor> f32;
  for (const auto& g : grads) f32.push_back(g.defined() ? g.to(at::kFloat) : g);
  at::Tensor want_stats = grad_stat_rows_reference(f32);
  at::Tensor want_hist = grad_histogram_rows_reference(f32, scale.defined() ? edges * scale : edges);
  if (scale.defined()) {
    want_stats.narrow(1, 0, 3).div_(scale);
    want_hist.narrow(1, 0, kGradHistLead).div_(scale);
  }
  const at::Tensor ws = want_stats.cpu().to(at::kDouble), wh = want_hist.cpu().to(at::kDouble);
  const at::Tensor gs = stats.narrow(1, 0, kGradStatColumns).cpu().to(at::kDouble).contiguous();
  const at::Tensor gh = hist.cpu().to(at::kDouble).contiguous();
  Errors e;
  for (int64_t i = 0; i < ws.size(0); ++i) {
    const std::string who = what + " gradient " + std::to_string(i);
    for (int64_t k = 0; k < 3; ++k) {  // norm, sum |g|, max |g|
      const double a = gs[i][k].item<double>(), b = ws[i][k].item<double>();
      if (k == 2 ? !same_exact(a, b) : !(same_exact(a, b) || std::fabs(a - b) <= 2e-5 * std::fabs(b))) {
        ADD_FAILURE() << who << " column " << k << ": kernel " << a << " reference " << b;
      }
      if (std::isfinite(b) && b != 0) e.norm = std::max(e.norm, std::fabs(a - b) / std::fabs(b));
    }
    for (int64_t k = 3; k < 5; ++k)
      if (gs[i][k].item<double>() != ws[i][k].item<double>()) {
        ++e.exact_mismatches;
        ADD_FAILURE() << who << " count column " << k << ": kernel " << gs[i][k].item<double>() << " reference "
                      << ws[i][k].item<double>();
      }
    for (int64_t k = 0; k < 2; ++k)  // min, max: exact (NaN propagated)
      if (!same_exact(gh[i][k].item<double>(), wh[i][k].item<double>())) {
        ++e.exact_mismatches;
        ADD_FAILURE() << who << (k ? " max" : " min") << ": kernel " << gh[i][k].item<double>() << " reference "
                      << wh[i][k].item<double>();
      }
    {  // sum: the error scales with sum |g| (in double: inf/NaN with such an element)
      const at::Tensor& g = f32[static_cast<size_t>(i)];
      double mag = g.defined() && g.numel() > 0 ? g.to(at::kDouble).abs().sum().item<double>() : 0.0;
      if (scale.defined()) mag /= scale.item<double>();
      const double a = gh[i][2].item<double>(), b = wh[i][2].item<double>();
      if (!(same_exact(a, b) || (std::isfinite(mag) && std::fabs(a - b) <= 2e-5 * mag)))
        ADD_FAILURE() << who << " sum: kernel " << a << " reference " << b << " (sum |g| " << mag << ")";
      if (std::isfinite(mag) && mag > 0 && std::isfinite(b)) e.sums = std::max(e.sums, std::fabs(a - b) / mag);
    }
    for (int64_t k = kGradHistLead; k < kWidth; ++k)
      if (gh[i][k].item<double>() != wh[i][k].item<double>()) {
        if (++e.count_mismatches <= 10)
          ADD_FAILURE() << who << " bucket " << k - kGradHistLead << ": kernel " << gh[i][k].item<double>()
                        << " reference " << wh[i][k].item<double>();
      }
  }
  std::printf("[grad_stats] %-34s %3lld gradients: norm/sum|g| rel %.2e, sum rel(sum|g|) %.2e, bucket mismatches %lld, "
              "exact-column mismatches %lld\n",
              what.c_str(), static_cast<long long>(ws.size(0)), e.norm, e.sums,
              static_cast<long long>(e.count_mismatches), static_cast<long long>(e.exact_mismatches));
  return e;
}

std::vector<at::Tensor> mixed_grads(const at::Tensor& edges, float scale, at::ScalarType dtype) {
  const auto sv = edge_and_special_values(edges, scale);
  std::vector<at::Tensor> g;
  g.push_back(at::tensor(sv, at::kFloat).to(dtype).to(kCuda));  // every edge and its neighbours
  g.push_back(shifted(at::tensor(sv, at::kFloat).to(dtype), 1));  // the same, misaligned
  g.push_back(planted({37, 29}, sv, dtype));
  g.push_back(at::Tensor());
  g.push_back(at::empty({0, 4}, at::TensorOptions().dtype(dtype).device(kCuda)));
  g.push_back(planted({1}, {}, dtype));
  g.push_back(planted({7}, {}, dtype));
  g.push_back(at::zeros({5, 3}, at::TensorOptions().dtype(dtype).device(kCuda)));
  g.push_back(planted({65535}, sv, dtype));
  g.push_back(planted({65536}, sv, dtype));
  g.push_back(shifted(planted({65537}, sv, dtype), 3));
  g.push_back(planted({3, 65536 + 17}, sv, dtype));  // four chunks
  g.push_back(planted({33, 65}, {}, dtype) * 1e-30);  // tiny magnitudes (subnormal in fp32)
  at::Tensor nan_inf = planted({100000}, {}, dtype);
  nan_inf[70000] = kNaN;  // only in the second chunk
  nan_inf[20] = kInf;
  g.push_back(nan_inf);
  at::Tensor neg_inf = planted({999}, {}, dtype);
  neg_inf[998] = -kInf;
  g.push_back(neg_inf);
  g.push_back(planted({123, 77}, sv, dtype).t());  // strided: the op makes it contiguous
  return g;
}

TEST(GradStatsGpu, KernelMatchesTheReference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(41);
  const at::Tensor edges = monitor_edges().to(kCuda);
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const float scale : {1.f, 1024.f}) {
      const auto grads = mixed_grads(edges, scale, dtype);
      const auto n = static_cast<int64_t>(grads.size());
      const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
      // Poisoned: every column the kernel writes must be overwritten.
      const at::Tensor stats = at::full({n, 7}, kNaN, opts), hist = at::full({n, kWidth}, kNaN, opts);
      const at::Tensor s = scale == 1.f ? at::Tensor() : at::full({}, scale, opts);
      grad_stats_into(grads, stats, hist, edges, s);
      const Errors e = compare(grads, stats, hist, edges, s,
                               std::string(c10::toString(dtype)) + (s.defined() ? " scale 1024" : ""));
      EXPECT_EQ(e.count_mismatches, 0);
      EXPECT_TRUE(at::isnan(stats.narrow(1, kGradStatColumns, 2)).all().item<bool>()) << "columns 5-6 left alone";
      // The poison is gone from gradients without a NaN (rows 0-2 have the
      // edges' finite values; row 3 is undefined: zeros).
      EXPECT_FALSE(at::isnan(hist[3]).any().item<bool>());
      EXPECT_FALSE(at::isnan(stats[3].narrow(0, 0, 5)).any().item<bool>());
      if (dtype == at::kFloat)  // every bucket holds an edge's values
        EXPECT_EQ(hist[0].narrow(0, kGradHistLead, 115).gt(0).sum().item<int64_t>(), 115);
    }
  }
}

TEST(GradStatsGpu, HistogramsOffWritesOnlyTheStatistics) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(42);
  const at::Tensor edges = monitor_edges().to(kCuda);
  const auto grads = mixed_grads(edges, 1.f, at::kFloat);
  const auto n = static_cast<int64_t>(grads.size());
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  const at::Tensor stats = at::full({n, 7}, kNaN, opts), hist = at::full({n, kWidth}, kNaN, opts);
  grad_stats_into(grads, stats, {}, {});
  at::Tensor with_hist = at::full({n, 7}, kNaN, opts);
  grad_stats_into(grads, with_hist, hist, edges);
  EXPECT_TRUE(at::equal(at::nan_to_num(stats, 7.0), at::nan_to_num(with_hist, 7.0)))
      << "the statistics do not depend on whether histograms are taken";
}

// More gradients than one table (512) holds: the second table's rows too.
TEST(GradStatsGpu, ManyGradientsSpanSeveralTables) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(43);
  const at::Tensor edges = monitor_edges().to(kCuda);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 1100; ++i) grads.push_back(planted({1 + (i * 37) % 300}, {}, at::kFloat));
  grads[600] = planted({70000}, {}, at::kFloat);
  grads[1099] = at::Tensor();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  const at::Tensor stats = at::full({1100, 7}, kNaN, opts), hist = at::full({1100, kWidth}, kNaN, opts);
  grad_stats_into(grads, stats, hist, edges);
  const Errors e = compare(grads, stats, hist, edges, {}, "1100 gradients");
  EXPECT_EQ(e.count_mismatches, 0);
}

// Deterministic: the same inputs give the same bits (fixed reduction orders).
TEST(GradStatsGpu, RerunsAreBitIdentical) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(44);
  const at::Tensor edges = monitor_edges().to(kCuda);
  const std::vector<at::Tensor> grads = {planted({1152, 4608}, {}, at::kFloat), planted({4608}, {}, at::kFloat),
                                         planted({6912, 1152}, {}, at::kFloat)};
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  std::vector<at::Tensor> runs;
  for (int r = 0; r < 3; ++r) {
    at::Tensor stats = at::zeros({3, 7}, opts), hist = at::zeros({3, kWidth}, opts);
    grad_stats_into(grads, stats, hist, edges);
    runs.push_back(at::cat({stats, hist}, 1));
  }
  EXPECT_TRUE(at::equal(runs[0], runs[1]));
  EXPECT_TRUE(at::equal(runs[0], runs[2]));
  const Errors e = compare(grads, runs[0].narrow(1, 0, 7), runs[0].narrow(1, 7, kWidth), edges, {},
                           "DiT-XL/2-sized fp32");
  EXPECT_EQ(e.count_mismatches, 0);
}

// Inside a captured CUDA graph (as the monitored step runs it): no host sync,
// no data-dependent allocation; each replay equals the eager call, also after
// the gradients and the scale take new values.
TEST(GradStatsGpu, CapturesInACudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(45);
  const at::Tensor edges = monitor_edges().to(kCuda);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  std::vector<at::Tensor> grads = {planted({300, 257}, {}, at::kFloat), planted({77}, {}, at::kBFloat16),
                                   at::Tensor(), planted({131073}, {}, at::kFloat)};
  const at::Tensor scale = at::full({}, 512.f, opts);
  const at::Tensor stats = at::full({4, 7}, kNaN, opts), hist = at::full({4, kWidth}, kNaN, opts);
  // Only the op's columns: the two beyond kGradStatColumns keep their NaN
  // poison, which at::equal never finds equal to itself.
  auto step = [&] {
    grad_stats_into(grads, stats, hist, edges, scale);
    return std::vector<at::Tensor>{stats.narrow(1, 0, kGradStatColumns).clone(), hist.clone()};
  };
  perftrain::testing::expect_graph_replays_match_eager(step, "grad_stats ");
  EXPECT_TRUE(at::isnan(stats.narrow(1, kGradStatColumns, 2)).all().item<bool>()) << "columns past the op's were written";
  // New values in the same memory: the graph reads them.
  compat::synchronize(kCuda);
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
  at::cuda::CUDAGraph graph;
  step();  // warm-up on this stream
  graph.capture_begin();
  step();
  graph.capture_end();
  grads[0].copy_(planted({300, 257}, {}, at::kFloat) * 3);
  grads[3][5] = kNaN;
  scale.fill_(2048.f);
  graph.replay();
  at::cuda::getCurrentCUDAStream().synchronize();
  const at::Tensor replayed_stats = stats.clone(), replayed_hist = hist.clone();
  step();
  at::cuda::getCurrentCUDAStream().synchronize();
  EXPECT_TRUE(at::equal(at::nan_to_num(replayed_stats, 7.0), at::nan_to_num(stats, 7.0)));
  EXPECT_TRUE(at::equal(at::nan_to_num(replayed_hist, 7.0), at::nan_to_num(hist, 7.0)));
  const Errors e = compare(grads, stats, hist, edges, scale, "after capture, new values");
  EXPECT_EQ(e.count_mismatches, 0);
}

// A gradient dtype the kernel does not take (float64) goes the reference way.
TEST(GradStatsGpu, OtherDtypesUseTheReference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(46);
  const at::Tensor edges = monitor_edges().to(kCuda);
  const std::vector<at::Tensor> grads = {planted({40}, {}, at::kDouble), planted({9}, {}, at::kDouble)};
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  const at::Tensor stats = at::zeros({2, 5}, opts), hist = at::zeros({2, kWidth}, opts);
  grad_stats_into(grads, stats, hist, edges);
  EXPECT_TRUE(at::equal(stats, grad_stat_rows_reference(grads)));
  EXPECT_TRUE(at::equal(hist, grad_histogram_rows_reference(grads, edges)));
}

// A readout, not a bar: the fused pass against the reference's per-parameter
// ATen kernels over DiT-XL/2-like gradient sizes (bench/kernels has the full
// parameter list).
TEST(GradStatsGpu, TimeAgainstTheReference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::manual_seed(47);
  const at::Tensor edges = monitor_edges().to(kCuda);
  std::vector<at::Tensor> grads;
  for (int b = 0; b < 4; ++b)
    for (const auto& shape : std::vector<std::vector<int64_t>>{{3456, 1152}, {3456}, {1152, 1152}, {1152},
                                                              {4608, 1152}, {4608}, {1152, 4608}, {1152},
                                                              {6912, 1152}, {6912}})
      grads.push_back(planted(shape, {}, at::kFloat));
  const auto n = static_cast<int64_t>(grads.size());
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  const at::Tensor stats = at::zeros({n, 7}, opts), hist = at::zeros({n, kWidth}, opts);
  auto time_ms = [](const std::function<void()>& fn) {
    fn();
    at::cuda::getCurrentCUDAStream().synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) fn();
    at::cuda::getCurrentCUDAStream().synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  };
  const double fused = time_ms([&] { grad_stats_into(grads, stats, hist, edges); });
  const double reference = time_ms([&] {
    grad_stat_rows_reference(grads);
    grad_histogram_rows_reference(grads, edges);
  });
  int64_t elems = 0;
  for (const auto& g : grads) elems += g.numel();
  std::printf("[grad_stats] 4 DiT-XL/2 blocks (%lld gradients, %.1fM elements): fused %.3f ms, reference %.3f ms\n",
              static_cast<long long>(n), elems / 1e6, fused, reference);
}

}  // namespace
}  // namespace perftrain::ops
