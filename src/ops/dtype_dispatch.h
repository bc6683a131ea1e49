// From a runtime at::ScalarType to the C++ element type a kernel template is
// instantiated for: the three storage types the row kernels take (float32,
// bfloat16, float16), the check that names the offending input, and the
// dispatch over one or three templated types. Also what the row ops
// (adaln_layernorm, gated_residual, residual_adaln, position_add) share
// around their kernels: the sizes text ("[2, 3, 8]") their argument errors
// quote, the argument checks, and the pointers they pass.
//
//   with_kernel_types("my_op", x.scalar_type(), m.scalar_type(), y.scalar_type(),
//                     [&](auto tx, auto tm, auto ty) {
//     using TX = kernel_type<decltype(tx)>;   // float, __nv_bfloat16 or __half
//     ...
//   });
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// f(ta, tb, tc) with the null pointers of three types: one kernel template's three parameters.
template <typename F>
void with_kernel_types(const char* op, at::ScalarType a, at::ScalarType b, at::ScalarType c, F&& f) {
  with_kernel_type(op, a, [&](auto ta) {
    with_kernel_type(op, b, [&](auto tb) { with_kernel_type(op, c, [&](auto tc) { f(ta, tb, tc); }); });
  });
}

// t's data as T* (T const for a read-only argument), or null for an
// undefined tensor (what an op did not keep or does not have).
template <typename T>
T* kernel_ptr(const at::Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// The row kernels want a [B, D] modulation's last dimension dense; its row
// stride is passed through, so a chunk of a [B, 6D] tensor is not copied.
inline at::Tensor rows_dense(const at::Tensor& t) { return t.stride(1) == 1 ? t : t.contiguous(); }

namespace detail {

// A named argument, for the checks below.
struct NamedTensor {
  const char* name;
  const at::Tensor& t;
};

// The argument checks every row op makes, each failure a UsageError naming
// `op` and the argument: x [B, T, D] with D >= 1; each of `like_x` (y) of
// x's shape; each of `per_sample` (gate, shift, scale) one row per sample,
// [B, D]; all of them defined, of a kernel dtype and on x's device; and on
// CUDA, what the row kernels take: D up to max_cols, at most 65535 samples
// (a grid dimension) and rows indexed in 32 bits.
inline void check_row_op_args(const char* op, const at::Tensor& x, const std::vector<NamedTensor>& like_x,
                              const std::vector<NamedTensor>& per_sample, int64_t max_cols) {
  const std::string o(op);
  if (!x.defined()) throw UsageError(o + ": x must be a defined tensor");
  for (const auto& list : {like_x, per_sample})
    for (const NamedTensor& a : list)
      if (!a.t.defined()) throw UsageError(o + ": " + a.name + " must be a defined tensor");
  if (x.dim() != 3) throw UsageError(o + ": x must be [B, T, D], got shape " + shape(x));
  const int64_t b = x.size(0), d = x.size(2);
  if (d < 1) throw UsageError(o + ": x must have D >= 1 features, got shape " + shape(x));
  for (const NamedTensor& a : like_x)
    if (a.t.sizes() != x.sizes())
      throw UsageError(o + ": " + a.name + " must have x's shape " + shape(x) + ", got " + shape(a.t));
  for (const NamedTensor& a : per_sample)
    if (a.t.dim() != 2 || a.t.size(0) != b || a.t.size(1) != d)
      throw UsageError(o + ": " + a.name + " must be [" + std::to_string(b) + ", " + std::to_string(d) +
                       "] (x is " + shape(x) + "), got " + shape(a.t));
  check_kernel_dtype(op, x.scalar_type(), "x");
  for (const auto& list : {like_x, per_sample})
    for (const NamedTensor& a : list) {
      check_kernel_dtype(op, a.t.scalar_type(), a.name);
      if (a.t.device() != x.device())
        throw UsageError(o + ": x is on " + x.device().str() + " but " + a.name + " is on " + a.t.device().str());
    }
  if (!x.is_cuda()) return;
  if (d > max_cols)
    throw UsageError(o + ": D=" + std::to_string(d) + " is wider than the CUDA kernel takes (" +
                     std::to_string(max_cols) + ")");
  if (b > 65535 || b * x.size(1) > INT32_MAX)
    throw UsageError(o + ": x " + shape(x) + " has too many rows for the CUDA kernel");
}

}  // namespace detail

}  // namespace perftrain::ops
