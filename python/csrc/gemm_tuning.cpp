// The products' algorithm timing, from Python: whether it is open now, and
// holding it off (ops::GemmTuningDeferred). cuBLASLt's products time their
// candidate algorithms on each shape's first call (ops/cublaslt_workspace.h);
// perftrain.capture_step defers that over its first warm-up step, as the C++
// step runner does over a run's first step, so the timing (and the loading of
// every candidate kernel) happens in the next warm-up step, not before the
// first step ends. No tensors: one kernel for every device.
#include <torch/library.h>

#include <memory>

#include "op_support.h"
#include "ops/cublaslt_workspace.h"

namespace perftrain::python {
namespace {

std::unique_ptr<ops::GemmTuningDeferred>& deferred() {
  static std::unique_ptr<ops::GemmTuningDeferred> held;
  return held;
}

bool gemm_tuning_open() { return ops::gemm_tuning_open(); }

// on: products time nothing until defer_gemm_tuning(false); a second `on`
// while deferred changes nothing.
void defer_gemm_tuning(bool on) {
  auto& held = deferred();
  if (on && !held) held = std::make_unique<ops::GemmTuningDeferred>();
  if (!on) held.reset();
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("gemm_tuning_open() -> bool", perftrain::python::kernel<&perftrain::python::gemm_tuning_open>);
  m.def("defer_gemm_tuning(bool on) -> ()", perftrain::python::kernel<&perftrain::python::defer_gemm_tuning>);
}
