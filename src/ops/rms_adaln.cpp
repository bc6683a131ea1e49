#include "ops/rms_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/rsqrt.h>

#include <string>

#include "base/error.h"
#include "kernels/rms_adaln.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "rms_adaln";

void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale, at::ScalarType out_dtype) {
  if (scale.defined())
    detail::check_row_op_args(kOp, x, {}, {{"scale", scale}}, kernels::kRmsAdaLNMaxCols);
  else
    detail::check_row_op_args(kOp, x, {}, {}, kernels::kRmsAdaLNMaxCols);
  detail::check_norm_weight(kOp, x, weight, "weight");
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

}  // namespace

namespace detail {

void check_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight, const char* what) {
  if (!weight.defined()) return;
  const std::string o = std::string(op) + ": " + what;
  const int64_t d = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != d)
    throw UsageError(o + " must be [" + std::to_string(d) + "] (x is " + shape(x) + "), got " + shape(weight));
  const at::ScalarType t = weight.scalar_type();
  if (!is_kernel_dtype(t) && t != at::kDouble)
    throw UsageError(o + " must be float32, bfloat16, float16 or float64, got " + c10::toString(t));
  if (weight.device() != x.device())
    throw UsageError(std::string(op) + ": x is on " + x.device().str() + " but " + what + " is on " +
                     weight.device().str());
}

}  // namespace detail

at::Tensor rms_adaln_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                               at::ScalarType out_dtype, double eps) {
  const bool f64 = x.scalar_type() == at::kDouble || (weight.defined() && weight.scalar_type() == at::kDouble) ||
                   (scale.defined() && scale.scalar_type() == at::kDouble);
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct);
  at::Tensor h = xf * at::rsqrt((xf * xf).mean({-1}, /*keepdim=*/true) + eps);
  if (weight.defined()) h = h * weight.to(ct);
  if (scale.defined()) h = h * (scale.to(ct).unsqueeze(1) + 1);
  return h.to(out_dtype);
}

at::Tensor rms_adaln(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                     at::ScalarType out_dtype, double eps) {
  check_args(x, weight, scale, out_dtype);
  // CUDA: kernel pending; the reference (autograd through ATen) until it lands.
  return rms_adaln_reference(x, weight, scale, out_dtype, eps);
}

}  // namespace perftrain::ops
