// perftrain diagnose: the breakdown and diagnosis of any trace torch.profiler
// (Kineto) wrote, from any program, eager or compiled, as `perftrain
// profile` gives them for its own step: the same timeline analysis
// (observe/profile/timeline.h) and the same rules (diagnosis.h), with the
// facts the rules read taken from the trace itself (trace_facts). What a
// trace does not hold stays unknown: the unprofiled step (the profiler's own
// cost) and the GPU's power, unless its top-level "perftrain" object carries
// them (perftrain.profile in Python writes them there).
#pragma once

#include <cstddef>
#include <string>

#include "observe/profile/diagnosis.h"
#include "observe/profile/timeline.h"
#include "observe/profile/window_report.h"

namespace perftrain::observe::profile {

// The "perftrain" object's keys trace_facts reads, besides our own traces'
// metadata ("precision", "captured", ...): the median unprofiled step and how
// many were timed, the profiled step and its count, and nvidia-smi samples
// (observe/bench/gpu_sampler.h's CSV lines) taken while the trace recorded.
inline constexpr const char* kUnprofiledMsKey = "unprofiled_ms";
inline constexpr const char* kUnprofiledStepsKey = "unprofiled_steps";
inline constexpr const char* kProfiledMsKey = "profiled_ms";
inline constexpr const char* kProfiledStepsKey = "profiled_steps";
inline constexpr const char* kGpuSamplesKey = "gpu_samples";

// What the rules can know of a run from its trace alone: who ran it
// (perftrain's step has perftrain:: scopes), the precision
// (the object's, or the kernels' and ops' types: "" where nothing is 16-bit),
// torch.compile's kernels, fused kernels of ours, the device's memory, and
// the measured steps and GPU samples of the "perftrain" object.
RunFacts trace_facts(const Timeline& t, const StepAnalysis& a);

struct DiagnoseOptions {
  GroupBy group_by = GroupBy::kKernel;
  size_t top = 15;
  bool json = false;  // the report as one JSON object instead of Markdown
};

// Reads the trace at `path` (.json or .json.gz) and returns the report:
// Markdown (what ran, the breakdown, the op table, the findings) or JSON.
// RuntimeError naming the file when it cannot be read, is not JSON (or is
// cut short), or holds no profiler events.
std::string diagnose_trace(const std::string& path, const DiagnoseOptions& o = {});

// The report as JSON: what ran, the breakdown's numbers per step, and the
// findings in order.
std::string report_json(const std::string& path, const Timeline& t, const WindowReport& r, const RunFacts& f);

}  // namespace perftrain::observe::profile
