// From a runtime at::ScalarType to the C++ element type a kernel template is
// instantiated for: the three storage types the row kernels take (float32,
// bfloat16, float16), the check that names the offending input, and the
// dispatch that the ops nest once per templated type. Also the sizes text
// ("[2, 3, 8]") the ops' argument errors quote.
//
//   with_kernel_type("my_op", x.scalar_type(), [&](auto tx) {
//     using TX = kernel_type<decltype(tx)>;   // float, __nv_bfloat16 or __half
//     ...
//   });
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <sstream>
#include <string>
#include <type_traits>

#include "base/error.h"

namespace perftrain::ops {

// "[2, 3, 8]": a tensor's sizes for an error message.
inline std::string shape(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

inline bool is_kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// Throws UsageError "<op>: <what> must be float32, bfloat16 or float16, got <t>".
inline void check_kernel_dtype(const char* op, at::ScalarType t, const char* what) {
  if (!is_kernel_dtype(t))
    throw UsageError(std::string(op) + ": " + what + " must be float32, bfloat16 or float16, got " + c10::toString(t));
}

// Calls f with a null pointer of the C++ type of t (float, __nv_bfloat16, __half).
template <typename F>
void with_kernel_type(const char* op, at::ScalarType t, F&& f) {
  switch (t) {
    case at::kFloat: return f(static_cast<float*>(nullptr));
    case at::kBFloat16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case at::kHalf: return f(static_cast<__half*>(nullptr));
    default: throw UsageError(std::string(op) + ": unsupported dtype " + c10::toString(t));
  }
}

// The element type behind the null pointer with_kernel_type passes.
template <typename P>
using kernel_type = std::remove_pointer_t<P>;

}  // namespace perftrain::ops
