// The breakdown against the step measured outside the trace: the trace's
// parts plus an "unattributed" row are the profiled step exactly, the 5%
// check says which side of it the trace lies, the overhead line compares the
// profiled step with the unprofiled one per kernel, and the rules that read GPU
// idle time take the profiler's cost out of it. Synthetic timelines with
// random kernel lengths and gaps, fake timings; then the step-window
// profiler's own timings on the CPU, against steps of known length.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "base/error.h"
#include "observe/profile/diagnosis.h"
#include "observe/profile/step_profiler.h"
#include "observe/profile/timeline.h"
#include "support/findings.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::profile;

using perftrain::testing::contains;

using perftrain::testing::find_finding;

// `steps` steps of `kernels` kernels each, launched from a forward scope,
// each kernel `len` us long (random) after a gap of `gap` us (random) on the
// stream: the gaps are the trace's idle time between kernels.
struct Synthetic {
  Timeline t;
  double busy_us = 0, idle_us = 0, end_us = 0;
  int n_kernels = 0;
};

Synthetic synthetic(int steps, int kernels, double len_lo, double len_hi, double gap_lo, double gap_hi,
                    const std::string& kernel = "elementwise_kernel", unsigned seed = 11) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> len(len_lo, len_hi), gap(gap_lo, gap_hi);
  Synthetic s;
  int64_t corr = 1;
  double gpu = 1000;
  auto add = [&](EventKind k, const std::string& name, double ts, double dur, int64_t tid) -> Event& {
    Event e;
    e.kind = k, e.name = name, e.ts = ts, e.dur = dur, e.tid = tid;
    s.t.events.push_back(e);
    return s.t.events.back();
  };
  for (int st = 0; st < steps; ++st) {
    const double start = gpu;
    for (int k = 0; k < kernels; ++k) {
      const double g = gap(rng), d = len(rng);
      add(EventKind::kRuntime, "cudaLaunchKernel", gpu, 1, 1).correlation = corr;
      add(EventKind::kKernel, kernel, gpu + g, d, 7).correlation = corr;
      ++corr;
      s.idle_us += g;
      s.busy_us += d;
      gpu += g + d;
      ++s.n_kernels;
    }
    add(EventKind::kScope, "perftrain::forward", start, gpu - start, 1);
    add(EventKind::kScope, "ProfilerStep#" + std::to_string(st), start, gpu - start, 1);
  }
  s.end_us = gpu;
  return s;
}

double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return NAN;
  return std::strtod(text.c_str() + at + label.size(), nullptr);
}

