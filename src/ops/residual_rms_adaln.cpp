#include "ops/residual_rms_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/tanh.h>

#include <string>

#include "base/error.h"
#include "kernels/residual_rms_adaln.h"
#include "ops/dtype_dispatch.h"
#include "ops/rms_adaln.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "residual_rms_adaln";

void check_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& post_weight,
                const at::Tensor& pre_weight, const at::Tensor& scale, at::ScalarType out_dtype) {
  if (scale.defined())
    detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}, {"scale", scale}},
                              kernels::kResidualRmsAdaLNMaxCols);
  else
    detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}}, kernels::kResidualRmsAdaLNMaxCols);
  detail::check_norm_weight(kOp, x, post_weight, "post_weight");
  detail::check_norm_weight(kOp, x, pre_weight, "pre_weight");
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

}  // namespace

std::pair<at::Tensor, at::Tensor> residual_rms_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                               const at::Tensor& y, const at::Tensor& post_weight,
                                                               const at::Tensor& pre_weight, const at::Tensor& scale,
                                                               at::ScalarType out_dtype, double eps) {
  const bool f64 = x.scalar_type() == at::kDouble || gate.scalar_type() == at::kDouble ||
                   y.scalar_type() == at::kDouble ||
                   (post_weight.defined() && post_weight.scalar_type() == at::kDouble);
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor yn = rms_adaln_reference(y, post_weight, at::Tensor(), ct, eps);
  at::Tensor x1 = (x.to(ct) + at::tanh(gate.to(ct)).unsqueeze(1) * yn).to(x.scalar_type());
  at::Tensor h = rms_adaln_reference(x1, pre_weight, scale, out_dtype, eps);
  return {std::move(x1), std::move(h)};
}

std::pair<at::Tensor, at::Tensor> residual_rms_adaln(const at::Tensor& x, const at::Tensor& gate,
                                                     const at::Tensor& y, const at::Tensor& post_weight,
                                                     const at::Tensor& pre_weight, const at::Tensor& scale,
                                                     at::ScalarType out_dtype, double eps) {
  check_args(x, gate, y, post_weight, pre_weight, scale, out_dtype);
  // CUDA: kernel pending; the reference (autograd through ATen) until it lands.
  return residual_rms_adaln_reference(x, gate, y, post_weight, pre_weight, scale, out_dtype, eps);
}

}  // namespace perftrain::ops
