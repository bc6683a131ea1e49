#include "observe/bench/environment.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "base/fs.h"
#include "observe/bench/subprocess.h"
#include "compat/compat.h"

namespace perftrain::observe::bench {

const char* const kNvidiaSmiFields =
    "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu,pstate";

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string first_line(const std::string& s) { return trim(s.substr(0, s.find('\n'))); }

// 13000 -> "13.0"; 12080 -> "12.8" (CUDA encodes major * 1000 + minor * 10).
std::string cuda_version_string(long v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// cuDNN 9 encodes major * 10000 + minor * 100 + patch: 91900 -> "9.19.0".
std::string cudnn_version_string(long v) {
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

std::string git_commit(const std::string& source_dir) {
  if (source_dir.empty() || !fs::exists(fs::join(source_dir, ".git"))) return "unknown";
  const std::string git = "git -C " + shell_quote(source_dir);
  auto head = run_command_capture(git + " rev-parse --short HEAD");
  if (!head.ok || first_line(head.out).empty()) return "unknown";
  std::string commit = first_line(head.out);
  auto status = run_command_capture(git + " status --porcelain --untracked-files=no");
  if (status.ok && !trim(status.out).empty()) commit += "-dirty";
  return commit;
}

GpuClocks query_nvidia_smi(const at::Device& device) {
  const std::string query = std::string("nvidia-smi --query-gpu=") + kNvidiaSmiFields + " --format=csv,noheader";
  auto r = run_command_capture(query + " --id=" + nvidia_smi_id(device));
  if (!r.ok) return GpuClocks{};
  return parse_nvidia_smi_line(first_line(r.out));
}

}  // namespace

std::string nvidia_smi_id(const at::Device& device) {
  if (!device.is_cuda()) return "";
  const int index = device.index() < 0 ? 0 : device.index();
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
  char bus[32];
  std::snprintf(bus, sizeof bus, "%08X:%02X:%02X.0", p->pciDomainID, p->pciBusID, p->pciDeviceID);
  return bus;
}

GpuClocks parse_nvidia_smi_line(const std::string& line) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    parts.push_back(trim(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  GpuClocks g;
  if (parts.size() != 9) return g;
  for (auto& v : parts)
    if (v.empty() || v.front() == '[') v = "n/a";  // [N/A], [Not Supported]
  g.name = parts[0];
  g.driver = parts[1];
  g.sm_clock = parts[2];
  g.sm_clock_max = parts[3];
  g.mem_clock = parts[4];
  g.mem_clock_max = parts[5];
  g.power_limit = parts[6];
  g.temperature = parts[7] == "n/a" ? parts[7] : parts[7] + " C";
  g.pstate = parts[8];
  return g;
}

Environment collect_environment(const at::Device& device, const std::string& source_dir,
                                const std::string& commit) {
  Environment e;
  e.device = compat::device_description(device);
  e.torch = compat::torch_version();
  e.source_dir = source_dir;
  e.commit = commit.empty() ? git_commit(source_dir) : commit;
  e.cpu_threads = std::to_string(at::get_num_threads());
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) e.hostname = host;
  char stamp[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
  e.timestamp = stamp;
  try {
    const auto& hooks = at::detail::getCUDAHooks();
    if (at::globalContext().hasCUDART()) e.cuda_runtime = cuda_version_string(hooks.versionCUDART());
    if (at::globalContext().hasCuDNN()) e.cudnn = cudnn_version_string(hooks.versionRuntimeCuDNN());
  } catch (const std::exception&) {
    // A libtorch without its CUDA part: the "n/a" defaults stand.
  }
  if (device.is_cuda()) {
    e.gpu_name = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) e.cuda_driver_api = cuda_version_string(driver);
    e.smi = query_nvidia_smi(device);
  }
  return e;
}

std::vector<std::pair<std::string, std::string>> environment_fields(const Environment& e) {
  return {
      {"device", e.device},
      {"gpu", e.gpu_name},
      {"driver", e.smi.driver},
      {"cuda_driver_api", e.cuda_driver_api},
      {"cuda_runtime", e.cuda_runtime},
      {"cudnn", e.cudnn},
      {"torch", e.torch},
      {"sm_clock", e.smi.sm_clock},
      {"sm_clock_max", e.smi.sm_clock_max},
      {"mem_clock", e.smi.mem_clock},
      {"mem_clock_max", e.smi.mem_clock_max},
      {"power_limit", e.smi.power_limit},
      {"temperature", e.smi.temperature},
      {"pstate", e.smi.pstate},
      {"hostname", e.hostname},
      {"cpu_threads", e.cpu_threads},
      {"commit", e.commit},
      {"timestamp", e.timestamp},
  };
}

std::string find_source_dir(const std::string& build_source_dir) {
  const auto has_bench = [](const std::string& dir) {
    return fs::is_regular_file(fs::join(dir, "bench/reference_dit.py"));
  };
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    const std::string above = fs::parent_path(fs::parent_path(exe));
    if (has_bench(above)) return above;
  }
  if (!build_source_dir.empty() && has_bench(build_source_dir)) return build_source_dir;
  char cwd[4096];
  return ::getcwd(cwd, sizeof cwd) != nullptr ? std::string(cwd) : ".";
}

}  // namespace perftrain::observe::bench
