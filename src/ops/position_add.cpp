#include "ops/position_add.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "base/error.h"
#include "kernels/position_add.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

struct PositionAddFunction : public torch::autograd::Function<PositionAddFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y_in, const at::Tensor& table_in) {
    const c10::cuda::CUDAGuard guard(y_in.device());
    const at::Tensor y = y_in.contiguous(), table = table_in.contiguous();
    const int64_t period = y.size(1), cols = y.size(2);
    at::Tensor out = at::empty(y.sizes(), y.options().dtype(at::kFloat));
    with_kernel_type("position_add", y.scalar_type(), [&](auto ty) {
      using T = kernel_type<decltype(ty)>;
      kernels::position_add<T>(static_cast<const T*>(y.data_ptr()), table.data_ptr<float>(), out.data_ptr<float>(),
                               y.size(0) * period, int(period), int(cols), at::cuda::getCurrentCUDAStream());
    });
    ctx->saved_data["y_dtype"] = int64_t(y.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto y_dtype = static_cast<at::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    const at::Tensor& g = grads[0];
    return {g.defined() ? g.to(y_dtype) : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor position_add(const at::Tensor& y, const at::Tensor& table) {
  if (!y.defined() || !table.defined()) throw UsageError("position_add: y and table must be defined tensors");
  if (y.dim() != 3) throw UsageError("position_add: y must be [B, T, D], got " + shape(y));
  const at::Tensor t2 = table.dim() == 3 && table.size(0) == 1 ? table.squeeze(0) : table;
  if (t2.dim() != 2 || t2.size(0) != y.size(1) || t2.size(1) != y.size(2))
    throw UsageError("position_add: table must be [T, D] or [1, T, D] = [" + std::to_string(y.size(1)) + ", " +
                     std::to_string(y.size(2)) + "] to match y " + shape(y) + ", got " + shape(table));
  if (t2.device() != y.device())
    throw UsageError("position_add: y is on " + y.device().str() + " but the table on " + t2.device().str());
  const bool fused = y.is_cuda() && is_kernel_dtype(y.scalar_type()) && t2.scalar_type() == at::kFloat &&
                     !t2.requires_grad() && y.numel() > 0 && y.size(0) * y.size(1) <= INT32_MAX;
  if (!fused) return y + table;
  return PositionAddFunction::apply(y, t2);
}

}  // namespace perftrain::ops