TEST(ProfileAccounting, BreakdownPlusUnattributedIsTheProfiledStep) {
  const Synthetic s = synthetic(3, 40, 5, 60, 1, 20);
  const StepAnalysis a = analyze(s.t);
  ASSERT_EQ(a.steps, 3);
  EXPECT_NEAR(a.step_ms, (s.busy_us + s.idle_us) / 3 / 1e3, 1e-9);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> off(-0.2, 0.2);
  for (int i = 0; i < 20; ++i) {
    MeasuredStep m;
    m.profiled_ms = a.step_ms * (1 + off(rng));
    m.profiled_steps = 3;
    const StepAccounting c = account(a, m);
    ASSERT_TRUE(c.has_profiled);
    EXPECT_FALSE(c.has_unprofiled);
    EXPECT_NEAR(c.unattributed_ms, m.profiled_ms - a.step_ms, 1e-12);
    EXPECT_NEAR(a.gpu_busy_ms + a.idle_data_ms + a.idle_other_ms + c.unattributed_ms, m.profiled_ms, 1e-9);
    const double diff = (a.step_ms - m.profiled_ms) / m.profiled_ms;
    EXPECT_NEAR(c.difference, diff, 1e-12);
    EXPECT_EQ(c.within_5pct, std::abs(diff) <= 0.05) << diff;
  }
  // Either side of 5%, in the printed report: the sum row is the profiled step.
  for (const double f : {1.03, 0.97, 1.08, 0.9}) {
    MeasuredStep m;
    m.profiled_ms = a.step_ms * f;
    m.profiled_steps = 3;
    const std::string text = format_breakdown(a, m);
    EXPECT_TRUE(contains(text, "| unattributed: the measured profiled step less the trace's window |")) << text;
    EXPECT_NEAR(number_after(text, "| **sum** | **"), m.profiled_ms, 1e-3) << text;
    EXPECT_NEAR(number_after(text, "the trace's parts sum to "), a.step_ms, 1e-3) << text;
    const double pct = 100 * (a.step_ms - m.profiled_ms) / m.profiled_ms;
    EXPECT_NEAR(number_after(text, " ms ("), pct, 0.051) << text;
    const bool within = std::abs(f - 1) < 0.05 * f;  // |trace - profiled| <= 5% of profiled
    EXPECT_EQ(contains(text, "NOT within 5%"), !within) << text;
    EXPECT_EQ(contains(text, "), within 5%"), within) << text;
  }
  // Nothing measured: the breakdown is the trace's, and says what is unknown.
  const std::string bare = format_breakdown(a, {});
  EXPECT_FALSE(contains(bare, "unattributed")) << bare;
  EXPECT_NEAR(number_after(bare, "| **sum** | **"), a.step_ms, 1e-3) << bare;
  EXPECT_TRUE(contains(bare, "Profiler overhead: unknown")) << bare;
  EXPECT_TRUE(contains(bare, "includes the profiler's own cost")) << bare;
}

TEST(ProfileAccounting, OverheadPerKernelAndIdleWithoutIt) {
  // 500 kernels a step back to back but for 1-3 us gaps (CUPTI's records):
  // the unprofiled step is the kernels' time and a little idle.
  const Synthetic s = synthetic(2, 500, 4, 16, 1, 3);
  const StepAnalysis a = analyze(s.t);
  const double busy = s.busy_us / 2 / 1e3, idle = s.idle_us / 2 / 1e3;
  ASSERT_NEAR(a.idle_other_ms, idle, 1e-9);
  ASSERT_DOUBLE_EQ(a.kernels_per_step, 500);
  MeasuredStep m;
  m.profiled_ms = a.step_ms * 1.01;  // the events see a little more than the trace
  m.profiled_steps = 2;
  m.unprofiled_ms = busy + 0.1 * idle;
  m.unprofiled_steps = 20;
  m.unprofiled_what = "timed just before";
  const StepAccounting c = account(a, m);
  const double overhead = m.profiled_ms - m.unprofiled_ms;
  EXPECT_NEAR(c.overhead_ms, overhead, 1e-12);
  EXPECT_NEAR(c.overhead_share, overhead / m.unprofiled_ms, 1e-12);
  EXPECT_NEAR(c.cost_per_item_us, 1e3 * overhead / 500, 1e-9);
  EXPECT_EQ(c.items, "kernels");
  EXPECT_NEAR(c.idle_without_profiler_ms, std::max(0.0, idle - overhead), 1e-12);
  EXPECT_NEAR(c.idle_without_profiler_share, c.idle_without_profiler_ms / m.unprofiled_ms, 1e-12);
  EXPECT_NEAR(idle_share_without_profiler(a, m), c.idle_without_profiler_share, 1e-15);
  const std::string text = format_breakdown(a, m);
  char want[256];
  std::snprintf(want, sizeof want, "Profiler overhead: profiled step %.3f ms vs unprofiled %.3f ms (+%.1f%%, about 500 "
                "kernels x %.2f us); unprofiled: median of 20 steps timed just before.",
                m.profiled_ms, m.unprofiled_ms, 100 * overhead / m.unprofiled_ms, 1e3 * overhead / 500);
  EXPECT_TRUE(contains(text, want)) << text << "\nwanted: " << want;
  EXPECT_NEAR(number_after(text, "GPU idle between kernels without the profiler's cost: about "),
              c.idle_without_profiler_ms, 1e-3)
      << text;
  // An overhead larger than the idle time leaves none, not less than none.
  m.unprofiled_ms = busy * 0.5;
  EXPECT_EQ(account(a, m).idle_without_profiler_ms, 0);
  // A profiled step faster than the unprofiled one (noise): nothing is taken out.
  m.unprofiled_ms = m.profiled_ms * 1.02;
  EXPECT_NEAR(account(a, m).idle_without_profiler_ms, idle, 1e-12);
  EXPECT_FALSE(contains(format_breakdown(a, m), "The unprofiled steps were the slower"));
  // Much faster (the unprofiled steps held a warm-up or a capture): said so.
  m.unprofiled_ms = m.profiled_ms * 3;
  EXPECT_TRUE(contains(format_breakdown(a, m), "The unprofiled steps were the slower")) << format_breakdown(a, m);
}

