// What the GPU did while the timed steps ran: nvidia-smi samples its SM clock,
// power draw and temperature every 100 ms in the background. A step that is
// slow because the GPU lowered its clock (at its power limit, or hot) then
// says so in the bench report, instead of looking like slow code. nvidia-smi
// runs as a child process, on the CPU; the GPU work is not touched. Without
// nvidia-smi (or a GPU) there are no samples and every value is empty.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace perftrain::observe::bench {

struct GpuSamples {
  int count = 0;
  std::optional<double> sm_clock_mhz_median, sm_clock_mhz_min, sm_clock_max_mhz;
  std::optional<double> power_w_mean, power_w_max, power_limit_w;
  std::optional<double> temperature_c_max;
  // Share of the samples drawing >= 97% of the power limit: the clock is
  // then set by power, and a kernel that is faster alone may not be in a step.
  std::optional<double> at_power_limit;
};

// The nvidia-smi query the sampler runs, one CSV line per sample without
// units: "clocks.sm, clocks.max.sm, power.draw, power.limit, temperature.gpu".
extern const char* const kGpuSampleFields;

// Statistics of those lines; lines that do not parse ("[N/A]", an error
// message) are skipped.
GpuSamples parse_gpu_samples(const std::string& csv);

// "1755 MHz (max 1980), 688 W of 700 (93% of samples at the limit), 61 C";
// "n/a" without samples.
std::string describe(const GpuSamples& s);

class GpuSampler {
 public:
  // Starts sampling the GPU nvidia-smi knows by `id` (a PCI bus id or an
  // index); an empty id starts nothing.
  explicit GpuSampler(const std::string& id, int period_ms = 100);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  // Stops the sampler and returns what it saw (empty after the first call).
  GpuSamples stop();

 private:
  pid_t pid_ = -1;
  std::string path_;  // where nvidia-smi writes, removed by stop()
};

}  // namespace perftrain::observe::bench
