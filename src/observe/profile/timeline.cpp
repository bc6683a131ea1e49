#include "observe/profile/timeline.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "observe/profile/kernel_breakdown.h"

namespace perftrain::observe::profile {
namespace {

using nlohmann::json;

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

int64_t id_of(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number()) return static_cast<int64_t>(v.get<double>());
  if (v.is_string()) return static_cast<int64_t>(std::hash<std::string>{}(v.get<std::string>()) >> 1);
  return 0;
}

double num(const json& v, double fallback = 0) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    try {
      return std::stod(v.get<std::string>());
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

EventKind kind_of(const std::string& cat, const std::string& name) {
  if (cat == "cpu_op") return EventKind::kCpuOp;
  if (cat == "user_annotation") return EventKind::kScope;
  if (cat == "cuda_runtime" || cat == "cuda_driver") return EventKind::kRuntime;
  if (cat == "kernel") return EventKind::kKernel;
  if (cat == "gpu_memcpy") return EventKind::kMemcpy;
  if (cat == "gpu_memset") return EventKind::kMemset;
  if (name == "[memory]") return EventKind::kMemory;
  return EventKind::kOther;
}

bool is_gpu(const Event& e) {
  return e.kind == EventKind::kKernel || e.kind == EventKind::kMemcpy || e.kind == EventKind::kMemset;
}

bool is_launch_call(const std::string& n) {
  static const std::set<std::string> calls = {
      "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
      "cudaMemcpyAsync",  "cudaMemsetAsync",     "cudaGraphLaunch", "cuGraphLaunch",   "cudaMemcpy2DAsync"};
  return calls.count(n) > 0;
}

bool is_sync_call(const std::string& n) {
  static const std::set<std::string> calls = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                              "cudaMemcpy",            "cuStreamSynchronize",   "cuCtxSynchronize",
                                              "cuEventSynchronize",    "cudaMemcpy2D",          "cuMemcpyDtoH_v2"};
  return calls.count(n) > 0;
}

// fp32 inputs (TF32 or plain fp32 products): "s" kernels without a 16- or
// 8-bit type in the name ("ampere_bf16_s16816gemm_bf16..." is bf16 with fp32
// accumulation).
bool is_fp32_matrix_kernel(const std::string& raw) {
  const std::string n = lower(raw);
  if (has(n, "bf16") || has(n, "f16") || has(n, "fp16") || has(n, "hgemm") || has(n, "e4m3") || has(n, "e5m2") ||
      has(n, "fp8") || has(n, "i8"))
    return false;
  return has(n, "sgemm") || has(n, "tf32") || has(n, "s1688") || has(n, "s16816") || has(n, "nvjet_sss") ||
         has(n, "nvjet_tst") || has(n, "f32f32");
}

// The products themselves: aten::linear and aten::matmul are wrappers whose
// recorded inputs are their caller's (float under autocast, which casts
// inside them to the product's bf16).
bool is_matrix_op(const std::string& n) {
  static const std::set<std::string> ops = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                                            "aten::_addmm_activation"};
  return ops.count(n) > 0;
}

// Per host thread, each event's innermost enclosing event (index) or -1.
std::vector<int> nest_host_events(const Timeline& t) {
  std::vector<int> parent(t.events.size(), -1);
  std::map<int64_t, std::vector<int>> by_thread;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const auto k = t.events[i].kind;
    if (k == EventKind::kCpuOp || k == EventKind::kScope || k == EventKind::kRuntime)
      by_thread[t.events[i].tid].push_back(static_cast<int>(i));
  }
  for (auto& [tid, idx] : by_thread) {
    std::sort(idx.begin(), idx.end(), [&](int a, int b) {
      const Event &x = t.events[a], &y = t.events[b];
      return x.ts != y.ts ? x.ts < y.ts : x.dur > y.dur;  // the outer one first
    });
    std::vector<int> stack;
    for (int i : idx) {
      const Event& e = t.events[i];
      // The top contains e when it ends no earlier (trace times are rounded to ns).
      while (!stack.empty() && t.events[stack.back()].end() < e.end() - 1e-3) stack.pop_back();
      if (!stack.empty()) parent[i] = stack.back();
      stack.push_back(i);
    }
  }
  return parent;
}

struct Interval {
  double start, end;
  std::string phase;
};

// The phase of a host event: its scope's or op's; "" for none.
std::string phase_of_event(const Event& e) {
  if (e.kind == EventKind::kScope) return phase_of_scope(e.name);
  if (e.kind == EventKind::kCpuOp) return phase_of_op(e.name);
  return "";
}

