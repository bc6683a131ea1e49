// What a benchmark number was measured on, so that two numbers can be
// compared honestly: the GPU and its clocks (a GPU held at a low clock or
// thermally throttled runs slower; nvidia-smi says so), the driver, the
// torch / CUDA / cuDNN versions, the host and the source commit. Every field
// that cannot be known here (no GPU, no nvidia-smi, not a git checkout) is
// "n/a" rather than missing, so reports always have the same shape.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace perftrain::observe::bench {

// One line of `nvidia-smi --query-gpu=<kNvidiaSmiFields> --format=csv,noheader`.
struct GpuClocks {
  std::string name = "n/a", driver = "n/a";
  std::string sm_clock = "n/a", sm_clock_max = "n/a";    // "1980 MHz"
  std::string mem_clock = "n/a", mem_clock_max = "n/a";  // "3201 MHz"
  std::string power_limit = "n/a", temperature = "n/a", pstate = "n/a";
};
extern const char* const kNvidiaSmiFields;
// Parses that line (values as nvidia-smi prints them, units kept); a line with
// the wrong number of fields gives all "n/a". "[N/A]" / "[Not Supported]" -> "n/a".
GpuClocks parse_nvidia_smi_line(const std::string& line);

struct Environment {
  std::string device;        // compat::device_description
  std::string gpu_name = "n/a";
  GpuClocks smi;             // from nvidia-smi, when it ran
  std::string cuda_runtime = "n/a", cuda_driver_api = "n/a", cudnn = "n/a";  // "13.0", "9.19.0"
  std::string torch;
  std::string hostname = "n/a", commit = "unknown", source_dir;
  std::string cpu_threads, timestamp;  // ISO 8601, local time
};

// How nvidia-smi names the GPU of `device` (`--id=`): its PCI address, since
// CUDA's device numbering need not be nvidia-smi's. "" for a CPU device.
std::string nvidia_smi_id(const at::Device& device);

// Collects it for `device`. source_dir: the repository checkout, for the
// commit: `commit` when it is not empty (the build's, base/build_info.h),
// else `git rev-parse --short HEAD` there, with "-dirty" when tracked files
// changed; else "unknown".
Environment collect_environment(const at::Device& device, const std::string& source_dir,
                                const std::string& commit = "");

// (key, value) pairs in a fixed order: the one list the JSON and Markdown
// writers both print.
std::vector<std::pair<std::string, std::string>> environment_fields(const Environment& env);

// Where the repository is: the folder above the one holding this program
// (build/perftrain -> .) when it has bench/reference_dit.py, else
// build_source_dir (the checkout the build came from, base/build_info.h) when
// it has, else the current directory.
std::string find_source_dir(const std::string& build_source_dir);

}  // namespace perftrain::observe::bench
