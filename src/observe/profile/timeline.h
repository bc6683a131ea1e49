// A profiled window as a timeline, read back from the Chrome/Perfetto trace
// the PyTorch profiler (Kineto) wrote, and what it says about a step:
//  - the breakdown of the step's wall time: GPU busy by phase (the phases are
//    the perftrain scopes of base/scope.h: data wait, copy, forward, loss,
//    backward, clipping, optimizer, EMA, ...), GPU idle while the host waited
//    for data, other GPU idle (launch gaps). The parts add up to the window's
//    wall time by construction;
//  - kernel counts and lengths, CPU time in launch calls against GPU busy
//    time, host syncs inside the steps, allocator calls, peak memory per phase;
//  - the op table (like torch's key_averages().table()), by kernel, op or scope.
// Everything here is a pure function of the Timeline, so the tests build
// synthetic ones.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace perftrain::observe::profile {

enum class EventKind {
  kCpuOp,       // cat cpu_op: an ATen operator
  kScope,       // cat user_annotation: a RecordFunction user scope (perftrain::..., ProfilerStep#N)
  kRuntime,     // cat cuda_runtime / cuda_driver: a CUDA API call on a host thread
  kKernel,      // cat kernel
  kMemcpy,      // cat gpu_memcpy
  kMemset,      // cat gpu_memset
  kMemory,      // the [memory] instant events of profile_memory
  kOther,
};

struct Event {
  EventKind kind = EventKind::kOther;
  std::string name;
  double ts = 0, dur = 0;     // microseconds
  int64_t tid = 0;            // host thread, or GPU stream
  int64_t correlation = -1;   // links a GPU activity to its launch call
  double bytes = 0;           // memcpy / memset bytes
  double total_allocated = -1, total_reserved = -1;  // [memory] events
  std::string input_types;    // cpu ops with shapes recorded: "float, c10::BFloat16"
  double end() const { return ts + dur; }
};

// A CUDA device as the trace's deviceProperties (Kineto's) describe it.
struct DeviceInfo {
  int64_t id = 0;
  std::string name;
  double memory_gib = 0;
  int compute_major = 0, compute_minor = 0, sms = 0;
};

struct Timeline {
  std::vector<Event> events;
  std::vector<DeviceInfo> devices;               // deviceProperties
  std::map<std::string, std::string> perftrain;  // the top-level "perftrain" object, where there is one
};

// Reads a trace (.json, or .json.gz). RuntimeError naming the file when it
// cannot be read or parsed, or has no traceEvents.
Timeline load_trace(const std::string& path);
Timeline parse_trace(const std::string& json_text, const std::string& origin = "trace");

// The phase a scope (user_annotation) name belongs to: a perftrain scope
// ("perftrain::block 3" -> "forward"), or what torch marks in any program
// ("enumerate(DataLoader)#..." -> "data wait", "Optimizer.step#AdamW.step"
// -> "optimizer"); "" for a name that is no phase.
std::string phase_of_scope(const std::string& scope_name);
// The phase an ATen-level op (cpu_op) marks in any program: the autograd
// engine's nodes ("autograd::engine::evaluate_function: ...",
// "CompiledFunctionBackward") -> "backward", torch.compile's
// "CompiledFunction" -> "forward"; "" otherwise.
std::string phase_of_op(const std::string& op_name);
// The phases in the order of a step, for reports.
const std::vector<std::string>& phase_order();

struct PhaseTime {
  std::string phase;
  double ms = 0;  // per step
};

struct PhaseMemory {
  std::string phase;
  double peak_allocated_gib = 0, peak_reserved_gib = 0;
};

struct SyncFinding {
  std::string call;   // cudaStreamSynchronize, cudaMemcpy, ...
  std::string op;     // the innermost ATen op around it (aten::item), or ""
  std::string phase;  // where in the step
  int64_t count = 0;  // in the window
};

struct StepAnalysis {
  int steps = 0;             // ProfilerStep#N scopes seen (1 for a trace without them)
  double window_ms = 0;      // from the first step's start to the last GPU activity or step end
  double step_ms = 0;        // window_ms / steps
  bool captured = false;     // the steps launched CUDA graphs (cudaGraphLaunch)
  bool cpu_only = false;     // no GPU activity: busy_by_phase is host time by phase, no idle parts
  int64_t graph_launches = 0;

  // The breakdown, per step; busy_by_phase + idle_data_ms + idle_other_ms == step_ms.
  std::vector<PhaseTime> busy_by_phase;  // in phase_order(), phases with time only
  double gpu_busy_ms = 0, idle_data_ms = 0, idle_other_ms = 0;
  double data_wait_ms = 0;               // host time waiting for data: the data wait scopes, blocking copies
  double blocking_h2d_ms = 0;            // of which host time in copies from pageable memory

