#include "ops/gelu_backward.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>

#include "base/error.h"
#include "kernels/gelu_backward.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

void gelu_tanh_backward_(at::Tensor& grad, const at::Tensor& pre, const at::Tensor& sums) {
  if (grad.dim() != 2 || pre.sizes() != grad.sizes() || pre.scalar_type() != grad.scalar_type() ||
      pre.device() != grad.device() || !grad.is_contiguous() || !pre.is_contiguous())
    throw UsageError("gelu_tanh_backward_: grad and pre must be contiguous [M, N] tensors of one dtype and device, got " +
                     shape(grad) + " and " + shape(pre));
  if (sums.defined() && (sums.dim() != 1 || sums.size(0) != grad.size(1) || sums.scalar_type() != at::kFloat ||
                         !sums.is_contiguous() || sums.device() != grad.device()))
    throw UsageError("gelu_tanh_backward_: sums must be a contiguous [" + std::to_string(grad.size(1)) +
                     "] float32 tensor on grad's device, got " + shape(sums));
  if (!grad.is_cuda() || !is_kernel_dtype(grad.scalar_type())) {
    at::gelu_backward_out(grad, grad, pre, "tanh");  // elementwise: in place is safe
    if (sums.defined()) {
      at::Tensor out = sums;  // a handle on the same storage
      at::sum_out(out, grad, {0}, /*keepdim=*/false, at::kFloat);
    }
    return;
  }
  const int64_t rows = grad.size(0);
  const int cols = int(grad.size(1));
  if (cols == 0) return;
  const c10::cuda::CUDAGuard guard(grad.device());
  const int chunks =
      kernels::gelu_backward_chunks(rows, cols, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  // Shape-determined scratch from the caching allocator: fine under capture.
  const at::Tensor partials = sums.defined() ? at::empty({chunks, cols}, sums.options()) : at::Tensor();
  with_kernel_type("gelu_tanh_backward_", grad.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    kernels::gelu_tanh_backward_column_sums<T>(static_cast<T*>(grad.data_ptr()), static_cast<const T*>(pre.data_ptr()),
                                               rows, cols, sums.defined() ? sums.data_ptr<float>() : nullptr,
                                               sums.defined() ? partials.data_ptr<float>() : nullptr, chunks,
                                               at::cuda::getCurrentCUDAStream());
  });
}

}  // namespace perftrain::ops
