// perftrain train --profile <schedule>: windows of a real run under the
// step-window profiler (observe/profile/step_profiler.h). Traces go into
// <run>/profile/window-<n>.json, each with a report beside it
// (window-<n>.md: breakdown, top kernels, diagnosis), and the log says where
// and what the first finding is. The GPU's clock and power are sampled while
// a window records.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <ostream>
#include <string>

#include "observe/profile/diagnosis.h"
#include "train/config.h"

namespace perftrain::observe::bench {
class GpuSampler;
}
namespace perftrain::observe::profile {
class StepProfiler;
}

namespace perftrain::train {

class StepRunner;

// What the diagnosis knows of a run from its config (no measured peak).
observe::profile::RunFacts run_facts(const TrainConfig& cfg, const std::string& precision);

class RunProfiler {
 public:
  // schedule: "wait=1,warmup=1,active=2,repeat=1" (UsageError naming --profile).
  // scopes_only: --profile-scopes-only (observe::profile::ProfilerOptions::scopes_only).
  RunProfiler(const std::string& schedule, const TrainConfig& cfg, const std::string& precision, at::Device device,
              const std::string& run_dir, const StepRunner& runner, std::ostream& log, bool scopes_only = false);
  ~RunProfiler();
  // index: the step's number in this run, counted from 0.
  void begin_step(int64_t index);
  void end_step(int64_t index);
  void finish();

 private:
  void saved(const std::string& trace, int window);

  const StepRunner& runner_;
  std::ostream& log_;
  at::Device device_;
  observe::profile::RunFacts facts_;
  std::unique_ptr<observe::profile::StepProfiler> profiler_;
  std::unique_ptr<observe::bench::GpuSampler> sampler_;
};

}  // namespace perftrain::train
