// The step-window profiler: drives libtorch's Kineto profiler over the steps
// a Schedule (observe/profile/schedule.h) picks, and writes one
// Chrome/Perfetto trace per window (profile/<tag>window-<n>.json, or .json.gz),
// which chrome://tracing, ui.perfetto.dev and TensorBoard's profiler open.
// Each recorded step is wrapped in a "ProfilerStep#<n>" range, as
// torch.profiler's step() does; the trace carries a top-level "perftrain"
// object (what ran, and whether each step was one CUDA graph launch).
//
// It also times the steps outside the trace (CUDA events on the device's
// current stream around each step, the host clock without CUDA): each
// window's profiled steps, and up to kUnprofiledSteps steps just before the
// window's warm-up that ran without the profiler; window_timing(n) has them
// once window n is saved.
//
//   StepProfiler p(opts);
//   for (int64_t i = 0; ...; ++i) { p.begin_step(i); <step>; p.end_step(i); }
//   p.finish();
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "observe/profile/schedule.h"
#include "observe/profile/timeline.h"

namespace at {
struct RecordFunction;
}

namespace perftrain::observe::profile {

struct ProfilerOptions {
  Schedule schedule;
  std::string dir;            // where the traces go (created)
  std::string tag;            // file name prefix, e.g. "uncaptured-"
  bool cuda = false;          // CUDA activity (kernels, copies) besides the CPU's; steps timed by CUDA events
  int cuda_device = 0;        // the device whose current stream the timing events go on
  bool record_shapes = false; // input shapes and dtypes of each op
  bool profile_memory = false;  // allocator events ([memory]: totals allocated and reserved)
  bool with_stack = false;    // call stacks of ops (Python/TorchScript frames; none in a C++ run)
  bool gzip = false;          // write .json.gz
  // Record the perftrain scopes and ProfilerStep ranges (RecordFunction user
  // scopes) but not each ATen op, and push no CUPTI external correlation per
  // op (ExperimentalConfig::disable_external_correlation): less of the
  // profiler's cost per op in eager steps. The kernels are still charged to
  // the scope that launched them; the op table by op is empty and host syncs
  // lose the op around them. It does not lower CUPTI's cost per kernel, which
  // libtorch's API has no switch for (Kineto records each kernel of a graph
  // replay, not the launch as one activity).
  bool scopes_only = false;
  std::function<void()> sync;  // waits for the device; called before a window starts and ends
  std::map<std::string, std::string> metadata;  // into the trace's "perftrain" object
};

class StepProfiler {
 public:
  explicit StepProfiler(ProfilerOptions opts);
  ~StepProfiler();  // a window in progress is saved
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void begin_step(int64_t step);
  void end_step(int64_t step);
  void finish();

  bool recording() const { return machine_.recording(); }
  // No later step can record (all repeat cycles done).
  bool done_after(int64_t step) const { return machine_.done_after(step); }
  // Traces written so far, in order.
  const std::vector<std::string>& traces() const { return traces_; }
  // Called after each window's trace is written (path, window index from 0).
  std::function<void(const std::string&, int)> on_saved;
  // Metadata for the windows that follow (e.g. once the step is captured).
  void set_metadata(const std::string& key, const std::string& value) { opts_.metadata[key] = value; }
  // Window n's steps timed outside the trace (profiled, and unprofiled just
  // before it: unprofiled_steps 0 when none ran). RuntimeError for a window
  // not saved.
  const MeasuredStep& window_timing(int window) const;

  static constexpr int kUnprofiledSteps = 8;

 private:
  struct Clock;
  void apply(const std::vector<Op>& ops, int64_t step);
  void close_step_range();

  ProfilerOptions opts_;
  ScheduleMachine machine_;
  bool prepared_ = false, enabled_ = false;
  int64_t first_step_ = -1;
  std::unique_ptr<at::RecordFunction> step_range_;
  std::vector<std::string> traces_;
  std::unique_ptr<Clock> clock_;
  std::vector<MeasuredStep> timings_;  // per saved window
};

// Kineto writes every trace with the CUDA devices' properties, asking
// cudaGetDeviceCount even in a CPU-only profile, and logs its failure where
// no driver is loaded ("gpuGetDeviceCount failed with code 35") as an error.
// A CPU profile wants no CUDA line: this raises Kineto's log threshold above
// its errors (KINETO_LOG_LEVEL, which it reads when it first starts), unless
// the user set one. StepProfiler calls it for a profiler without CUDA; a
// driver calls it first, before other threads start (setenv).
void quiet_cpu_trace_writer();

// Writes text into the trace at `path` after its opening brace as
// "perftrain": {...metadata}, optionally gzipping it to path + ".gz" (the
// plain file is then removed). Returns the final path. Exposed for tests.
std::string finish_trace_file(const std::string& path, const std::map<std::string, std::string>& metadata,
                              bool gzip);

}  // namespace perftrain::observe::profile
