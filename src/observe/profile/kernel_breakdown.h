// Where a step's GPU time goes, by kind of kernel: the PyTorch profiler
// (Kineto/CUPTI, which also sees the kernels a CUDA graph replays) records a
// few steps; kernel times are grouped into matrix products, attention, the
// fused norm/residual kernels, fp8's casts and scaling, the optimizer, other
// elementwise kernels and copies. This is the account that says what to optimise next.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace perftrain::observe {

struct KernelTime {
  std::string name;  // kind ("matrix products") or kernel name
  double ms = 0;     // GPU time per step
  int64_t count = 0; // launches per step
};

struct KernelBreakdown {
  int steps = 0;
  double gpu_ms = 0;                // sum of kernel and copy time per step
  std::vector<KernelTime> kinds;    // by kind, largest first
  std::vector<KernelTime> top;      // the largest kernels by name, largest first
  std::string error;                // non-empty when the profiler could not run
};

// The kind a kernel's name says it is (exposed for tests).
std::string kernel_kind(const std::string& name);

// Runs `run_steps` (which runs `steps` training steps) under the profiler,
// synchronizes, and groups the CUDA activity. trace_path: where to write the
// Chrome/Perfetto trace ("" for none).
KernelBreakdown profile_kernels(const std::function<void()>& run_steps, int steps, const std::string& trace_path,
                                size_t top_n = 40);

// A Markdown table of kinds (ms per step, share) then the top kernels.
std::string to_markdown(const KernelBreakdown& b);

}  // namespace perftrain::observe