RunFacts facts_with(const MeasuredStep& m) {
  RunFacts f;
  f.precision = "bf16";
  f.fused_kernels = true;
  f.graph = true;
  f.measured = m;
  return f;
}

TEST(ProfileAccounting, LaunchBoundReadsIdleWithoutTheProfilersCost) {
  // A step of 500 matrix kernels of 9-11 us and gaps of 3-5 us under the
  // profiler: ~30% idle in the trace, launch-bound by the trace alone.
  const Synthetic s = synthetic(2, 500, 9, 11, 3, 5, "nvjet_sm90_tst_128x128_h_bz_NNT");
  const StepAnalysis a = analyze(s.t);
  const double idle_share = a.idle_other_ms / a.step_ms;
  ASSERT_GT(idle_share, 0.25);
  ASSERT_LT(idle_share, 0.35);
  EXPECT_TRUE(find_finding(diagnose(a, facts_with({})), "launch-bound"));
  {  // unknown overhead: the evidence says the idle time holds the profiler's cost
    const auto x = find_finding(diagnose(a, facts_with({})), "launch-bound");
    EXPECT_TRUE(contains(x->evidence, "the profiler's own cost included")) << x->evidence;
  }
  // Unprofiled, the kernels run back to back: the profiler made the gaps.
  MeasuredStep m;
  m.profiled_ms = a.step_ms;
  m.profiled_steps = 2;
  m.unprofiled_ms = a.gpu_busy_ms + 0.02 * a.idle_other_ms;
  m.unprofiled_steps = 20;
  const auto f = diagnose(a, facts_with(m));
  EXPECT_FALSE(find_finding(f, "launch-bound"));
  const auto mat = find_finding(f, "matrix-bound");  // and with the idle time gone the step is matrix-bound
  ASSERT_TRUE(mat);
  char idle_pct[32];
  std::snprintf(idle_pct, sizeof idle_pct, "the GPU idle %.0f%%", 100 * 0.02 * a.idle_other_ms / m.unprofiled_ms);
  EXPECT_TRUE(contains(mat->title, idle_pct)) << mat->title << " / " << idle_pct;

  // An eager step idle 88% in the trace, profiled 2.5x the unprofiled step:
  // still launch-bound without the overhead, with the corrected share.
  const Synthetic e = synthetic(2, 1300, 2, 5, 25, 45);
  const StepAnalysis b = analyze(e.t);
  MeasuredStep me;
  me.profiled_ms = b.step_ms;
  me.profiled_steps = 2;
  me.unprofiled_ms = b.step_ms / 2.5;
  me.unprofiled_steps = 20;
  const double overhead = me.profiled_ms - me.unprofiled_ms;
  const double corrected = (b.idle_other_ms - overhead) / me.unprofiled_ms;
  ASSERT_GT(corrected, 0.25);
  const auto x = find_finding(diagnose(b, facts_with(me)), "launch-bound");
  ASSERT_TRUE(x);
  char pct[64];
  std::snprintf(pct, sizeof pct, "for %.0f%% of the step (without the profiler's cost)", 100 * corrected);
  EXPECT_TRUE(contains(x->title, pct)) << x->title << " / " << pct;
  char ev[128];
  std::snprintf(ev, sizeof ev, "about %.3f ms of the unprofiled %.3f ms step (%.3f ms in the trace",
                b.idle_other_ms - overhead, me.unprofiled_ms, b.idle_other_ms);
  EXPECT_TRUE(contains(x->evidence, ev)) << x->evidence << " / " << ev;
  EXPECT_NEAR(x->weight, corrected, 1e-9);
}

