// What a profiled step says, in words: each finding names what it saw (the
// evidence, with numbers from the timeline) and what to try. The rules are
// pure functions of a StepAnalysis (observe/profile/timeline.h) and of what
// the run knows about itself (RunFacts), so tests feed them synthetic ones.
// One rule set for every trace: `perftrain profile` and `train --profile`
// fill RunFacts from the config they ran, `perftrain diagnose` from the
// trace alone (observe/profile/trace_diagnosis.h); RunFacts::program picks
// the words of the advice (perftrain's [speed] keys, or PyTorch's own
// switches for any other program).
//
// Rules (thresholds next to each in diagnosis.cpp):
//   launch-bound      GPU idle between kernels (less the profiler's own cost
//                     where the unprofiled step was timed), many short
//                     kernels, launch CPU time
//   data-bound        GPU idle while the host waited for the loader
//   elementwise       memory-bound non-matrix kernels' share of GPU time
//   matrix-bound      matrix products and attention fill the step; achieved
//                     rate against the peak measured in the same run
//   power-capped      the GPU at its power limit, the clock it allows
//   alignment         product dimensions not multiples of 8 (64 for head dims)
//   host-syncs        cudaStreamSynchronize / cudaMemcpy D2H ... inside the step
//   fp32-matmul       fp32/TF32 matrix kernels where bf16 was asked for
//   allocator-churn   cudaMalloc/cudaFree inside the steps, allocator retries
//   recompute         what recomputation in backward costs
//   captured          one graph launch per step: phases need --profile-uncaptured
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "observe/bench/gpu_sampler.h"
#include "observe/profile/timeline.h"

namespace perftrain::observe::profile {

// Who ran the step: perftrain's own step, or any PyTorch program (a trace
// torch.profiler wrote), whose advice names torch.compile, DataLoader,
// AdamW and autocast switches.
enum class Program { kPerftrain, kPyTorch };

struct RunFacts {
  Program program = Program::kPerftrain;
  std::string precision = "bf16";  // bf16 | fp16 | fp32; "" where the program did not say (a PyTorch trace)
  bool compiled = false;           // torch.compile's kernels (Triton) in the step
  bool graph = false;              // speed.graph (asked for)
  bool fused_kernels = false;      // speed.fused_kernels
  bool recompute = false, gelu_recompute = false;
  int64_t prefetch = 0;             // data.prefetch
  double train_flops_per_step = 0;  // 3 x forward FLOPs x batch; 0: unknown
  std::optional<double> peak_tflops;         // bf16 matmul peak measured in this run
  std::optional<double> peak_clock_mhz;      // median SM clock while it was measured
  bench::GpuSamples gpu;                     // sampled during the profiled window
  std::vector<std::pair<std::string, int64_t>> matrix_dims;  // "hidden" -> 384, ...
  std::vector<std::pair<std::string, int64_t>> head_dims;    // "head dim" -> 64
  std::optional<double> memory_total_gib, peak_reserved_gib;
  int64_t alloc_retries = 0;  // caching allocator retries (a full cache freed and retried)
  // The profiled and the unprofiled step, timed outside the trace: the rules
  // that read GPU idle time take the profiler's own cost out of it.
  MeasuredStep measured;
};

struct Finding {
  std::string id;        // launch-bound, data-bound, ...
  std::string title;     // one line
  std::string evidence;  // the numbers
  std::string advice;    // what to try
  double weight = 0;     // share of the step at stake, for the order
};

std::vector<Finding> diagnose(const StepAnalysis& a, const RunFacts& f);
// "1. **launch-bound**: title\n   evidence: ...\n   try: ...", or a line saying nothing stands out.
std::string format_findings(const std::vector<Finding>& findings);

}  // namespace perftrain::observe::profile
