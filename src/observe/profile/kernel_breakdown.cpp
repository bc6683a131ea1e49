#include "observe/profile/kernel_breakdown.h"

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "compat/compat.h"

namespace perftrain::observe {
namespace {

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::vector<KernelTime> sorted(const std::map<std::string, KernelTime>& m, int steps, size_t n) {
  std::vector<KernelTime> v;
  for (const auto& [k, t] : m) v.push_back({k, t.ms / steps, t.count / steps});
  std::sort(v.begin(), v.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  if (v.size() > n) v.resize(n);
  return v;
}

// A scope's range as CUPTI draws it on the GPU's timeline (PERFTRAIN_SCOPE,
// e.g. "perftrain::graph_replay" around a whole captured step): it spans the
// kernels, which are counted themselves, so it is no GPU time of its own.
bool is_scope_on_the_gpu(const torch::autograd::profiler::KinetoEvent& ev) {
  return ev.activityType() == static_cast<uint8_t>(libkineto::ActivityType::GPU_USER_ANNOTATION);
}

}  // namespace

std::string kernel_kind(const std::string& raw) {
  const std::string n = lower(raw);
  if (has(n, "memcpy") || has(n, "memset")) return "copies and memsets";
  if (has(n, "adamw") || has(n, "multi_tensor") || has(n, "foreach") || has(n, "lerp"))
    return "optimizer, EMA, clipping";
  if (has(n, "flash") || has(n, "fmha") || has(n, "attention") || has(n, "cudnn")) return "attention";
  // train.precision = fp8: our casts with their fused amax (kernels/fp8_cast)
  // and the once-a-step scaling update (kernels/fp8_scaling), apart from the
  // fp8 products themselves (matrix products), so that their cost shows.
  if (has(n, "fp8_cast") || has(n, "fp8_scaling")) return "fp8 casts and scaling";
  if (has(n, "gemm") || has(n, "nvjet") || has(n, "cutlass") || has(n, "xmma") || has(n, "matmul"))
    return "matrix products";
  // Our row kernels: the row norms (kernels/row_norm.cuh), the gated residual, their reduce kernels.
  const bool ours = has(n, "perftrain::kernels");
  if (has(n, "adaln") || has(n, "gated_residual") || (ours && (has(n, "row_norm") || has(n, "gated_"))))
    return "fused norm / residual (perftrain)";
  if (has(n, "layer_norm") || has(n, "reduce") || has(n, "norm")) return "other norms and reductions";
  return "other elementwise";
}

KernelBreakdown profile_kernels(const std::function<void()>& run_steps, int steps, const std::string& trace_path,
                                size_t top_n) {
  namespace prof = torch::profiler::impl;
  KernelBreakdown out;
  out.steps = steps;
  const std::set<prof::ActivityType> activities = {prof::ActivityType::CPU, prof::ActivityType::CUDA};
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
  try {
    prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    run_steps();
    compat::synchronize(at::Device(at::kCUDA, 0));
    result = torch::autograd::profiler::disableProfiler();
  } catch (const std::exception& e) {
    out.error = compat::error_message(e);
    return out;
  }
  std::map<std::string, KernelTime> by_kind, by_name;
  for (const auto& ev : result->events()) {
    if (ev.deviceType() != c10::DeviceType::CUDA || is_scope_on_the_gpu(ev)) continue;
    const double ms = ev.durationNs() / 1e6;
    const std::string name = ev.name();
    auto& k = by_kind[kernel_kind(name)];
    k.ms += ms, k.count += 1;
    auto& t = by_name[name.substr(0, 120)];
    t.ms += ms, t.count += 1;
    out.gpu_ms += ms;
  }
  out.gpu_ms /= std::max(1, steps);
  out.kinds = sorted(by_kind, std::max(1, steps), 100);
  out.top = sorted(by_name, std::max(1, steps), top_n);
  if (!trace_path.empty()) result->save(trace_path);
  if (out.kinds.empty()) out.error = "the profiler saw no CUDA activity (CUPTI unavailable?)";
  return out;
}

std::string to_markdown(const KernelBreakdown& b) {
  std::ostringstream s;
  char buf[256];
  if (!b.error.empty()) return "profile: " + b.error + "\n";
  std::snprintf(buf, sizeof buf, "GPU time per step: %.2f ms (mean of %d steps)\n\n", b.gpu_ms, b.steps);
  s << buf << "| kind | ms/step | share | launches/step |\n|---|---|---|---|\n";
  for (const auto& k : b.kinds) {
    std::snprintf(buf, sizeof buf, "| %s | %.3f | %.1f%% | %lld |\n", k.name.c_str(), k.ms,
                  b.gpu_ms > 0 ? 100 * k.ms / b.gpu_ms : 0.0, static_cast<long long>(k.count));
    s << buf;
  }
  s << "\n| kernel | ms/step | launches/step |\n|---|---|---|\n";
  for (const auto& k : b.top) {
    std::string name = k.name;
    for (char& c : name)
      if (c == '|') c = '/';
    std::snprintf(buf, sizeof buf, "| `%s` | %.3f | %lld |\n", name.c_str(), k.ms, static_cast<long long>(k.count));
    s << buf;
  }
  return s.str();
}

}  // namespace perftrain::observe