// The phase scopes (and phase-marking ops) of all threads, to look a time up
// in (the innermost wins).
class PhaseIndex {
 public:
  explicit PhaseIndex(const Timeline& t) {
    bool ours = false;
    for (const auto& e : t.events) {
      if (e.kind == EventKind::kScope && starts_with(e.name, "perftrain::")) ours = true;
      const std::string p = phase_of_event(e);
      if (!p.empty()) iv_.push_back({e.ts, e.end(), p});
    }
    std::sort(iv_.begin(), iv_.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    // perftrain marks every phase of its step; another program's forward and
    // loss are not marked.
    unmarked_ = ours ? "outside the step scopes" : "forward, loss and the rest (not marked)";
  }
  // The phase at ts, or the label of time outside every phase.
  std::string label(double ts) const {
    std::string p = at(ts);
    return p.empty() ? unmarked_ : p;
  }
  const std::string& unmarked() const { return unmarked_; }
  // "" outside every phase scope.
  std::string at(double ts) const {
    const Interval* best = nullptr;
    auto it = std::upper_bound(iv_.begin(), iv_.end(), ts, [](double v, const Interval& i) { return v < i.start; });
    for (auto j = it; j != iv_.begin();) {
      --j;
      if (j->end >= ts && (best == nullptr || j->end - j->start < best->end - best->start)) best = &*j;
    }
    return best ? best->phase : "";
  }

 private:
  std::vector<Interval> iv_;
  std::string unmarked_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Total length of [a, b] covered by the sorted, disjoint intervals.
double overlap(double a, double b, const std::vector<std::pair<double, double>>& iv) {
  double s = 0;
  for (const auto& [x, y] : iv) {
    const double lo = std::max(a, x), hi = std::min(b, y);
    if (hi > lo) s += hi - lo;
  }
  return s;
}

std::string read_file_maybe_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) throw RuntimeError("cannot open trace " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = Z_OK;
  gzerror(f, &err);
  gzclose(f);
  // A gzip stream that stops early reads as its bytes so far, with Z_BUF_ERROR.
  if (err == Z_BUF_ERROR) throw RuntimeError("trace " + path + " is cut short (its gzip stream ends early)");
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw RuntimeError("cannot read trace " + path + " (corrupt gzip?)");
  return out;
}

std::string launch_phase(const Event& gpu, const std::unordered_map<int64_t, int>& launch_of, const Timeline& t,
                         const PhaseIndex& phases) {
  auto it = gpu.correlation >= 0 ? launch_of.find(gpu.correlation) : launch_of.end();
  const double ts = it != launch_of.end() ? t.events[it->second].ts : gpu.ts;
  return phases.at(ts);
}

// What the trace says besides its events: the devices (Kineto's
// deviceProperties) and our "perftrain" object (strings, or any JSON value
// as its text).
void read_header(const json& j, Timeline& t) {
  if (!j.is_object()) return;
  if (j.contains("deviceProperties") && j["deviceProperties"].is_array())
    for (const auto& d : j["deviceProperties"]) {
      if (!d.is_object()) continue;
      DeviceInfo info;
      info.id = d.contains("id") ? id_of(d["id"]) : 0;
      info.name = d.contains("name") && d["name"].is_string() ? d["name"].get<std::string>() : "";
      info.memory_gib = num(d.value("totalGlobalMem", json(0))) / (1ull << 30);
      info.compute_major = static_cast<int>(num(d.value("computeMajor", json(0))));
      info.compute_minor = static_cast<int>(num(d.value("computeMinor", json(0))));
      info.sms = static_cast<int>(num(d.value("numSms", json(0))));
      t.devices.push_back(info);
    }
  if (j.contains("perftrain") && j["perftrain"].is_object())
    for (const auto& [k, v] : j["perftrain"].items()) t.perftrain[k] = v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

Timeline parse_trace(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // A trace whose writer died mid-way ends inside its event list.
    const bool cut = e.byte >= text.size();
    throw RuntimeError(origin + " is not JSON" + (cut ? " (it ends mid-way: a trace cut short?)" : "") + ": " +
                       e.what());
  } catch (const std::exception& e) {
    throw RuntimeError(origin + " is not JSON: " + e.what());
  }
  const json* events = nullptr;
  if (j.is_object() && j.contains("traceEvents")) events = &j["traceEvents"];
  else if (j.is_array()) events = &j;
  if (events == nullptr || !events->is_array()) throw RuntimeError(origin + " has no traceEvents");
  Timeline t;
  t.events.reserve(events->size());
  for (const auto& e : *events) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    if (ph != "X" && ph != "i" && ph != "I") continue;
    Event ev;
    ev.name = e.value("name", "");
    ev.kind = kind_of(e.value("cat", ""), ev.name);
    if (ev.kind == EventKind::kOther) continue;
    ev.ts = num(e.value("ts", json(0)));
    ev.dur = num(e.value("dur", json(0)));
    ev.tid = e.contains("tid") ? id_of(e["tid"]) : 0;
    if (e.contains("args") && e["args"].is_object()) {
      const json& a = e["args"];
      if (a.contains("correlation")) ev.correlation = id_of(a["correlation"]);
      if (a.contains("bytes")) ev.bytes = num(a["bytes"]);
      if (a.contains("Total Allocated")) ev.total_allocated = num(a["Total Allocated"], -1);
      if (a.contains("Total Reserved")) ev.total_reserved = num(a["Total Reserved"], -1);
      if (a.contains("Input type") && a["Input type"].is_array()) {
        for (const auto& s : a["Input type"]) {
          if (!s.is_string() || s.get<std::string>().empty()) continue;
          if (!ev.input_types.empty()) ev.input_types += ", ";
          ev.input_types += s.get<std::string>();
        }
      }
    }
    t.events.push_back(std::move(ev));
  }
  read_header(j, t);
  return t;
}

