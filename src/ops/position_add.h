// The position embedding added to the patch embedding's tokens as one
// autograd op (kernels/position_add.h): y + table with the table broadcast
// over the batch, in one vectorised pass instead of ATen's broadcast add.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// y [B, T, D] float32/bfloat16/float16; table [T, D] or [1, T, D] float32, a
// constant (no gradient). Returns y + table as float32 [B, T, D], the same
// values ATen's broadcast add gives (fp32 sums of the same operands). y's
// gradient is the incoming one in y's dtype. CUDA: the fused kernel; a table
// that needs a gradient, other dtypes or the CPU: ATen's y + table. Shapes
// that do not broadcast that way throw UsageError.
at::Tensor position_add(const at::Tensor& y, const at::Tensor& table);

}  // namespace perftrain::ops
