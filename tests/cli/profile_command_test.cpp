// perftrain profile and train --profile on the CPU, as a user runs them: the
// schedule's window becomes a trace (valid JSON with traceEvents and our
// metadata) holding the step's scopes nested as they ran; profile.md and the
// per-window report say where the time went; bad options exit 2 naming them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;
using perftrain::testing::run_shell;

perftrain::testing::CommandResult run(const std::string& args) {
  return run_shell(std::string(PERFTRAIN_BINARY) + " " + args);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kTinyModel =
    " --device cpu --set model.depth=2 --set model.hidden=32 --set model.heads=2 --set model.patch=8";

// The names of the events in a trace, and whether `inner` lies inside `outer` on one thread.
struct Trace {
  nlohmann::json j;
  explicit Trace(const std::string& path) : j(nlohmann::json::parse(perftrain::testing::read_raw(path))) {}
  bool has(const std::string& name) const {
    for (const auto& e : j["traceEvents"])
      if (e.value("name", "") == name) return true;
    return false;
  }
  bool nested(const std::string& inner, const std::string& outer) const {
    for (const auto& i : j["traceEvents"]) {
      if (i.value("name", "") != inner) continue;
      for (const auto& o : j["traceEvents"]) {
        if (o.value("name", "") != outer || o["tid"] != i["tid"]) continue;
        const double is = i["ts"].get<double>(), ie = is + i["dur"].get<double>();
        const double os = o["ts"].get<double>(), oe = os + o["dur"].get<double>();
        if (os <= is && ie <= oe) return true;
      }
    }
    return false;
  }
};

TEST(CliProfile, ProfilesAStepOnTheCpu) {
  TempDir tmp;
  const std::string out = tmp.file("p");
  const auto r = run("profile" + kTinyModel + " --model DiT-T/4 --batch 2 --variant eager-fp32 --timed-steps 2"
                     " --schedule wait=1,warmup=1,active=2 --group-by scope --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "### Where the step's time goes")) << r.output;
  EXPECT_TRUE(contains(r.output, "host: forward")) << r.output;
  EXPECT_TRUE(contains(r.output, "### Diagnosis")) << r.output;
  EXPECT_TRUE(contains(r.output, "`perftrain::backward`")) << r.output;  // the op table by scope
  const std::string md = perftrain::testing::read_raw(out + "/profile.md");
  EXPECT_TRUE(contains(md, "Measured without the profiler"));
  // The breakdown against the profiled step, and the profiler's overhead
  // against the steps timed before it (the host clock on the CPU).
  EXPECT_TRUE(contains(r.output, "measured around the 2 profiled steps (host clock)")) << r.output;
  EXPECT_TRUE(contains(r.output, "| unattributed: the measured profiled step less the trace's window |")) << r.output;
  EXPECT_TRUE(contains(r.output, "Breakdown against the profiled step: the trace's parts sum to ")) << r.output;
  EXPECT_TRUE(contains(r.output, "Profiler overhead: profiled step ")) << r.output;
  EXPECT_TRUE(contains(r.output, "ATen ops x ")) << r.output;
  EXPECT_TRUE(contains(r.output, "unprofiled: median of 2 steps timed just before the profiler started")) << r.output;
  {  // the sum row is the profiled step the overhead line names
    auto after = [&](const std::string& label) {
      const size_t at = r.output.find(label);
      return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + label.size()));
    };
    EXPECT_GT(after("| **sum** | **"), 0);
    EXPECT_NEAR(after("| **sum** | **"), after("Profiler overhead: profiled step "), 1e-3) << r.output;
  }
  const Trace t(out + "/window-0.json");
  ASSERT_TRUE(t.j["traceEvents"].is_array());
  EXPECT_EQ(t.j["perftrain"]["captured"], "false");
  EXPECT_EQ(t.j["perftrain"]["steps"], "2-3");
  EXPECT_TRUE(t.has("ProfilerStep#2") && t.has("ProfilerStep#3") && !t.has("ProfilerStep#1"));
  EXPECT_TRUE(t.nested("perftrain::block 1", "perftrain::forward"));
  EXPECT_TRUE(t.nested("perftrain::forward", "perftrain::loss"));
  EXPECT_TRUE(t.nested("perftrain::loss", "perftrain::step"));
  EXPECT_TRUE(t.nested("perftrain::backward", "perftrain::step"));
  EXPECT_TRUE(t.nested("perftrain::optimizer", "perftrain::step"));
  EXPECT_TRUE(t.nested("perftrain::ema", "perftrain::step"));
  EXPECT_TRUE(t.nested("perftrain::data_wait", "ProfilerStep#2"));
  // a second run into the same directory is refused
  const auto again = run("profile" + kTinyModel + " --model DiT-T/4 --batch 2 --variant eager-fp32 --out " + out);
  EXPECT_EQ(again.code, 2) << again.output;
}