Timeline load_trace(const std::string& path) { return parse_trace(read_file_maybe_gz(path), path); }

namespace {

std::string phase_of_perftrain_scope(const std::string& n) {
  const std::string s = n.substr(11);
  if (s == "data_wait") return "data wait";
  if (s == "h2d") return "host-to-device copy";
  if (s == "forward" || starts_with(s, "block ") || starts_with(s, "loop ") || s == "final_layer") return "forward";
  if (s == "loss") return "loss";
  if (s == "backward") return "backward";
  if (s == "fp8_scaling") return "fp8 scaling update";
  if (s == "clip") return "clipping";
  if (s == "optimizer") return "optimizer";
  if (s == "ema") return "EMA";
  if (s == "graph_replay") return "captured step (one graph launch)";
  if (s == "checkpoint") return "checkpoint";
  if (s == "sampling") return "sampling";
  if (s == "log_window") return "log window (loss read-back)";
  if (s == "step") return "step (other)";
  return "";
}

// torch's own marks, in any program: the DataLoader's iterator
// ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") and the
// optimizer's step and zero_grad ("Optimizer.step#AdamW.step").
std::string phase_of_torch_scope(const std::string& n) {
  if (starts_with(n, "enumerate(DataLoader)")) return "data wait";
  if (starts_with(n, "Optimizer.step#") || starts_with(n, "Optimizer.zero_grad#")) return "optimizer";
  return "";
}

}  // namespace

std::string phase_of_op(const std::string& n) {
  if (starts_with(n, "autograd::engine::evaluate_function: ") || n == "CompiledFunctionBackward") return "backward";
  if (n == "CompiledFunction") return "forward";
  return "";
}

std::string phase_of_scope(const std::string& n) {
  return starts_with(n, "perftrain::") ? phase_of_perftrain_scope(n) : phase_of_torch_scope(n);
}

const std::vector<std::string>& phase_order() {
  static const std::vector<std::string> order = {
      "data wait", "host-to-device copy", "captured step (one graph launch)",
      "forward, loss and the rest (not marked)", "forward", "loss", "backward", "fp8 scaling update",
      "clipping", "optimizer", "EMA", "log window (loss read-back)", "checkpoint", "sampling", "step (other)",
      "outside the step scopes"};
  return order;
}

