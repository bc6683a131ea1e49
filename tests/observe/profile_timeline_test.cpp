// The timeline read from a profiler trace: the step breakdown adds up, each
// GPU moment counts once, kernels land in the phase of the scope that
// launched them, host syncs and memory peaks are found where they happen,
// and the op table aggregates like torch's key_averages(). Synthetic
// timelines with random lengths, checked against sums computed here.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "base/error.h"
#include "observe/profile/timeline.h"
#include "support/test_support.h"
#include "support/timeline_builder.h"

namespace {

using namespace perftrain::observe::profile;

using perftrain::testing::kAutograd;
using perftrain::testing::kMain;
using perftrain::testing::kStream;
using perftrain::testing::kStream2;
using Builder = perftrain::testing::TimelineBuilder;

double sum_parts(const StepAnalysis& a) { return a.gpu_busy_ms + a.idle_data_ms + a.idle_other_ms; }

double phase(const StepAnalysis& a, const std::string& p) {
  for (const auto& x : a.busy_by_phase)
    if (x.phase == p) return x.ms;
  return 0;
}

// Two steps: data wait, forward (2 blocks), backward on the autograd thread,
// optimizer; random kernel lengths and gaps.
TEST(ProfileTimeline, BreakdownAddsUpAndAttributesKernelsToPhases) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> len(5, 80), gap(1, 30);
  Builder b;
  double fwd = 0, bwd = 0, opt = 0, data_idle = 0;
  std::vector<double> lengths;
  double t = 1000, gpu = 1000;
  for (int s = 0; s < 2; ++s) {
    const double step_start = t;
    // data wait: the GPU has nothing to do meanwhile
    const double wait = 200 + 50 * s;
    b.scope("perftrain::data_wait", t, wait);
    data_idle += std::max(0.0, (t + wait) - std::max(gpu, t));
    t += wait;
    gpu = std::max(gpu, t);
    const double fstart = t;
    for (int blk = 0; blk < 2; ++blk) {
      const double bstart = t;
      for (int k = 0; k < 3; ++k) {
        const double d = len(rng);
        gpu = std::max(gpu, t + 3) + gap(rng);
        b.launch("elementwise_kernel_" + std::to_string(k), t, gpu, d);
        lengths.push_back(d);
        fwd += d;
        gpu += d;
        t += 10;
      }
      b.scope("perftrain::block " + std::to_string(blk), bstart, t - bstart);
    }
    b.scope("perftrain::forward", fstart, t - fstart);
    const double bw_start = t;
    for (int k = 0; k < 4; ++k) {  // launched from the autograd thread
      const double d = len(rng);
      gpu = std::max(gpu, t + 3) + gap(rng);
      b.launch("sm90_xmma_gemm_bf16", t + 1, gpu, d, kAutograd);
      lengths.push_back(d);
      bwd += d;
      gpu += d;
      t += 10;
    }
    b.scope("perftrain::backward", bw_start, t - bw_start + 5);
    t += 5;
    const double d = len(rng);
    gpu = std::max(gpu, t + 3) + gap(rng);
    b.scope("perftrain::optimizer", t, 12);
    b.launch("multi_tensor_adamw_update_kernel", t + 1, gpu, d);
    lengths.push_back(d);
    opt += d;
    gpu += d;
    t += 12;
    b.scope("ProfilerStep#" + std::to_string(s), step_start, t - step_start);
  }
  const StepAnalysis a = analyze(b.t);
  ASSERT_EQ(a.steps, 2);
  EXPECT_NEAR(a.window_ms, (std::max(gpu, t) - 1000) / 1e3, 1e-9);
  EXPECT_NEAR(sum_parts(a), a.step_ms, 1e-9);
  EXPECT_NEAR(phase(a, "forward"), fwd / 2 / 1e3, 1e-9);
  EXPECT_NEAR(phase(a, "backward"), bwd / 2 / 1e3, 1e-9);
  EXPECT_NEAR(phase(a, "optimizer"), opt / 2 / 1e3, 1e-9);
  EXPECT_NEAR(a.idle_data_ms, data_idle / 2 / 1e3, 1e-9);
  EXPECT_GT(a.idle_data_ms, 0.05);  // and the gaps between kernels queued before a wait are not data idle
  EXPECT_NEAR(a.data_wait_ms, (200 + 250) / 2.0 / 1e3, 1e-9);
  EXPECT_DOUBLE_EQ(a.kernels_per_step, lengths.size() / 2.0);
  std::sort(lengths.begin(), lengths.end());
  const size_t n = lengths.size();
  EXPECT_NEAR(a.median_kernel_us, n % 2 ? lengths[n / 2] : 0.5 * (lengths[n / 2 - 1] + lengths[n / 2]), 1e-9);
  EXPECT_NEAR(a.launch_cpu_ms, 2.0 * n / 2 / 1e3, 1e-9);  // each launch call lasts 2 us
  EXPECT_NEAR(a.matrix_ms, bwd / 2 / 1e3, 1e-9);
  EXPECT_FALSE(a.captured);
}

