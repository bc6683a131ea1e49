// GELU-tanh's backward in place on its incoming gradient, optionally with the
// column sums of the result from the same pass (kernels/gelu_backward.h):
// the MLP's split DGELU path, where those sums are fc1's bias gradient.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// grad [M, N] <- grad * gelu_tanh'(pre) (pre [M, N], same dtype and device,
// both contiguous); sums, when defined, a contiguous [N] fp32 tensor on that
// device, gets the column sums of the new grad. CUDA float32/bfloat16/float16:
// the fused kernel; otherwise ATen's gelu_backward and sum. Bad shapes throw
// UsageError.
void gelu_tanh_backward_(at::Tensor& grad, const at::Tensor& pre, const at::Tensor& sums = at::Tensor());

}  // namespace perftrain::ops