namespace {

// The profiled window: the ProfilerStep scopes (one per step), to the last GPU
// activity; without step scopes, every host and GPU event.
struct Window {
  std::vector<std::pair<double, double>> steps;
  double w0 = 0, w1 = 0;
  std::vector<const Event*> gpu;  // the GPU activity in it
  bool in_window(double ts) const { return ts >= w0 && ts <= w1; }
  bool in_steps(double ts) const {
    if (steps.empty()) return in_window(ts);
    for (const auto& [s, e] : steps)
      if (ts >= s && ts <= e) return true;
    return false;
  }
};

Window find_window(const Timeline& t) {
  Window w;
  for (const auto& e : t.events)
    if (e.kind == EventKind::kScope && starts_with(e.name, "ProfilerStep#")) w.steps.push_back({e.ts, e.end()});
  std::sort(w.steps.begin(), w.steps.end());
  bool any = false;
  auto extend = [&](double s, double e) {
    if (!any) w.w0 = s, w.w1 = e, any = true;
    w.w0 = std::min(w.w0, s), w.w1 = std::max(w.w1, e);
  };
  for (const auto& [s, e] : w.steps) extend(s, e);
  if (w.steps.empty())
    for (const auto& e : t.events)
      if (e.kind != EventKind::kMemory) extend(e.ts, e.end());
  for (const auto& e : t.events)
    if (is_gpu(e) && e.end() > w.w0 && (w.steps.empty() || e.ts >= w.w0)) w.gpu.push_back(&e);
  for (const Event* g : w.gpu) w.w1 = std::max(w.w1, g->end());
  return w;
}

// What the host's runtime calls say: the launch calls' CPU time, graph
// launches, device allocations and frees (into a), the runtime event of each
// correlation id and the data waits.
struct HostRuntime {
  std::unordered_map<int64_t, int> launch_of;  // correlation -> runtime event
  std::vector<std::pair<double, double>> data_wait;
};

// A copy from pageable host memory: the host waits in the copy call while
// the driver stages it ("Memcpy HtoD (Pageable -> Device)").
bool is_pageable_h2d(const Event& e) {
  return e.kind == EventKind::kMemcpy && has(e.name, "HtoD") && has(e.name, "Pageable");
}

HostRuntime scan_runtime(const Timeline& t, const Window& w, double per, StepAnalysis& a) {
  HostRuntime h;
  std::set<int64_t> pageable;  // correlation ids of pageable host-to-device copies
  for (const auto& e : t.events)
    if (is_pageable_h2d(e) && e.correlation >= 0) pageable.insert(e.correlation);
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (e.kind == EventKind::kRuntime && e.correlation >= 0) h.launch_of[e.correlation] = static_cast<int>(i);
    const bool waits_for_data = e.kind == EventKind::kScope && phase_of_scope(e.name) == "data wait";
    const bool blocking_copy = e.kind == EventKind::kRuntime && pageable.count(e.correlation) > 0;
    if ((waits_for_data || blocking_copy) && w.in_window(e.ts)) {
      h.data_wait.push_back({e.ts, e.end()});
      a.data_wait_ms += e.dur * per;
      if (blocking_copy) a.blocking_h2d_ms += e.dur * per;
    }
    if (e.kind == EventKind::kRuntime && w.in_window(e.ts)) {
      if (is_launch_call(e.name)) a.launch_cpu_ms += e.dur * per;
      if (e.name == "cudaGraphLaunch" || e.name == "cuGraphLaunch") ++a.graph_launches;
      if (e.name == "cudaMalloc" || e.name == "cuMemAlloc_v2" || e.name == "cuMemCreate") ++a.device_mallocs;
      if (e.name == "cudaFree" || e.name == "cuMemFree_v2" || e.name == "cuMemRelease") ++a.device_frees;
    }
  }
  a.captured = a.graph_launches > 0;
  std::sort(h.data_wait.begin(), h.data_wait.end());
  return h;
}

// Busy time (us in the window) by phase and by kind of work, and the idle time.
struct BusyTime {
  std::map<std::string, double> by_phase, by_kind;
  double idle = 0, idle_data = 0;
};

// GPU busy time: each moment once, to the activity that started first; the
// kernels' lengths, the copies' bytes and the fp32 matrix time go into a.
BusyTime gpu_busy(const Timeline& t, const Window& w, const PhaseIndex& phases, const HostRuntime& h, double per,
                  StepAnalysis& a, std::vector<double>& kernel_us) {
  BusyTime b;
  double covered = w.w0;
  for (const Event* g : w.gpu) {
    if (g->ts > covered) {
      b.idle += g->ts - covered;
      // Idle for want of data: the host was waiting for a batch, and the work
      // that ends the gap was launched only after that wait (not a gap
      // between kernels queued long before).
      auto launch = g->correlation >= 0 ? h.launch_of.find(g->correlation) : h.launch_of.end();
      const double launched = launch != h.launch_of.end() ? t.events[launch->second].ts : g->ts;
      std::vector<std::pair<double, double>> waits;
      for (const auto& d : h.data_wait)
        if (d.second <= launched + 1e-3) waits.push_back(d);
      b.idle_data += overlap(covered, g->ts, waits);
    }
    const double from = std::max(g->ts, covered), to = std::min(g->end(), w.w1);
    const std::string kind = g->kind == EventKind::kKernel ? kernel_kind(g->name) : "copies and memsets";
    if (to > from) {
      std::string p = launch_phase(*g, h.launch_of, t, phases);
      // An unmarked program's batch copy is still a host-to-device copy.
      if (p.empty()) p = g->kind == EventKind::kMemcpy && has(g->name, "HtoD") ? "host-to-device copy" : phases.unmarked();
      b.by_phase[p] += to - from;
      b.by_kind[kind] += to - from;
      if (g->kind == EventKind::kKernel && kind == "matrix products" && is_fp32_matrix_kernel(g->name))
        a.fp32_matrix_ms += (to - from) * per;
    }
    covered = std::max(covered, g->end());
    if (g->kind == EventKind::kKernel) kernel_us.push_back(g->dur);
    if (g->kind == EventKind::kMemcpy) {
      const std::string n = lower(g->name);
      if (has(n, "htod")) a.h2d_bytes += g->bytes / a.steps;
      if (has(n, "dtoh")) a.d2h_bytes += g->bytes / a.steps;
    }
  }
  if (w.w1 > covered) {
    b.idle += w.w1 - covered;
    b.idle_data += overlap(covered, w.w1, h.data_wait);
  }
  return b;
}