TEST(ProfileTimeline, OverlappingKernelsCountOnce) {
  Builder b;
  b.scope("ProfilerStep#0", 0, 50);
  b.scope("perftrain::backward", 0, 50);
  b.launch("gemm_a", 1, 100, 100, kMain, kStream);   // [100, 200]
  b.launch("gemm_b", 2, 150, 100, kMain, kStream2);  // [150, 250] overlaps 50
  b.launch("gemm_c", 3, 300, 20, kMain, kStream);    // gap 50 before it
  const StepAnalysis a = analyze(b.t);
  EXPECT_NEAR(a.gpu_busy_ms, (150 + 20) / 1e3, 1e-12);
  EXPECT_NEAR(a.window_ms, 320 / 1e3, 1e-12);
  EXPECT_NEAR(a.idle_other_ms, (100 + 50) / 1e3, 1e-12);  // before the first kernel, and the gap
  EXPECT_NEAR(sum_parts(a), a.step_ms, 1e-12);
}

TEST(ProfileTimeline, AGraphLaunchIsOneCapturedStep) {
  Builder b;
  for (int s = 0; s < 3; ++s) {
    const double t0 = s * 1000.0;
    b.scope("ProfilerStep#" + std::to_string(s), t0, 20);
    b.scope("perftrain::graph_replay", t0 + 2, 10);
    // the graph's kernels share the launch's correlation id
    const int64_t c = b.next_corr++;
    b.add(EventKind::kRuntime, "cudaGraphLaunch", t0 + 3, 5, kMain).correlation = c;
    for (int k = 0; k < 4; ++k) b.add(EventKind::kKernel, "kernel", t0 + 10 + 200 * k, 150, kStream).correlation = c;
  }
  const StepAnalysis a = analyze(b.t);
  EXPECT_TRUE(a.captured);
  EXPECT_EQ(a.graph_launches, 3);
  ASSERT_EQ(a.busy_by_phase.size(), 1u);
  EXPECT_EQ(a.busy_by_phase[0].phase, "captured step (one graph launch)");
  EXPECT_NEAR(a.busy_by_phase[0].ms, 0.6, 1e-12);
}

TEST(ProfileTimeline, FindsHostSyncsInsideStepsWithTheirOp) {
  Builder b;
  b.scope("ProfilerStep#0", 0, 100);
  b.scope("perftrain::loss", 10, 50);
  b.add(EventKind::kCpuOp, "aten::item", 20, 30, kMain);
  b.add(EventKind::kCpuOp, "aten::_local_scalar_dense", 21, 28, kMain);
  b.add(EventKind::kRuntime, "cudaMemcpyAsync", 22, 3, kMain);
  b.add(EventKind::kRuntime, "cudaStreamSynchronize", 26, 20, kMain);
  b.add(EventKind::kRuntime, "cudaDeviceSynchronize", 200, 5, kMain);  // after the step: not a finding
  const StepAnalysis a = analyze(b.t);
  ASSERT_EQ(a.syncs.size(), 1u);
  EXPECT_EQ(a.syncs[0].call, "cudaStreamSynchronize");
  EXPECT_EQ(a.syncs[0].op, "aten::_local_scalar_dense");
  EXPECT_EQ(a.syncs[0].phase, "loss");
  EXPECT_DOUBLE_EQ(a.syncs_per_step, 1.0);
}

