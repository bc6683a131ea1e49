// Times a run of training steps without disturbing them: on a CUDA device a
// pair of timing events per step, recorded on the current stream around the
// step's launches, read only after the whole window (no host sync inside it,
// so CPU launch overhead that leaves the GPU idle shows up as time, as it
// does in training); on the CPU the host clock around each step.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <vector>

namespace perftrain::observe::bench {

class StepTimer {
 public:
  // Room for `steps` timed steps: all event objects are allocated here; CUDA
  // creates each on its first record (a host call, no sync).
  StepTimer(const at::Device& device, int64_t steps);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  void begin(int64_t i);  // before step i's launches
  void end(int64_t i);    // after them
  // Waits for the device and returns the milliseconds of steps [0, steps).
  // Throws RuntimeError when a step was not bracketed by begin/end.
  std::vector<double> elapsed_ms();
  bool uses_cuda_events() const { return cuda_; }

 private:
  struct Events;
  bool cuda_;
  at::Device device_;
  int64_t steps_;
  std::unique_ptr<Events> events_;
  std::vector<std::chrono::steady_clock::time_point> host_begin_, host_end_;
  std::vector<char> begun_, ended_;
};

}  // namespace perftrain::observe::bench