// No device activity (a CPU run): the window split by the host's innermost phase.
BusyTime host_busy(const Timeline& t, const Window& w, const PhaseIndex& phases) {
  BusyTime b;
  std::vector<double> cuts = {w.w0, w.w1};
  for (const auto& e : t.events)
    if (!phase_of_event(e).empty())
      for (double c : {e.ts, e.end()})
        if (c > w.w0 && c < w.w1) cuts.push_back(c);
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    b.by_phase[phases.label(0.5 * (cuts[i] + cuts[i + 1]))] += cuts[i + 1] - cuts[i];
  }
  return b;
}

// The busy time into a, per step: by phase (in phase order), by kind (largest
// first, and the matrix, attention, copy and elementwise totals), and idle.
void record_busy(const BusyTime& b, double per, StepAnalysis& a) {
  for (const auto& p : phase_order()) {
    const auto it = b.by_phase.find(p);
    if (it != b.by_phase.end()) a.busy_by_phase.push_back({p, it->second * per});
  }
  for (const auto& [k, v] : b.by_kind) {
    a.busy_by_kind.push_back({k, v * per});
    if (k == "matrix products") a.matrix_ms = v * per;
    else if (k == "attention") a.attention_ms = v * per;
    else if (k == "copies and memsets") a.copy_ms = v * per;
    else a.elementwise_ms += v * per;
  }
  std::sort(a.busy_by_kind.begin(), a.busy_by_kind.end(),
            [](const PhaseTime& x, const PhaseTime& y) { return x.ms > y.ms; });
  for (const auto& p : a.busy_by_phase) a.gpu_busy_ms += p.ms;  // (host busy when cpu_only)
  a.idle_data_ms = b.idle_data * per;
  a.idle_other_ms = (b.idle - b.idle_data) * per;
}

// Host syncs inside the steps, with the op around them; the ops per step and
// the matrix ops on float inputs.
void find_syncs(const Timeline& t, const Window& w, const PhaseIndex& phases, StepAnalysis& a) {
  const std::vector<int> parent = nest_host_events(t);
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> syncs;
  int64_t n_syncs = 0;
  int64_t n_ops = 0;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (e.kind == EventKind::kCpuOp && w.in_steps(e.ts)) ++n_ops;
    if (e.kind == EventKind::kCpuOp && is_matrix_op(e.name) && w.in_window(e.ts) &&
        starts_with(e.input_types, "float"))
      ++a.fp32_matrix_ops;
    if (e.kind != EventKind::kRuntime || !is_sync_call(e.name) || !w.in_steps(e.ts)) continue;
    std::string op;
    for (int p = parent[i]; p >= 0; p = parent[p])
      if (t.events[p].kind == EventKind::kCpuOp) {
        op = t.events[p].name;
        break;
      }
    syncs[{e.name, op, phases.label(e.ts)}] += 1;
    ++n_syncs;
  }
  for (const auto& [k, n] : syncs) a.syncs.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), n});
  std::sort(a.syncs.begin(), a.syncs.end(), [](const SyncFinding& x, const SyncFinding& y) { return x.count > y.count; });
  a.syncs_per_step = static_cast<double>(n_syncs) / a.steps;
  a.ops_per_step = static_cast<double>(n_ops) / a.steps;
}

// Peak memory per phase, from the allocator's [memory] events.
void memory_by_phase(const Timeline& t, const Window& w, const PhaseIndex& phases, StepAnalysis& a) {
  std::map<std::string, PhaseMemory> mem;
  for (const auto& e : t.events) {
    if (e.kind != EventKind::kMemory || e.total_allocated < 0 || !w.in_window(e.ts)) continue;
    const std::string p = phases.label(e.ts);
    auto& m = mem[p];
    m.phase = p;
    m.peak_allocated_gib = std::max(m.peak_allocated_gib, e.total_allocated / (1ull << 30));
    m.peak_reserved_gib = std::max(m.peak_reserved_gib, std::max(0.0, e.total_reserved) / (1ull << 30));
  }
  for (const auto& p : phase_order())
    if (mem.count(p)) a.memory.push_back(mem[p]);
}

}  // namespace

