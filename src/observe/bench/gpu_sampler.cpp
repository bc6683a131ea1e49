#include "observe/bench/gpu_sampler.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace perftrain::observe::bench {

const char* const kGpuSampleFields = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu";

namespace {

// The five numbers of one line, or false.
bool parse_line(const std::string& line, double (&v)[5]) {
  std::stringstream in(line);
  std::string cell;
  int n = 0;
  while (std::getline(in, cell, ',')) {
    if (n == 5) return false;
    char* end = nullptr;
    const double x = std::strtod(cell.c_str(), &end);
    if (end == cell.c_str()) return false;  // "[N/A]", text
    for (; *end != '\0'; ++end)
      if (*end != ' ' && *end != '\r') return false;
    v[n++] = x;
  }
  return n == 5;
}

}  // namespace

GpuSamples parse_gpu_samples(const std::string& csv) {
  std::vector<double> clock, power;
  GpuSamples s;
  int at_limit = 0;
  std::stringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    double v[5];
    if (!parse_line(line, v)) continue;
    clock.push_back(v[0]);
    power.push_back(v[2]);
    s.sm_clock_max_mhz = std::max(s.sm_clock_max_mhz.value_or(0), v[1]);
    s.power_limit_w = std::max(s.power_limit_w.value_or(0), v[3]);
    s.temperature_c_max = std::max(s.temperature_c_max.value_or(-273), v[4]);
    at_limit += v[3] > 0 && v[2] >= 0.97 * v[3];
  }
  s.count = int(clock.size());
  if (s.count == 0) return GpuSamples{};
  std::vector<double> sorted = clock;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.sm_clock_mhz_median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s.sm_clock_mhz_min = sorted.front();
  double sum = 0;
  for (double p : power) sum += p;
  s.power_w_mean = sum / double(n);
  s.power_w_max = *std::max_element(power.begin(), power.end());
  s.at_power_limit = double(at_limit) / double(n);
  return s;
}

std::string describe(const GpuSamples& s) {
  if (s.count == 0) return "n/a";
  char text[200];
  std::snprintf(text, sizeof text, "%.0f MHz (min %.0f, max %.0f), %.0f W of %.0f (%.0f%% of samples at the limit), %.0f C",
                *s.sm_clock_mhz_median, *s.sm_clock_mhz_min, *s.sm_clock_max_mhz, *s.power_w_mean, *s.power_limit_w,
                100.0 * *s.at_power_limit, *s.temperature_c_max);
  return text;
}

GpuSampler::GpuSampler(const std::string& id, int period_ms) {
  if (id.empty()) return;
  char tmpl[] = "/tmp/perftrain-gpu-samples-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return;
  path_ = tmpl;
  const std::string query = std::string("--query-gpu=") + kGpuSampleFields;
  const std::string period = "--loop-ms=" + std::to_string(std::max(period_ms, 10));
  const std::string select = "--id=" + id;
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: stdout to the file, stderr dropped, then nvidia-smi
    ::dup2(fd, STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDERR_FILENO);
    // Line-buffered through stdbuf where it exists, so that every sample is in
    // the file when the sampler is stopped; plain nvidia-smi otherwise.
    ::execlp("stdbuf", "stdbuf", "-oL", "nvidia-smi", query.c_str(), "--format=csv,noheader,nounits",
             period.c_str(), select.c_str(), static_cast<char*>(nullptr));
    ::execlp("nvidia-smi", "nvidia-smi", query.c_str(), "--format=csv,noheader,nounits", period.c_str(),
             select.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);  // no nvidia-smi: no samples
  }
  ::close(fd);
  pid_ = pid;  // -1 when fork failed: stop() finds an empty file
}

GpuSamples GpuSampler::stop() {
  if (pid_ > 0) {
    // nvidia-smi's loop ends on Ctrl+C; SIGKILL if it has not exited in 2 s.
    ::kill(pid_, SIGINT);
    int status = 0;
    bool reaped = false;
    for (int i = 0; i < 200 && !reaped; ++i) {
      reaped = ::waitpid(pid_, &status, WNOHANG) != 0;
      if (!reaped) ::usleep(10000);
    }
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (path_.empty()) return GpuSamples{};
  std::ifstream in(path_);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path_.c_str());
  path_.clear();
  return parse_gpu_samples(text.str());
}

GpuSampler::~GpuSampler() { stop(); }

}  // namespace perftrain::observe::bench
