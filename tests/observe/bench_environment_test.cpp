// The environment report: nvidia-smi's CSV read into fields, "n/a" for what a
// CPU-only machine cannot know, the commit from the env var or git, and the
// host-clock step timer used on the CPU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <regex>
#include <thread>

#include "base/error.h"
#include "base/fs.h"
#include "observe/bench/environment.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/step_timer.h"
#include "compat/compat.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::bench;
using perftrain::testing::TempDir;

TEST(BenchEnvironment, ParsesNvidiaSmi) {
  auto g = parse_nvidia_smi_line(
      "NVIDIA H200, 580.95.05, 1980 MHz, 1980 MHz, 3201 MHz, 3201 MHz, 700.00 W, 34, P0");
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.driver, "580.95.05");
  EXPECT_EQ(g.sm_clock, "1980 MHz");
  EXPECT_EQ(g.sm_clock_max, "1980 MHz");
  EXPECT_EQ(g.mem_clock, "3201 MHz");
  EXPECT_EQ(g.mem_clock_max, "3201 MHz");
  EXPECT_EQ(g.power_limit, "700.00 W");
  EXPECT_EQ(g.temperature, "34 C");
  EXPECT_EQ(g.pstate, "P0");
  g = parse_nvidia_smi_line("NVIDIA H200, 580.95.05, 345 MHz, 1980 MHz, [N/A], 3201 MHz, [Not Supported], [N/A], P8");
  EXPECT_EQ(g.sm_clock, "345 MHz");
  EXPECT_EQ(g.mem_clock, "n/a");
  EXPECT_EQ(g.power_limit, "n/a");
  EXPECT_EQ(g.temperature, "n/a");
  // Not the line asked for (an error message, an old nvidia-smi): all n/a.
  for (const char* bad : {"", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
                          "a, b, c"}) {
    g = parse_nvidia_smi_line(bad);
    EXPECT_EQ(g.name, "n/a") << bad;
    EXPECT_EQ(g.sm_clock, "n/a") << bad;
  }
}

TEST(BenchEnvironment, CpuFieldsAreNaNotMissing) {
  // The build's commit, when it was given, wins over git's.
  const auto e = collect_environment(at::Device(at::kCPU), PERFTRAIN_SOURCE_DIR, "abc1234");
  EXPECT_EQ(e.commit, "abc1234");
  EXPECT_EQ(e.gpu_name, "n/a");
  EXPECT_EQ(e.smi.sm_clock, "n/a");
  EXPECT_EQ(e.torch, perftrain::compat::torch_version());
  EXPECT_NE(e.hostname, "n/a");
  const auto fields = environment_fields(e);
  std::vector<std::string> keys;
  for (const auto& [k, v] : fields) {
    keys.push_back(k);
    EXPECT_FALSE(v.empty()) << k;
  }
  for (const char* k : {"device", "gpu", "driver", "cuda_runtime", "cudnn", "torch", "sm_clock", "sm_clock_max",
                        "mem_clock", "mem_clock_max", "hostname", "commit", "timestamp"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  // How the step ran is the [speed] config's, in the report's config, not
  // something read from the environment.
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "switches"), keys.end());
}

TEST(BenchEnvironment, CommitFromGit) {
  const std::string src = PERFTRAIN_SOURCE_DIR;
  const auto e = collect_environment(at::Device(at::kCPU), src);
  if (!perftrain::fs::exists(src + "/.git") ||
      perftrain::testing::run_command("git -C '" + src + "' rev-parse HEAD >/dev/null 2>&1") != 0) {
    EXPECT_EQ(e.commit, "unknown");
    return;
  }
  EXPECT_TRUE(std::regex_match(e.commit, std::regex("[0-9a-f]{7,40}(-dirty)?"))) << e.commit;
  TempDir tmp;
  EXPECT_EQ(collect_environment(at::Device(at::kCPU), tmp.path()).commit, "unknown");
}

// This test program is not in <checkout>/build/: the build's checkout, when
// it holds bench/reference_dit.py; else the current directory. Nothing is
// read from the environment (PERFTRAIN_SOURCE_DIR set here changes nothing).
TEST(BenchEnvironment, SourceDirFromTheBuild) {
  TempDir tmp;
  tmp.mkdir("bench");
  perftrain::testing::write_raw(tmp.file("bench/reference_dit.py"), "");
  ::setenv("PERFTRAIN_SOURCE_DIR", "/somewhere/perftrain", 1);
  EXPECT_EQ(find_source_dir(tmp.path()), tmp.path());
  ::unsetenv("PERFTRAIN_SOURCE_DIR");
  TempDir empty;
  const std::string other = find_source_dir(empty.path());
  EXPECT_NE(other, empty.path());
  EXPECT_FALSE(other.empty());
  EXPECT_EQ(find_source_dir(PERFTRAIN_SOURCE_DIR), PERFTRAIN_SOURCE_DIR);
}

TEST(BenchEnvironment, MatmulPeakIsNaOnTheCpu) {
  const auto p = measure_matmul_peak(at::Device(at::kCPU));
  EXPECT_FALSE(p.tflops.has_value());
  EXPECT_EQ(p.note.rfind("n/a", 0), 0u) << p.note;
}

TEST(BenchStepTimer, HostClockOnTheCpu) {
  StepTimer timer(at::Device(at::kCPU), 3);
  EXPECT_FALSE(timer.uses_cuda_events());
  for (int i = 0; i < 3; ++i) {
    timer.begin(i);
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * (i + 1)));
    timer.end(i);
  }
  const auto ms = timer.elapsed_ms();
  ASSERT_EQ(ms.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(ms[i], 10.0 * (i + 1)) << i;        // sleep_for sleeps at least that long
    EXPECT_LT(ms[i], 10.0 * (i + 1) + 200) << i;  // a loaded CI machine may add some
  }
  StepTimer partial(at::Device(at::kCPU), 2);
  partial.begin(0);
  partial.end(0);
  EXPECT_THROW(partial.elapsed_ms(), perftrain::RuntimeError);
  EXPECT_THROW(partial.begin(2), perftrain::RuntimeError);
  EXPECT_THROW(StepTimer(at::Device(at::kCPU), 0), perftrain::UsageError);
}

}  // namespace
