// torch.ops.perftrain.diagnose_trace(path, json=False) -> str: the report of
// `perftrain diagnose` (observe/profile/trace_diagnosis.h) for a
// torch.profiler trace, Markdown or JSON. perftrain.profile (profile.py)
// calls it on the trace it records around the user's step. A trace that
// cannot be read raises RuntimeError naming the file.
#include <torch/library.h>

#include <string>

#include "observe/profile/trace_diagnosis.h"
#include "op_support.h"

namespace perftrain::python {
namespace {

std::string diagnose_trace(const std::string& path, bool json) {
  observe::profile::DiagnoseOptions o;
  o.json = json;
  return observe::profile::diagnose_trace(path, o);
}

}  // namespace
}  // namespace perftrain::python

// No tensor in or out: one kernel for every dispatch key.
TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("diagnose_trace(str path, bool json=False) -> str", perftrain::python::kernel<&perftrain::python::diagnose_trace>);
}