// train.precision = fp8 through --set: the step runs its fp8 linears (on the
// CPU on the references) and the scaling update once a step, in its own scope.
TEST(CliProfile, ProfilesAnFp8Step) {
  TempDir tmp;
  const std::string out = tmp.file("p");
  const auto r = run("profile" + kTinyModel + " --model DiT-T/4 --batch 2 --variant all --set train.precision=fp8"
                     " --timed-steps 2 --schedule wait=1,warmup=1,active=2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(perftrain::testing::read_raw(out + "/profile.md"), "precision fp8")) << r.output;
  const Trace t(out + "/window-0.json");
  EXPECT_TRUE(t.nested("perftrain::fp8_scaling", "perftrain::step"));
}

// --profile-scopes-only: the perftrain scopes in the trace, no ATen ops; the
// report still splits the step by phase and says what it measured.
TEST(CliProfile, ScopesOnlyForProfileAndTrain) {
  TempDir tmp;
  auto ops_in = [](const std::string& path) {
    int n = 0;
    for (const auto& e : Trace(path).j["traceEvents"]) n += e.value("cat", "") == "cpu_op";
    return n;
  };
  const std::string out = tmp.file("p");
  auto r = run("profile" + kTinyModel + " --model DiT-T/4 --batch 2 --variant eager-fp32 --timed-steps 2"
               " --schedule wait=1,warmup=1,active=2 --profile-scopes-only --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--profile-scopes-only: the perftrain scopes are recorded")) << r.output;
  EXPECT_TRUE(contains(r.output, "host: backward")) << r.output;
  EXPECT_TRUE(contains(r.output, "Profiler overhead: profiled step ")) << r.output;
  const Trace t(out + "/window-0.json");
  EXPECT_EQ(t.j["perftrain"]["ops_recorded"], "false: perftrain scopes only (--profile-scopes-only)");
  EXPECT_TRUE(t.nested("perftrain::backward", "perftrain::step"));
  EXPECT_EQ(ops_in(out + "/window-0.json"), 0);
  r = run("train --data synthetic --steps 4 --batch-size 2 --run-name r --runs-dir " + tmp.path() + kTinyModel +
          " --set log.sample_per_class=1 --set diffusion.sample_steps=1 --set log.sample_classes=2"
          " --profile skip_first=1,warmup=1,active=1 --profile-scopes-only");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string trace = tmp.file("r/profile/window-0.json");
  EXPECT_TRUE(Trace(trace).has("perftrain::backward"));
  EXPECT_EQ(ops_in(trace), 0);
}

TEST(CliProfile, BadOptionsExit2NamingThem) {
  TempDir tmp;
  auto r = run("profile --device cpu --schedule active=0 --out " + tmp.file("a"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "--schedule: active must be at least 1")) << r.output;
  r = run("profile --device cpu --group-by kernels --out " + tmp.file("b"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "--group-by must be kernel, op or scope")) << r.output;
  r = run("profile --device cpu --variant fastest --out " + tmp.file("c"));
  EXPECT_EQ(r.code, 2);
  r = run("train --device cpu --profile sleep=3 --runs-dir " + tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "--profile: unknown key 'sleep'")) << r.output;
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("a")));
}

// On the CPU nothing asks anything of CUDA (no CUDA activity requested of
// the profiler, no device queries: no "gpuGetDeviceCount failed" line), the
// kernel table says it is for CUDA runs instead of being empty, and the op
// table's shares are of CPU time (not 0.0% for every op).
TEST(CliProfile, OnTheCpuNothingAsksForCudaAndSharesAreOfCpuTime) {
  TempDir tmp;
  const std::string cmd = "profile" + kTinyModel + " --model DiT-T/4 --batch-size 2 --variant eager-fp32"
                          " --timed-steps 1 --schedule wait=0,warmup=1,active=1";
  auto r = run(cmd + " --out " + tmp.file("k"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "gpuGetDeviceCount")) << r.output;
  EXPECT_FALSE(contains(r.output, "CUDA initialization")) << r.output;
  EXPECT_TRUE(contains(r.output, "the kernel table is for CUDA runs")) << r.output;
  EXPECT_FALSE(contains(r.output, "| kernel | self CUDA ms")) << "an empty kernel table\n" << r.output;

  r = run(cmd + " --group-by op --out " + tmp.file("o"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "gpuGetDeviceCount")) << r.output;
  EXPECT_TRUE(contains(r.output, "the share is of total CPU time")) << r.output;
  // The op table's first row (the most CPU time): a share above 0.
  const size_t table = r.output.find("| op | self CUDA ms");
  ASSERT_NE(table, std::string::npos) << r.output;
  const size_t row = r.output.find("\n| `", table);
  ASSERT_NE(row, std::string::npos) << r.output;
  const std::string line = r.output.substr(row + 1, r.output.find('\n', row + 1) - row - 1);
  const size_t pct = line.rfind('%');
  const size_t bar = line.rfind('|', pct);
  ASSERT_TRUE(pct != std::string::npos && bar != std::string::npos) << line;
  EXPECT_GT(std::stod(line.substr(bar + 1, pct - bar - 1)), 0.0) << line;
}