  // GPU busy time by kind of kernel (observe::kernel_kind), per step.
  std::vector<PhaseTime> busy_by_kind;
  double matrix_ms = 0, attention_ms = 0, copy_ms = 0, elementwise_ms = 0;  // elementwise: the rest
  double fp32_matrix_ms = 0;  // matrix kernels whose name says fp32/TF32
  int64_t fp32_matrix_ops = 0;  // aten matrix ops on float inputs (only with shapes recorded)

  double kernels_per_step = 0;
  double ops_per_step = 0;        // ATen ops (cpu_op events) in the steps
  double median_kernel_us = 0;
  double launch_cpu_ms = 0;       // host time in launch calls per step
  double h2d_bytes = 0, d2h_bytes = 0;  // per step

  std::vector<SyncFinding> syncs;  // host syncs inside the steps
  double syncs_per_step = 0;
  int64_t device_mallocs = 0, device_frees = 0;  // cudaMalloc / cudaFree calls in the window

  std::vector<PhaseMemory> memory;  // with profile_memory; phases with events only
};

StepAnalysis analyze(const Timeline& t);

enum class GroupBy { kKernel, kOp, kScope };
GroupBy parse_group_by(const std::string& s);  // kernel | op | scope; UsageError otherwise
const char* to_string(GroupBy g);

struct OpRow {
  std::string name;
  double self_cuda_ms = 0, total_cuda_ms = 0;  // per step
  double self_cpu_ms = 0, total_cpu_ms = 0;    // per step
  double calls = 0;                            // per step
  double share = 0;                            // total CUDA time / step time (CPU time on the CPU)
};

// Rows sorted by total CUDA time, then total CPU time; `top` rows (0: all).
// kernel: each kernel name (self = total); op: each ATen op (self CUDA = the
// kernels it launched itself, total = with its children's); scope: each
// perftrain scope by its phase name and each block.
std::vector<OpRow> op_table(const Timeline& t, GroupBy by, size_t top = 0);
// cpu_only: a trace without GPU activity (StepAnalysis::cpu_only), whose
// shares are of CPU time.
std::string format_op_table(const std::vector<OpRow>& rows, GroupBy by, bool cpu_only = false);

// The step as measured outside the trace, in the same process and run: CUDA
// events around each profiled step (the host clock on the CPU), and the same
// step function timed just before the window without the profiler.
struct MeasuredStep {
  double profiled_ms = 0;    // per step: from the first profiled step's start to the last one's end; 0: unknown
  int profiled_steps = 0;
  double unprofiled_ms = 0;  // per step, the median; 0: unknown
  int unprofiled_steps = 0;
  std::string unprofiled_what;  // how they were taken, for the report ("timed before the profiler started")
  std::string unknown_note;     // why none were timed, for the report; "": the profile commands' own words
};

// The breakdown against the measured step. The trace's parts sum to
// a.step_ms; what the measured profiled step holds beyond that is
// `unattributed` (negative when the trace's window is the longer), so the
// parts plus it are the profiled step exactly. What the profiled step takes
// beyond the unprofiled one is the profiler's own cost; it lands in the
// trace as GPU idle between kernels (CUPTI's records, the ops' recording),
// so that idle time less the overhead is the idle time of the step as it
// runs without the profiler.
struct StepAccounting {
  bool has_profiled = false, has_unprofiled = false;
  double trace_ms = 0;                 // the breakdown's parts
  double profiled_ms = 0, unattributed_ms = 0;
  double difference = 0;               // (trace - profiled) / profiled
  bool within_5pct = false;
  double unprofiled_ms = 0;
  double overhead_ms = 0, overhead_share = 0;  // profiled - unprofiled; over unprofiled
  double items_per_step = 0;           // kernels (ATen ops on the CPU) per step
  std::string items = "kernels";
  double cost_per_item_us = 0;         // overhead / items
  double idle_ms = 0;                  // GPU idle between kernels in the trace
  double idle_without_profiler_ms = 0; // idle_ms less the overhead (not below 0)
  double idle_without_profiler_share = 0;  // over the unprofiled step
};
StepAccounting account(const StepAnalysis& a, const MeasuredStep& m);

// GPU idle between kernels as a share of the step, without the profiler's
// cost where the overhead is known (the trace's share otherwise).
double idle_share_without_profiler(const StepAnalysis& a, const MeasuredStep& m);

// The breakdown as a Markdown table; with the measured step, its
// "unattributed" row, the 5% check and the profiler overhead line.
std::string format_breakdown(const StepAnalysis& a, const MeasuredStep& m = {});

}  // namespace perftrain::observe::profile
