// One profiled window in words: its breakdown, the top of the op table and the
// diagnosis, as Markdown (what `perftrain profile` prints and writes into
// profile.md, and `perftrain train --profile` writes beside each trace).
// The breakdown is checked against facts.measured (the profiled and the
// unprofiled step timed outside the trace).
#pragma once

#include <string>

#include "observe/profile/diagnosis.h"
#include "observe/profile/timeline.h"

namespace perftrain::observe::profile {

struct WindowReportOptions {
  GroupBy group_by = GroupBy::kKernel;
  size_t top = 15;
  std::string title;
};

struct WindowReport {
  StepAnalysis analysis;
  std::vector<Finding> findings;
  std::string markdown;
};

WindowReport report_window(const Timeline& t, const RunFacts& facts, const WindowReportOptions& o);
WindowReport report_trace(const std::string& trace_path, const RunFacts& facts, const WindowReportOptions& o);

}  // namespace perftrain::observe::profile