StepAnalysis analyze(const Timeline& t) {
  StepAnalysis a;
  const PhaseIndex phases(t);
  Window w = find_window(t);
  a.steps = std::max<int>(1, static_cast<int>(w.steps.size()));
  a.window_ms = (w.w1 - w.w0) / 1e3;
  a.step_ms = a.window_ms / a.steps;
  const double per = 1.0 / a.steps / 1e3;  // us in the window -> ms per step
  const HostRuntime host = scan_runtime(t, w, per, a);
  std::sort(w.gpu.begin(), w.gpu.end(), [](const Event* x, const Event* y) { return x->ts < y->ts; });
  std::vector<double> kernel_us;
  a.cpu_only = w.gpu.empty();
  record_busy(a.cpu_only ? host_busy(t, w, phases) : gpu_busy(t, w, phases, host, per, a, kernel_us), per, a);
  a.kernels_per_step = static_cast<double>(kernel_us.size()) / a.steps;
  a.median_kernel_us = median(kernel_us);
  find_syncs(t, w, phases, a);
  memory_by_phase(t, w, phases, a);
  return a;
}

GroupBy parse_group_by(const std::string& s) {
  if (s == "kernel") return GroupBy::kKernel;
  if (s == "op") return GroupBy::kOp;
  if (s == "scope") return GroupBy::kScope;
  throw UsageError("--group-by must be kernel, op or scope (got '" + s + "')");
}

const char* to_string(GroupBy g) {
  switch (g) {
    case GroupBy::kKernel: return "kernel";
    case GroupBy::kOp: return "op";
    case GroupBy::kScope: return "scope";
  }
  return "?";
}

std::vector<OpRow> op_table(const Timeline& t, GroupBy by, size_t top) {
  const StepAnalysis a = analyze(t);
  const double per = 1.0 / a.steps / 1e3;
  std::map<std::string, OpRow> rows;
  auto row = [&](const std::string& name) -> OpRow& {
    OpRow& r = rows[name];
    r.name = name;
    return r;
  };
  std::unordered_map<int64_t, int> launch_of;
  for (size_t i = 0; i < t.events.size(); ++i)
    if (t.events[i].kind == EventKind::kRuntime && t.events[i].correlation >= 0)
      launch_of[t.events[i].correlation] = static_cast<int>(i);

  if (by == GroupBy::kKernel) {
    for (const auto& e : t.events) {
      if (!is_gpu(e)) continue;
      OpRow& r = row(e.name.substr(0, 160));
      r.self_cuda_ms += e.dur * per, r.total_cuda_ms += e.dur * per, r.calls += 1.0 / a.steps;
      auto it = e.correlation >= 0 ? launch_of.find(e.correlation) : launch_of.end();
      if (it != launch_of.end()) r.self_cpu_ms += t.events[it->second].dur * per;  // the launch call
      r.total_cpu_ms = r.self_cpu_ms;
    }
  } else {
    const std::vector<int> parent = nest_host_events(t);
    const EventKind want = by == GroupBy::kOp ? EventKind::kCpuOp : EventKind::kScope;
    auto counts = [&](const Event& e) {
      return e.kind == want && (by == GroupBy::kOp || starts_with(e.name, "perftrain::"));
    };
    // CPU times: total = duration; self = minus the children of the same kind.
    std::vector<double> child_time(t.events.size(), 0);
    for (size_t i = 0; i < t.events.size(); ++i) {
      if (!counts(t.events[i])) continue;
      for (int p = parent[i]; p >= 0; p = parent[p])
        if (counts(t.events[p])) {
          child_time[p] += t.events[i].dur;
          break;
        }
    }
    for (size_t i = 0; i < t.events.size(); ++i) {
      const Event& e = t.events[i];
      if (!counts(e)) continue;
      OpRow& r = row(e.name);
      r.calls += 1.0 / a.steps;
      r.total_cpu_ms += e.dur * per;
      r.self_cpu_ms += std::max(0.0, e.dur - child_time[i]) * per;
    }
    // CUDA times: the launch's enclosing events of that kind; the innermost is self.
    for (const auto& g : t.events) {
      if (!is_gpu(g) || g.correlation < 0) continue;
      auto it = launch_of.find(g.correlation);
      if (it == launch_of.end()) continue;
      bool first = true;
      std::set<std::string> seen;  // a recursive name counts once in total
      for (int p = parent[it->second]; p >= 0; p = parent[p]) {
        if (!counts(t.events[p])) continue;
        OpRow& r = row(t.events[p].name);
        if (first) r.self_cuda_ms += g.dur * per;
        first = false;
        if (seen.insert(t.events[p].name).second) r.total_cuda_ms += g.dur * per;
      }
    }
  }
  std::vector<OpRow> out;
  for (auto& [k, r] : rows) {  // on the CPU, the share of host time (no CUDA time there)
    r.share = a.step_ms > 0 ? (a.cpu_only ? r.total_cpu_ms : r.total_cuda_ms) / a.step_ms : 0;
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const OpRow& x, const OpRow& y) {
    return x.total_cuda_ms != y.total_cuda_ms ? x.total_cuda_ms > y.total_cuda_ms : x.total_cpu_ms > y.total_cpu_ms;
  });
  if (top > 0 && out.size() > top) out.resize(top);
  return out;
}