// profile spells the batch option as every command does and takes --batch
// too; the inputs that would reach an allocator or run unbounded are
// one-line usage errors naming the option, with nothing written. (timeout:
// a program that takes them must not hang the test.)
TEST(CliProfile, InputsBeyondTheirBoundsAreUsageErrors) {
  TempDir tmp;
  const std::string out = tmp.file("x");
  const std::string cmd = "timeout 60 " + std::string(PERFTRAIN_BINARY) + " profile" + kTinyModel +
                          " --model DiT-T/4 --variant eager-fp32 ";
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-size 1000000000", "--batch-size 1000000000 needs about"},
           {"--batch 1000000000", "the largest batch that fits is"},
           {"--batch 1e9", "--batch-size takes positive integers"},
           {"--batch-size 2,4", "--batch-size takes one size"},
           {"--batch 2 --slow-data-ms nan", "--slow-data-ms: nan is not a finite number"},
           {"--batch 2 --slow-data-ms 1e12", "--slow-data-ms: 1e12 is not a finite number from 0 to 10000"},
           {"--batch 2 --schedule wait=1000000000", "--schedule: wait takes an integer from 0 to 1000000"},
           {"--batch 2 --schedule wait=100000", "perftrain profile runs at most 1000"},
           {"--batch 2 --schedule repeat=0", "--schedule: repeat=0"},
           {"--batch 2 --timed-steps 100000000", "--timed-steps"},
       }) {
    auto r = run_shell(cmd + args + " --out " + out);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expect)) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": one line\n" << r.output;
    EXPECT_FALSE(perftrain::fs::exists(out)) << args;
  }
  // and the train --profile schedule takes the same bounds
  auto r = run("train --device cpu --profile wait=1000000000 --runs-dir " + tmp.path());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--profile: wait takes an integer from 0 to 1000000")) << r.output;
}

TEST(CliProfile, TrainProfilesWindowsOfARealRun) {
  TempDir tmp;
  const auto r = run("train --data synthetic --steps 5 --batch-size 2 --run-name r --runs-dir " + tmp.path() +
                     kTinyModel + " --set log.sample_per_class=1 --set diffusion.sample_steps=1"
                     " --set log.sample_classes=2 --set log.every=2 --profile skip_first=1,warmup=1,active=2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "profile: window 0:")) << r.output;
  const std::string dir = tmp.file("r/profile");
  const Trace t(dir + "/window-0.json");
  EXPECT_TRUE(t.has("ProfilerStep#2") && t.has("ProfilerStep#3"));
  EXPECT_TRUE(t.nested("perftrain::data_wait", "ProfilerStep#2"));
  EXPECT_TRUE(t.nested("perftrain::backward", "perftrain::step"));
  EXPECT_TRUE(t.has("perftrain::log_window"));  // step 4 (index 3) ends a log window
  const std::string md = perftrain::testing::read_raw(dir + "/window-0.md");
  EXPECT_TRUE(contains(md, "### Diagnosis")) << md;
  EXPECT_TRUE(contains(md, "host: backward")) << md;
  // The profiled steps timed around themselves, the skipped step before the
  // window's warm-up as the unprofiled one.
  EXPECT_TRUE(contains(md, "measured around the 2 profiled steps")) << md;
  EXPECT_TRUE(contains(md, "| unattributed:")) << md;
  EXPECT_TRUE(contains(md, "Profiler overhead: profiled step ")) << md;
  EXPECT_TRUE(contains(md, "unprofiled: median of 1 step just before the window's warm-up")) << md;
}

}  // namespace
