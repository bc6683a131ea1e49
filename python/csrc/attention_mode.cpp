// The [speed] key attention from Python (ops/attention_mode.h): which kernels
// perftrain.ops.attention and perftrain.nn's attention run, process-wide. No
// tensors: one kernel for every device.
#include <torch/library.h>

#include <string>

#include "op_support.h"
#include "ops/attention_mode.h"

namespace perftrain::python {
namespace {

void set_attention_mode(std::string mode) { ops::set_attention_mode(mode); }
std::string attention_mode() { return ops::attention_mode(); }

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("set_attention_mode(str mode) -> ()", perftrain::python::kernel<&perftrain::python::set_attention_mode>);
  m.def("attention_mode() -> str", perftrain::python::kernel<&perftrain::python::attention_mode>);
}