TEST(ProfileTimeline, PeakMemoryPerPhaseAndAllocatorCalls) {
  Builder b;
  b.scope("ProfilerStep#0", 0, 100);
  b.scope("perftrain::forward", 0, 40);
  b.scope("perftrain::backward", 40, 60);
  const double gib = 1ull << 30;
  auto mem = [&](double ts, double alloc, double reserved) {
    Event& e = b.add(EventKind::kMemory, "[memory]", ts, 0, kMain);
    e.total_allocated = alloc * gib, e.total_reserved = reserved * gib;
  };
  mem(5, 1.0, 2.0), mem(30, 3.5, 4.0), mem(50, 2.0, 6.0), mem(90, 5.25, 6.0);
  b.add(EventKind::kRuntime, "cudaMalloc", 45, 100, kMain);
  b.add(EventKind::kRuntime, "cudaFree", 60, 10, kMain);
  const StepAnalysis a = analyze(b.t);
  ASSERT_EQ(a.memory.size(), 2u);
  EXPECT_EQ(a.memory[0].phase, "forward");
  EXPECT_DOUBLE_EQ(a.memory[0].peak_allocated_gib, 3.5);
  EXPECT_DOUBLE_EQ(a.memory[0].peak_reserved_gib, 4.0);
  EXPECT_EQ(a.memory[1].phase, "backward");
  EXPECT_DOUBLE_EQ(a.memory[1].peak_allocated_gib, 5.25);
  EXPECT_EQ(a.device_mallocs, 1);
  EXPECT_EQ(a.device_frees, 1);
}

// An op that launches one kernel itself and calls a child that launches two:
// self and total CUDA / CPU times, calls per step, sorted by total CUDA time.
TEST(ProfileTimeline, OpTableAggregatesLikeKeyAverages) {
  Builder b;
  double linear_self_cuda = 0, addmm_cuda = 0, linear_cpu = 0, addmm_cpu = 0;
  for (int s = 0; s < 2; ++s) {
    const double t0 = 1000.0 * s;
    b.scope("ProfilerStep#" + std::to_string(s), t0, 500);
    b.scope("perftrain::forward", t0, 400);
    for (int call = 0; call < 3; ++call) {  // three linears per step
      const double c0 = t0 + 10 + 100 * call;
      b.add(EventKind::kCpuOp, "aten::linear", c0, 80, kMain);
      b.add(EventKind::kCpuOp, "aten::addmm", c0 + 10, 50, kMain);
      b.launch("gemm_kernel", c0 + 12, c0 + 20, 30 + call);
      b.launch("gemm_splitk_reduce", c0 + 30, c0 + 60, 5);
      b.launch("cast_kernel", c0 + 65, c0 + 70, 4);  // by linear itself, after addmm returned
      linear_self_cuda += 4, addmm_cuda += 35 + call, linear_cpu += 80, addmm_cpu += 50;
    }
  }
  const auto ops = op_table(b.t, GroupBy::kOp);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].name, "aten::linear");  // larger total CUDA time first
  EXPECT_NEAR(ops[0].total_cuda_ms, (linear_self_cuda + addmm_cuda) / 2 / 1e3, 1e-12);
  EXPECT_NEAR(ops[0].self_cuda_ms, linear_self_cuda / 2 / 1e3, 1e-12);
  EXPECT_NEAR(ops[0].total_cpu_ms, linear_cpu / 2 / 1e3, 1e-12);
  EXPECT_NEAR(ops[0].self_cpu_ms, (linear_cpu - addmm_cpu) / 2 / 1e3, 1e-12);
  EXPECT_DOUBLE_EQ(ops[0].calls, 3);
  EXPECT_EQ(ops[1].name, "aten::addmm");
  EXPECT_NEAR(ops[1].self_cuda_ms, addmm_cuda / 2 / 1e3, 1e-12);
  EXPECT_NEAR(ops[1].total_cuda_ms, ops[1].self_cuda_ms, 1e-12);
  const double step_ms = analyze(b.t).step_ms;
  EXPECT_NEAR(ops[0].share, ops[0].total_cuda_ms / step_ms, 1e-12);

  const auto kernels = op_table(b.t, GroupBy::kKernel, 2);
  ASSERT_EQ(kernels.size(), 2u);  // top 2 of 3
  EXPECT_EQ(kernels[0].name, "gemm_kernel");
  EXPECT_NEAR(kernels[0].total_cuda_ms, 2 * (30 + 31 + 32) / 2.0 / 1e3, 1e-12);
  EXPECT_DOUBLE_EQ(kernels[0].calls, 3);
  EXPECT_EQ(kernels[1].name, "gemm_splitk_reduce");

  const auto scopes = op_table(b.t, GroupBy::kScope);
  ASSERT_EQ(scopes.size(), 1u);
  EXPECT_EQ(scopes[0].name, "perftrain::forward");
  EXPECT_NEAR(scopes[0].total_cuda_ms, (linear_self_cuda + addmm_cuda) / 2 / 1e3, 1e-12);
}