std::string format_op_table(const std::vector<OpRow>& rows, GroupBy by, bool cpu_only) {
  std::ostringstream s;
  char buf[512];
  s << "| " << to_string(by)
    << " | self CUDA ms | total CUDA ms | self CPU ms | total CPU ms | calls | share of step |\n"
       "|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::string name = r.name.size() > 100 ? r.name.substr(0, 97) + "..." : r.name;
    for (char& c : name)
      if (c == '|') c = '/';
    std::snprintf(buf, sizeof buf, "| `%s` | %.3f | %.3f | %.3f | %.3f | %.1f | %.1f%% |\n", name.c_str(),
                  r.self_cuda_ms, r.total_cuda_ms, r.self_cpu_ms, r.total_cpu_ms, r.calls, 100 * r.share);
    s << buf;
  }
  if (cpu_only) {
    s << "\n(per step; no CUDA time on the CPU: the share is of total CPU time)\n";
    return s.str();
  }
  s << "\n(per step; CUDA time of an " << (by == GroupBy::kKernel ? "kernel is its own" : "entry is the kernels it launched")
    << "; a captured step's kernels belong to its one graph launch)\n";
  return s.str();
}

StepAccounting account(const StepAnalysis& a, const MeasuredStep& m) {
  StepAccounting c;
  c.trace_ms = a.step_ms;
  c.idle_ms = a.cpu_only ? 0 : a.idle_other_ms;
  c.items = a.cpu_only || a.kernels_per_step <= 0 ? "ATen ops" : "kernels";
  c.items_per_step = c.items == "kernels" ? a.kernels_per_step : a.ops_per_step;
  c.has_profiled = m.profiled_ms > 0;
  c.has_unprofiled = m.unprofiled_ms > 0;
  if (c.has_profiled) {
    c.profiled_ms = m.profiled_ms;
    c.unattributed_ms = m.profiled_ms - a.step_ms;
    c.difference = (a.step_ms - m.profiled_ms) / m.profiled_ms;
    c.within_5pct = std::abs(c.difference) <= 0.05;
  }
  if (c.has_unprofiled) c.unprofiled_ms = m.unprofiled_ms;
  if (c.has_profiled && c.has_unprofiled) {
    c.overhead_ms = m.profiled_ms - m.unprofiled_ms;
    c.overhead_share = c.overhead_ms / m.unprofiled_ms;
    if (c.items_per_step > 0) c.cost_per_item_us = 1e3 * c.overhead_ms / c.items_per_step;
    c.idle_without_profiler_ms = std::max(0.0, c.idle_ms - std::max(0.0, c.overhead_ms));
    c.idle_without_profiler_share = c.idle_without_profiler_ms / m.unprofiled_ms;
  } else {
    c.idle_without_profiler_ms = c.idle_ms;
    c.idle_without_profiler_share = a.step_ms > 0 ? c.idle_ms / a.step_ms : 0;
  }
  return c;
}

double idle_share_without_profiler(const StepAnalysis& a, const MeasuredStep& m) {
  return account(a, m).idle_without_profiler_share;
}

