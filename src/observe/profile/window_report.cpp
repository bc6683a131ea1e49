#include "observe/profile/window_report.h"

#include <sstream>

namespace perftrain::observe::profile {

WindowReport report_window(const Timeline& t, const RunFacts& facts, const WindowReportOptions& o) {
  WindowReport r;
  r.analysis = analyze(t);
  r.findings = diagnose(r.analysis, facts);
  std::ostringstream s;
  if (!o.title.empty()) s << "## " << o.title << "\n\n";
  s << "### Where the step's time goes\n\n" << format_breakdown(r.analysis, facts.measured);
  s << "\n### Top " << o.top << " by " << to_string(o.group_by) << "\n\n";
  if (r.analysis.cpu_only && o.group_by == GroupBy::kKernel)
    s << "No kernels: a CPU run has none, the kernel table is for CUDA runs (--group-by op or scope splits a CPU "
         "step).\n";
  else
    s << format_op_table(op_table(t, o.group_by, o.top), o.group_by, r.analysis.cpu_only);
  s << "\n### Diagnosis\n\n" << format_findings(r.findings);
  r.markdown = s.str();
  return r;
}

WindowReport report_trace(const std::string& trace_path, const RunFacts& facts, const WindowReportOptions& o) {
  return report_window(load_trace(trace_path), facts, o);
}

}  // namespace perftrain::observe::profile