// Steps that sleep a known time, the step-window profiler timing them.
void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

TEST(ProfileAccounting, TheProfilerTimesProfiledAndUnprofiledSteps) {
  perftrain::testing::TempDir tmp;
  ProfilerOptions o;
  o.schedule = Schedule{/*skip_first=*/2, /*wait=*/2, /*warmup=*/1, /*active=*/2, /*repeat=*/2};
  o.dir = tmp.path();
  std::vector<MeasuredStep> seen;
  StepProfiler p(o);
  p.on_saved = [&](const std::string&, int w) { seen.push_back(p.window_timing(w)); };
  // Unprofiled steps take 3 ms, warm-up 1 ms, profiled 12 ms.
  for (int64_t i = 0; i < 20; ++i) {
    p.begin_step(i);
    const Action act = action_at(o.schedule, i);
    sleep_ms(act == Action::kNone ? 3 : act == Action::kWarmup ? 1 : 12);
    p.end_step(i);
    if (p.done_after(i)) break;
  }
  p.finish();
  ASSERT_EQ(p.traces().size(), 2u);
  ASSERT_EQ(seen.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    const MeasuredStep& m = p.window_timing(w);
    EXPECT_EQ(m.profiled_steps, 2);
    EXPECT_GE(m.profiled_ms, 12);
    EXPECT_LT(m.profiled_ms, 12 + 30);  // a shared machine: a loose upper bound
    EXPECT_GE(m.unprofiled_ms, 3);
    EXPECT_LT(m.unprofiled_ms, m.profiled_ms);
    EXPECT_EQ(seen[w].profiled_ms, m.profiled_ms);
    // The trace's window agrees with the profiler's own clock.
    const StepAnalysis a = analyze(load_trace(p.traces()[w]));
    EXPECT_NEAR(a.step_ms, m.profiled_ms, 0.25 * m.profiled_ms);
  }
  // First window: the skipped and the waiting steps before it; the second:
  // its own wait steps only.
  EXPECT_EQ(p.window_timing(0).unprofiled_steps, 4);
  EXPECT_EQ(p.window_timing(1).unprofiled_steps, 2);
  EXPECT_THROW(p.window_timing(2), perftrain::RuntimeError);
}

TEST(ProfileAccounting, NoUnprofiledStepsBeforeAWindowThatStartsAtOnce) {
  perftrain::testing::TempDir tmp;
  ProfilerOptions o;
  o.schedule = Schedule{0, 0, 0, 2, 1};
  o.dir = tmp.path();
  StepProfiler p(o);
  for (int64_t i = 0; i < 3; ++i) {
    p.begin_step(i);
    sleep_ms(2);
    p.end_step(i);
  }
  p.finish();
  const MeasuredStep& m = p.window_timing(0);
  EXPECT_EQ(m.unprofiled_steps, 0);
  EXPECT_EQ(m.unprofiled_ms, 0);
  EXPECT_GE(m.profiled_ms, 2);
  const std::string text = format_breakdown(analyze(load_trace(p.traces()[0])), m);
  EXPECT_TRUE(contains(text, "Profiler overhead: unknown")) << text;
  EXPECT_TRUE(contains(text, "| unattributed:")) << text;
}

}  // namespace