std::string format_breakdown(const StepAnalysis& a, const MeasuredStep& m) {
  std::ostringstream s;
  char buf[1024];
  const StepAccounting c = account(a, m);
  const double total = c.has_profiled ? c.profiled_ms : a.step_ms;  // the shares' denominator
  auto line = [&](const std::string& what, double ms) {
    std::snprintf(buf, sizeof buf, "| %s | %.3f | %.1f%% |\n", what.c_str(), ms, total > 0 ? 100 * ms / total : 0);
    s << buf;
  };
  if (a.cpu_only) s << "No device activity in this trace: the step is split by the host's innermost phase.\n\n";
  std::snprintf(buf, sizeof buf, "Step: %.3f ms in the trace (window of %d steps, %.3f ms)", a.step_ms, a.steps,
                a.window_ms);
  s << buf;
  if (c.has_profiled) {
    std::snprintf(buf, sizeof buf, "; %.3f ms measured around the %d profiled steps (%s)", c.profiled_ms,
                  m.profiled_steps, a.cpu_only ? "host clock" : "CUDA events");
    s << buf;
  }
  if (a.captured)
    s << "; each step is one CUDA graph launch, so its kernels are not split by phase (--profile-uncaptured "
         "profiles the same step eagerly)";
  s << "\n\n| part of the step | ms/step | share |\n|---|---|---|\n";
  for (const auto& p : a.busy_by_phase) line((a.cpu_only ? "host: " : "GPU busy: ") + p.phase, p.ms);
  if (!a.cpu_only) {
    line("GPU idle: waiting for data", a.idle_data_ms);
    line("GPU idle: between kernels (launch and host gaps; the profiler's cost included)", a.idle_other_ms);
  }
  if (c.has_profiled) line("unattributed: the measured profiled step less the trace's window", c.unattributed_ms);
  std::snprintf(buf, sizeof buf, "| **sum** | **%.3f** | |\n",
                a.gpu_busy_ms + a.idle_data_ms + a.idle_other_ms + (c.has_profiled ? c.unattributed_ms : 0));
  s << buf;
  s << "\n";
  if (c.has_profiled) {
    std::snprintf(buf, sizeof buf,
                  "Breakdown against the profiled step: the trace's parts sum to %.3f ms, the profiled step measured "
                  "%.3f ms: %+.3f ms (%+.1f%%), %s.\n",
                  c.trace_ms, c.profiled_ms, c.trace_ms - c.profiled_ms, 100 * c.difference,
                  c.within_5pct ? "within 5%" : "NOT within 5%");
    s << buf;
  } else {
    s << "Breakdown against the profiled step: not measured (no timed profiled steps).\n";
  }
  if (c.has_profiled && c.has_unprofiled) {
    std::snprintf(buf, sizeof buf,
                  "Profiler overhead: profiled step %.3f ms vs unprofiled %.3f ms (%+.1f%%, about %.0f %s x %.2f us)",
                  c.profiled_ms, c.unprofiled_ms, 100 * c.overhead_share, c.items_per_step, c.items.c_str(),
                  c.cost_per_item_us);
    s << buf;
    if (m.unprofiled_steps > 0) {
      std::snprintf(buf, sizeof buf, "; unprofiled: median of %d step%s%s%s", m.unprofiled_steps,
                    m.unprofiled_steps == 1 ? "" : "s", m.unprofiled_what.empty() ? "" : " ",
                    m.unprofiled_what.c_str());
      s << buf;
    }
    s << ".\n";
    if (c.overhead_share < -0.05)
      s << "The unprofiled steps were the slower: they likely held a warm-up, a capture or a checkpoint (give the "
           "schedule skip_first steps past them); nothing is taken out of the idle time.\n";
    if (!a.cpu_only) {
      std::snprintf(buf, sizeof buf,
                    "GPU idle between kernels without the profiler's cost: about %.3f ms/step (%.1f%% of the "
                    "unprofiled step; %.3f ms in the trace).\n",
                    c.idle_without_profiler_ms, 100 * c.idle_without_profiler_share, c.idle_ms);
      s << buf;
    }
  } else if (c.has_unprofiled) {
    std::snprintf(buf, sizeof buf, "Profiler overhead: unknown (unprofiled %.3f ms; the profiled steps were not timed).\n",
                  c.unprofiled_ms);
    s << buf;
  } else {
    s << "Profiler overhead: unknown ("
      << (m.unknown_note.empty() ? "no steps ran without the profiler just before the window: give the schedule "
                                   "wait or skip_first steps"
                                 : m.unknown_note)
      << "); GPU idle between kernels includes the profiler's own cost.\n";
  }
  if (a.cpu_only) {
    std::snprintf(buf, sizeof buf, "\nHost data wait %.3f ms/step.\n", a.data_wait_ms);
    s << buf;
    return s.str();
  }
  s << "\n| GPU time by kind | ms/step | share of busy |\n|---|---|---|\n";
  for (const auto& k : a.busy_by_kind) {
    std::snprintf(buf, sizeof buf, "| %s | %.3f | %.1f%% |\n", k.phase.c_str(), k.ms,
                  a.gpu_busy_ms > 0 ? 100 * k.ms / a.gpu_busy_ms : 0);
    s << buf;
  }
  std::snprintf(buf, sizeof buf,
                "\nKernels per step: %.0f (median %.1f us); CPU time in launch calls %.3f ms/step against GPU busy "
                "%.3f ms/step; host data wait %.3f ms/step; host syncs in the step %.1f/step; cudaMalloc %lld, "
                "cudaFree %lld in the window; copies %.1f MB host-to-device, %.3f MB device-to-host per step.\n",
                a.kernels_per_step, a.median_kernel_us, a.launch_cpu_ms, a.gpu_busy_ms, a.data_wait_ms,
                a.syncs_per_step, static_cast<long long>(a.device_mallocs), static_cast<long long>(a.device_frees),
                a.h2d_bytes / 1e6, a.d2h_bytes / 1e6);
  s << buf;
  if (!a.memory.empty()) {
    s << "\n| phase | peak allocated GiB | peak reserved GiB |\n|---|---|---|\n";
    for (const auto& pm : a.memory) {
      std::snprintf(buf, sizeof buf, "| %s | %.2f | %.2f |\n", pm.phase.c_str(), pm.peak_allocated_gib,
                    pm.peak_reserved_gib);
      s << buf;
    }
  }
  return s.str();
}

}  // namespace perftrain::observe::profile
