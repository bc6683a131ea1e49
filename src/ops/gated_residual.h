// The gated residual update of a DiT block as one autograd function:
//   x + gate[:, None, :] * (y + bias)
// in one pass over x and y (fp32 math, result in x's dtype), where y is the
// attention or MLP output (bf16 under autocast) without the bias of the linear
// layer that made it, and x the fp32 residual stream. The backward writes dy
// and sums dgate (and the bias's gradient, the column sums of dy) over tokens
// deterministically (kernels/gated_residual.h); dx is the incoming gradient
// itself. Folding the bias in here spares the linear layer's backward its own
// reduction over dy.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace perftrain::ops {

// x, y [B, T, D] float32/bfloat16/float16 (any mix); gate [B, D]
// float32/bfloat16/float16 (a strided view is fine; its last dimension must be
// contiguous, else it is copied); bias [D] float32/bfloat16/float16/float64 or
// undefined (= zero; the CUDA kernels read it as float32). Returns [B, T, D] in
// x's dtype. Gradients: x's is the incoming gradient (no copy), y's in y's
// dtype, gate's in gate's dtype, bias's in bias's dtype. CUDA: fused kernels
// (D up to 8192). CPU: gated_residual_reference. Bad shapes, dtypes or devices
// throw UsageError.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                          const at::Tensor& bias = at::Tensor());

// The plain-ATen reference: computed in fp32 (fp64 when any input is fp64),
// the result cast to x's dtype; autograd through ATen gives its backward.
at::Tensor gated_residual_reference(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                    const at::Tensor& bias = at::Tensor());

namespace detail {

// The check both residual ops make on their optional bias: undefined, or
// [D] (D = x.size(-1)) of a floating dtype on x's device; UsageError naming
// `op` otherwise.
void check_residual_bias(const char* op, const at::Tensor& x, const at::Tensor& bias);
// The CUDA backward of gated_residual on its own, what the autograd function
// and the Python op's backward (python/csrc/ops_residual.cpp) both run: the
// gradients of gate, y and (bias_dtype given: in that dtype) the bias from the
// incoming gradient dout and the forward's inputs; each undefined where not
// wanted. x's gradient is dout itself.
struct GatedResidualGrads {
  at::Tensor gate, y, bias;
};
GatedResidualGrads gated_residual_backward_cuda(const at::Tensor& dout, const at::Tensor& gate, const at::Tensor& y,
                                                const at::Tensor& bias, at::ScalarType x_dtype, bool want_gate,
                                                bool want_y, std::optional<at::ScalarType> bias_dtype);

}  // namespace detail

}  // namespace perftrain::ops
