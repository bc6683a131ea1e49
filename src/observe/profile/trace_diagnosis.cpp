#include "observe/profile/trace_diagnosis.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "observe/bench/gpu_sampler.h"
#include "observe/profile/kernel_breakdown.h"

namespace perftrain::observe::profile {
namespace {

using nlohmann::json;

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

double number_or(const std::map<std::string, std::string>& m, const char* key, double fallback) {
  const auto it = m.find(key);
  if (it == m.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return fallback;
  }
}

// The 16-bit type the step's kernels and ops use: "bf16", "fp16", or "" when
// none is seen (the products run in fp32 or TF32).
std::string precision_of(const Timeline& t) {
  bool bf16 = false, fp16 = false;
  for (const auto& e : t.events) {
    if (e.kind == EventKind::kKernel) {
      const std::string n = lower(e.name);
      if (has(n, "bf16") || has(n, "bfloat16")) bf16 = true;
      else if (has(n, "fp16") || has(n, "f16") || has(n, "hgemm") || has(n, "half")) fp16 = true;
    }
    if (e.kind == EventKind::kCpuOp) {
      if (has(e.input_types, "BFloat16")) bf16 = true;
      if (has(e.input_types, "Half")) fp16 = true;
    }
  }
  return bf16 ? "bf16" : fp16 ? "fp16" : "";
}

bool compiled(const Timeline& t) {
  for (const auto& e : t.events) {
    if (e.kind == EventKind::kKernel && e.name.rfind("triton_", 0) == 0) return true;
    if (e.kind == EventKind::kCpuOp && e.name == "CompiledFunction") return true;
    if (e.kind == EventKind::kScope && e.name.rfind("Torch-Compiled Region", 0) == 0) return true;
  }
  return false;
}

// perftrain's step marks its phases with perftrain:: scopes (also with
// --profile-scopes-only); a "perftrain" object alone may come from
// perftrain.profile around any program's step.
bool ours(const Timeline& t) {
  for (const auto& e : t.events)
    if (e.kind == EventKind::kScope && e.name.rfind("perftrain::", 0) == 0) return true;
  return false;
}

MeasuredStep measured_of(const Timeline& t, int steps) {
  MeasuredStep m;
  m.unprofiled_ms = std::max(0.0, number_or(t.perftrain, kUnprofiledMsKey, 0));
  m.unprofiled_steps = static_cast<int>(number_or(t.perftrain, kUnprofiledStepsKey, 0));
  m.profiled_ms = std::max(0.0, number_or(t.perftrain, kProfiledMsKey, 0));
  m.profiled_steps = static_cast<int>(number_or(t.perftrain, kProfiledStepsKey, steps));
  if (m.unprofiled_ms > 0) m.unprofiled_what = "timed before the profiler started";
  m.unknown_note = ours(t) ? "the trace does not hold the steps timed around it: profile.md or window-<n>.md has "
                             "the breakdown against them"
                           : "a torch.profiler trace holds no step timed without the profiler; perftrain.profile "
                             "records one";
  return m;
}

std::string program_name(const RunFacts& f) { return f.program == Program::kPerftrain ? "perftrain" : "pytorch"; }

std::string header_markdown(const std::string& path, const Timeline& t, const RunFacts& f) {
  std::ostringstream s;
  s << "# perftrain diagnose: " << path << "\n\n";
  if (f.program == Program::kPerftrain) {
    s << "- program: perftrain's own step";
    for (const char* k : {"model", "batch", "step_mode"})
      if (t.perftrain.count(k)) s << "; " << k << " " << t.perftrain.at(k);
    s << " (advice in its [speed] and data keys)\n";
  } else {
    s << "- program: a PyTorch program (advice in PyTorch's terms)" << (f.compiled ? "; torch.compile's kernels in it" : "")
      << "\n";
  }
  if (t.devices.empty()) {
    s << "- device: none in the trace (a CPU-only profile)\n";
  } else {
    const DeviceInfo& d = t.devices.front();
    char buf[256];
    std::snprintf(buf, sizeof buf, "- device: %s (%d SMs, %.1f GiB, compute %d.%d)", d.name.c_str(), d.sms,
                  d.memory_gib, d.compute_major, d.compute_minor);
    s << buf << (t.devices.size() > 1 ? "; " + std::to_string(t.devices.size()) + " devices listed" : "") << "\n";
  }
  s << "- precision: "
    << (f.precision.empty() ? "no 16-bit kernels or ops: the products run in fp32 or TF32" : f.precision) << "\n";
  int ranges = 0;
  for (const auto& e : t.events) ranges += e.kind == EventKind::kScope && e.name.rfind("ProfilerStep#", 0) == 0;
  s << "- steps: "
    << (ranges > 0 ? std::to_string(ranges) + " (ProfilerStep ranges)"
                   : "one (no ProfilerStep ranges: the whole trace is one step)")
    << "\n";
  s << "- GPU clock and power: "
    << (f.gpu.count > 0 ? bench::describe(f.gpu)
                        : "not in the trace (Kineto records none; the power-capped rule needs nvidia-smi samples, "
                          "which perftrain.profile adds)")
    << "\n\n";
  return s.str();
}

}  // namespace

RunFacts trace_facts(const Timeline& t, const StepAnalysis& a) {
  RunFacts f;
  f.program = ours(t) ? Program::kPerftrain : Program::kPyTorch;
  const auto p = t.perftrain.find("precision");
  f.precision = p != t.perftrain.end() ? p->second : precision_of(t);
  f.compiled = compiled(t);
  f.graph = a.captured;
  for (const auto& e : t.events)
    if (e.kind == EventKind::kKernel && kernel_kind(e.name) == "fused norm / residual (perftrain)") {
      f.fused_kernels = true;
      break;
    }
  if (!t.devices.empty() && t.devices.front().memory_gib > 0) f.memory_total_gib = t.devices.front().memory_gib;
  const auto samples = t.perftrain.find(kGpuSamplesKey);
  if (samples != t.perftrain.end()) f.gpu = bench::parse_gpu_samples(samples->second);
  f.measured = measured_of(t, a.steps);
  return f;
}

std::string report_json(const std::string& path, const Timeline& t, const WindowReport& r, const RunFacts& f) {
  const StepAnalysis& a = r.analysis;
  json j;
  j["trace"] = path;
  j["program"] = program_name(f);
  j["precision"] = f.precision;
  j["compiled"] = f.compiled;
  if (!t.devices.empty())
    j["device"] = {{"name", t.devices.front().name},
                   {"sms", t.devices.front().sms},
                   {"memory_gib", t.devices.front().memory_gib}};
  j["steps"] = a.steps;
  j["step_ms"] = a.step_ms;
  j["captured"] = a.captured;
  j["cpu_only"] = a.cpu_only;
  json phases = json::object(), kinds = json::object();
  for (const auto& p : a.busy_by_phase) phases[p.phase] = p.ms;
  for (const auto& k : a.busy_by_kind) kinds[k.phase] = k.ms;
  j["breakdown_ms"] = {{"busy_by_phase", phases},     {"gpu_busy", a.gpu_busy_ms},
                       {"idle_waiting_for_data", a.idle_data_ms}, {"idle_between_kernels", a.idle_other_ms},
                       {"host_data_wait", a.data_wait_ms},        {"blocking_h2d_copies", a.blocking_h2d_ms}};
  j["gpu_busy_by_kind_ms"] = kinds;
  j["kernels_per_step"] = a.kernels_per_step;
  j["median_kernel_us"] = a.median_kernel_us;
  j["launch_cpu_ms"] = a.launch_cpu_ms;
  j["syncs_per_step"] = a.syncs_per_step;
  json syncs = json::array();
  for (const auto& s : a.syncs) syncs.push_back({{"call", s.call}, {"op", s.op}, {"phase", s.phase}, {"count", s.count}});
  j["syncs"] = syncs;
  j["h2d_bytes_per_step"] = a.h2d_bytes;
  j["d2h_bytes_per_step"] = a.d2h_bytes;
  json findings = json::array();
  for (const auto& x : r.findings)
    findings.push_back({{"id", x.id}, {"title", x.title}, {"evidence", x.evidence}, {"advice", x.advice},
                        {"weight", x.weight}});
  j["findings"] = findings;
  return j.dump(2) + "\n";
}

std::string diagnose_trace(const std::string& path, const DiagnoseOptions& o) {
  const Timeline t = load_trace(path);
  if (t.events.empty())
    throw RuntimeError("trace " + path + " holds no profiler events (no cpu_op, user_annotation, cuda_runtime, "
                       "kernel or gpu_memcpy events in traceEvents)");
  WindowReportOptions wo;
  wo.group_by = o.group_by;
  wo.top = o.top;
  const StepAnalysis a = analyze(t);
  const RunFacts f = trace_facts(t, a);
  const WindowReport r = report_window(t, f, wo);
  if (o.json) return report_json(path, t, r, f);
  return header_markdown(path, t, f) + r.markdown;
}

}  // namespace perftrain::observe::profile
