#include "observe/bench/step_timer.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include "base/error.h"
#include "compat/compat.h"

namespace perftrain::observe::bench {

struct StepTimer::Events {
  std::vector<at::cuda::CUDAEvent> begin, end;
};

StepTimer::StepTimer(const at::Device& device, int64_t steps)
    : cuda_(device.is_cuda()), device_(device), steps_(steps) {
  if (steps < 1) throw UsageError("StepTimer needs at least one step");
  begun_.assign(steps, 0);
  ended_.assign(steps, 0);
  if (cuda_) {
    events_ = std::make_unique<Events>();
    events_->begin.reserve(steps);
    events_->end.reserve(steps);
    // cudaEventDefault: timing on (ATen's default flags disable it).
    for (int64_t i = 0; i < steps; ++i) {
      events_->begin.emplace_back(cudaEventDefault);
      events_->end.emplace_back(cudaEventDefault);
    }
  } else {
    host_begin_.resize(steps);
    host_end_.resize(steps);
  }
}

StepTimer::~StepTimer() = default;

void StepTimer::begin(int64_t i) {
  if (i < 0 || i >= steps_) throw RuntimeError("StepTimer: step index out of range");
  begun_[i] = 1;
  if (cuda_) events_->begin[i].record(at::cuda::getCurrentCUDAStream(device_.index()));
  else host_begin_[i] = std::chrono::steady_clock::now();
}

void StepTimer::end(int64_t i) {
  if (i < 0 || i >= steps_) throw RuntimeError("StepTimer: step index out of range");
  ended_[i] = 1;
  if (cuda_) events_->end[i].record(at::cuda::getCurrentCUDAStream(device_.index()));
  else host_end_[i] = std::chrono::steady_clock::now();
}

std::vector<double> StepTimer::elapsed_ms() {
  for (int64_t i = 0; i < steps_; ++i)
    if (!begun_[i] || !ended_[i]) throw RuntimeError("StepTimer: step " + std::to_string(i) + " was not timed");
  compat::synchronize(device_);
  std::vector<double> ms(steps_);
  for (int64_t i = 0; i < steps_; ++i)
    ms[i] = cuda_ ? static_cast<double>(events_->begin[i].elapsed_time(events_->end[i]))
                  : std::chrono::duration<double, std::milli>(host_end_[i] - host_begin_[i]).count();
  return ms;
}

}  // namespace perftrain::observe::bench
