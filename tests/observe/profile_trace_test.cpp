// The step-window profiler on the CPU, through libtorch's Kineto: the
// schedule's window becomes one trace file, valid JSON with traceEvents, our
// metadata, the ProfilerStep ranges of the recorded steps only, and the
// PERFTRAIN_SCOPE ranges nested as they ran; read back, the timeline and the
// op table see the steps and the ops.
#include <gtest/gtest.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <string>

#include "base/scope.h"
#include "observe/profile/step_profiler.h"
#include "observe/profile/timeline.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::profile;

void work(int64_t step) {
  PERFTRAIN_SCOPE("forward");
  for (int b = 0; b < 2; ++b) {
    PERFTRAIN_SCOPE_INDEXED("block", b);
    auto x = at::randn({64 + step, 64});
    auto y = at::matmul(x, x.t());
    (void)y;
  }
}

// `steps` steps of work() through the profiler p, then finish().
void run_steps(StepProfiler& p, int64_t steps) {
  for (int64_t i = 0; i < steps; ++i) {
    p.begin_step(i);
    work(i);
    p.end_step(i);
  }
  p.finish();
}

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string out;
  char buf[65536];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

const nlohmann::json* find_event(const nlohmann::json& events, const std::string& name) {
  for (const auto& e : events)
    if (e.value("name", "") == name) return &e;
  return nullptr;
}

TEST(ProfileTrace, OneWindowOneTraceWithNestedScopes) {
  perftrain::testing::TempDir tmp;
  ProfilerOptions o;
  o.schedule = Schedule{/*skip_first=*/1, /*wait=*/1, /*warmup=*/1, /*active=*/2, /*repeat=*/1};
  o.dir = tmp.file("profile");
  o.metadata["model"] = "test";
  int saved = 0;
  {
    StepProfiler p(o);
    p.on_saved = [&](const std::string&, int) { ++saved; };
    run_steps(p, 8);
    ASSERT_EQ(p.traces().size(), 1u);
    EXPECT_EQ(p.traces()[0], tmp.file("profile/window-0.json"));
  }
  EXPECT_EQ(saved, 1);
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("profile/window-0.json")));
  ASSERT_TRUE(j.contains("traceEvents"));
  ASSERT_TRUE(j["traceEvents"].is_array());
  EXPECT_EQ(j["perftrain"]["model"], "test");
  EXPECT_EQ(j["perftrain"]["steps"], "3-4");
  const auto& ev = j["traceEvents"];
  // Steps 3 and 4 recorded (skip 1, wait 1, warm-up 1), no others.
  EXPECT_NE(find_event(ev, "ProfilerStep#3"), nullptr);
  EXPECT_NE(find_event(ev, "ProfilerStep#4"), nullptr);
  EXPECT_EQ(find_event(ev, "ProfilerStep#2"), nullptr);
  EXPECT_EQ(find_event(ev, "ProfilerStep#5"), nullptr);
  // Each block inside a forward, each forward inside a step, on one thread.
  int blocks = 0;
  for (const auto& b : ev) {
    if (b.value("name", "") != "perftrain::block 1") continue;
    ++blocks;
    EXPECT_EQ(b.value("cat", ""), "user_annotation");
    bool inside = false;
    for (const auto& f : ev) {
      if (f.value("name", "") != "perftrain::forward" || f["tid"] != b["tid"]) continue;
      const double fs = f["ts"].get<double>(), fe = fs + f["dur"].get<double>();
      const double bs = b["ts"].get<double>(), be = bs + b["dur"].get<double>();
      inside |= fs <= bs && be <= fe;
    }
    EXPECT_TRUE(inside);
  }
  EXPECT_EQ(blocks, 2);

  const Timeline t = load_trace(tmp.file("profile/window-0.json"));
  const StepAnalysis a = analyze(t);
  EXPECT_EQ(a.steps, 2);
  EXPECT_GT(a.step_ms, 0);
  const auto ops = op_table(t, GroupBy::kOp);
  bool mm = false;
  for (const auto& r : ops) mm |= r.name == "aten::matmul" && r.calls == 2;
  EXPECT_TRUE(mm);
  const auto scopes = op_table(t, GroupBy::kScope);
  bool fwd = false;
  for (const auto& r : scopes) fwd |= r.name == "perftrain::forward" && r.calls == 1 && r.total_cpu_ms > 0;
  EXPECT_TRUE(fwd);
}

TEST(ProfileTrace, GzipAndRepeatedWindows) {
  perftrain::testing::TempDir tmp;
  ProfilerOptions o;
  o.schedule = Schedule{0, 0, 0, 1, 2};  // steps 0 and 1, one window each
  o.dir = tmp.file("p");
  o.tag = "uncaptured-";
  o.gzip = true;
  StepProfiler p(o);
  run_steps(p, 4);
  ASSERT_EQ(p.traces().size(), 2u);
  EXPECT_EQ(p.traces()[1], tmp.file("p/uncaptured-window-1.json.gz"));
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("p/uncaptured-window-1.json")));
  const auto j = nlohmann::json::parse(gunzip(p.traces()[1]));
  EXPECT_TRUE(j["traceEvents"].is_array());
  EXPECT_NE(find_event(j["traceEvents"], "ProfilerStep#1"), nullptr);
  EXPECT_EQ(analyze(load_trace(p.traces()[0])).steps, 1);
}

// --profile-scopes-only: the perftrain scopes and the steps, not the ATen ops.
TEST(ProfileTrace, ScopesOnlyRecordsTheScopesNotTheOps) {
  perftrain::testing::TempDir tmp;
  for (const bool only : {false, true}) {
    ProfilerOptions o;
    o.schedule = Schedule{0, 0, 1, 2, 1};
    o.dir = tmp.file(only ? "only" : "all");
    o.scopes_only = only;
    StepProfiler p(o);
    run_steps(p, 3);
    ASSERT_EQ(p.traces().size(), 1u);
    const auto j = nlohmann::json::parse(perftrain::testing::read_raw(p.traces()[0]));
    int ops = 0;
    for (const auto& e : j["traceEvents"]) ops += e.value("cat", "") == "cpu_op";
    const auto& ev = j["traceEvents"];
    EXPECT_NE(find_event(ev, "perftrain::block 1"), nullptr) << only;
    EXPECT_NE(find_event(ev, "ProfilerStep#2"), nullptr) << only;
    EXPECT_EQ(find_event(ev, "aten::matmul") != nullptr, !only);
    if (only) EXPECT_EQ(ops, 0);
    else EXPECT_GT(ops, 4);
    const StepAnalysis a = analyze(load_trace(p.traces()[0]));
    EXPECT_EQ(a.steps, 2);
    EXPECT_GT(a.busy_by_phase.size(), 0u);  // the host time still split by phase
    EXPECT_EQ(op_table(load_trace(p.traces()[0]), GroupBy::kOp).empty(), only);
  }
}

TEST(ProfileTrace, ScopesWithoutAProfilerDoNothing) {
  for (int64_t i = 0; i < 3; ++i) work(i);  // no profiler: no error, nothing recorded
  SUCCEED();
}

}  // namespace
