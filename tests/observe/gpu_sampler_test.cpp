// The GPU sampler behind the bench's "GPU during the timed steps": parsing
// nvidia-smi's lines, nothing without an id, and the whole loop against a
// stand-in nvidia-smi on PATH (the CPU machine has none): it is started with
// the query, stopped with Ctrl+C, and its samples come back.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "observe/bench/gpu_sampler.h"
#include "support/test_support.h"

namespace perftrain::observe::bench {
namespace {

TEST(GpuSampler, ParsesTheSamplesAndSkipsWhatIsNotOne) {
  const std::string csv =
      "1755, 1980, 688.50, 700.00, 61\n"
      "1980, 1980, 420.00, 700.00, 58\n"
      "[N/A], 1980, 420.00, 700.00, 58\n"
      "Failed to initialize NVML\n"
      "1600, 1980, 695.00, 700.00, 63\r\n"
      "1700, 1980, 700.00, 700.00, 62, 7\n";  // six fields: not this query's
  const GpuSamples s = parse_gpu_samples(csv);
  EXPECT_EQ(s.count, 3);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz_median, 1755);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz_min, 1600);
  EXPECT_DOUBLE_EQ(*s.sm_clock_max_mhz, 1980);
  EXPECT_NEAR(*s.power_w_mean, (688.5 + 420 + 695) / 3, 1e-9);
  EXPECT_DOUBLE_EQ(*s.power_w_max, 695);
  EXPECT_DOUBLE_EQ(*s.power_limit_w, 700);
  EXPECT_DOUBLE_EQ(*s.temperature_c_max, 63);
  EXPECT_NEAR(*s.at_power_limit, 2.0 / 3, 1e-9);  // 688.5 and 695 are >= 97% of 700
  EXPECT_EQ(describe(s), "1755 MHz (min 1600, max 1980), 601 W of 700 (67% of samples at the limit), 63 C");

  const GpuSamples even = parse_gpu_samples("1000, 1980, 1, 700, 30\n2000, 1980, 1, 700, 30\n");
  EXPECT_DOUBLE_EQ(*even.sm_clock_mhz_median, 1500);
  EXPECT_DOUBLE_EQ(*even.at_power_limit, 0.0);

  const GpuSamples none = parse_gpu_samples("nvidia-smi: command not found\n");
  EXPECT_EQ(none.count, 0);
  EXPECT_FALSE(none.sm_clock_mhz_median.has_value());
  EXPECT_EQ(describe(none), "n/a");
}

TEST(GpuSampler, NoIdSamplesNothing) {
  GpuSampler sampler("");
  const GpuSamples s = sampler.stop();
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(sampler.stop().count, 0) << "a second stop is harmless";
}

TEST(GpuSampler, RunsNvidiaSmiUntilStopped) {
  perftrain::testing::TempDir tmp;
  const std::string args_file = tmp.path() + "/args";
  const std::string fake = tmp.path() + "/nvidia-smi";
  {
    std::ofstream f(fake);
    f << "#!/bin/sh\n"
      << "echo \"$@\" > '" << args_file << "'\n"
      << "trap 'exit 0' INT\n"
      << "while true; do echo '1500, 1980, 699.00, 700.00, 55'; sleep 0.02; done\n";
  }
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", (tmp.path() + ":" + saved).c_str(), 1);
  GpuSamples s;
  {
    GpuSampler sampler("00000000:19:00.0", 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    s = sampler.stop();
  }
  ::setenv("PATH", saved.c_str(), 1);
  ASSERT_GE(s.count, 2);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz_median, 1500);
  EXPECT_DOUBLE_EQ(*s.at_power_limit, 1.0);
  std::ifstream a(args_file);
  std::stringstream args;
  args << a.rdbuf();
  EXPECT_NE(args.str().find(std::string("--query-gpu=") + kGpuSampleFields), std::string::npos) << args.str();
  EXPECT_NE(args.str().find("--format=csv,noheader,nounits"), std::string::npos) << args.str();
  EXPECT_NE(args.str().find("--loop-ms=20"), std::string::npos) << args.str();
  EXPECT_NE(args.str().find("--id=00000000:19:00.0"), std::string::npos) << args.str();
}

}  // namespace
}  // namespace perftrain::observe::bench