const char* kTrace = R"JSON({
  "schemaVersion": 1,
  "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 11, "ts": 100.5, "dur": 400},
    {"ph": "X", "cat": "user_annotation", "name": "perftrain::forward", "pid": 1, "tid": 11, "ts": 101, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 11, "ts": 102, "dur": 20,
     "args": {"Input type": ["float", "float"], "External id": 4}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 11, "ts": 103, "dur": 4,
     "args": {"correlation": 77}},
    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": "stream 7", "ts": 120, "dur": 50,
     "args": {"correlation": 77, "stream": 7}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 300,
     "dur": 10, "args": {"correlation": 78, "bytes": 1048576}},
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 11, "ts": 150, "s": "t",
     "args": {"Total Allocated": 1073741824, "Total Reserved": 2147483648, "Bytes": 512}},
    {"ph": "f", "cat": "ac2g", "name": "flow", "id": 77, "pid": 0, "tid": 7, "ts": 120},
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}
  ]
})JSON";

TEST(ProfileTimeline, ParsesAKinetoTraceAndItsGzip) {
  const Timeline t = parse_trace(kTrace);
  ASSERT_EQ(t.events.size(), 7u);  // flows and metadata dropped
  const StepAnalysis a = analyze(t);
  EXPECT_EQ(a.steps, 1);
  EXPECT_NEAR(a.window_ms, 0.4, 1e-12);
  EXPECT_NEAR(phase(a, "forward"), 0.05, 1e-12);
  EXPECT_NEAR(a.fp32_matrix_ms, 0.05, 1e-12);
  EXPECT_EQ(a.fp32_matrix_ops, 1);
  EXPECT_DOUBLE_EQ(a.h2d_bytes, 1048576);
  ASSERT_EQ(a.memory.size(), 1u);
  EXPECT_DOUBLE_EQ(a.memory[0].peak_reserved_gib, 2.0);

  perftrain::testing::TempDir tmp;
  const std::string gz = tmp.file("t.json.gz");
  gzFile f = gzopen(gz.c_str(), "wb");
  gzwrite(f, kTrace, static_cast<unsigned>(std::string(kTrace).size()));
  gzclose(f);
  EXPECT_EQ(load_trace(gz).events.size(), 7u);

  EXPECT_THROW(parse_trace("{\"nothing\": 1}"), perftrain::RuntimeError);
  EXPECT_THROW(parse_trace("{not json"), perftrain::RuntimeError);
  EXPECT_THROW(load_trace(tmp.file("missing.json")), perftrain::RuntimeError);
}

TEST(ProfileTimeline, ScopeNamesMapToPhases) {
  EXPECT_EQ(phase_of_scope("perftrain::block 27"), "forward");
  EXPECT_EQ(phase_of_scope("perftrain::loop 5"), "forward");  // a looped model's loops
  EXPECT_EQ(phase_of_scope("perftrain::data_wait"), "data wait");
  EXPECT_EQ(phase_of_scope("perftrain::ema"), "EMA");
  EXPECT_EQ(phase_of_scope("aten::mm"), "");
  EXPECT_EQ(phase_of_scope("perftrain::unknown"), "");
  EXPECT_EQ(parse_group_by("scope"), GroupBy::kScope);
  EXPECT_THROW(parse_group_by("kernels"), perftrain::UsageError);
}

}  // namespace
