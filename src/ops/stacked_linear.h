// Several linear layers that read the same input, as one product:
//   y = x [W_0; W_1; ...]^T + [b_0; b_1; ...]      -> [..., N_0 + N_1 + ...]
// DiT's adaLN modulations all read silu(c): one product of B rows each per
// block (28 at XL/2), each far below one wave of output tiles, forward and
// twice again backward. Stacked, they are one product forward and one each
// for dX, dW (with the bias column sums) backward, and the gradients of the
// pieces reach the op already joined by the chunk that split its output.
//
// The weights are read without a copy when their compute-dtype copies lie
// back to back in memory (the device optimizer lays copies of one shape out
// that way, train/device_optimizer.h); otherwise they are concatenated on each
// call. The weight and bias gradients are row blocks of one fp32 buffer each
// and go to the weight-gradient stream like linear's (ops/weight_grad_stream.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace perftrain::ops {

// x [..., K] in the compute dtype; weights: n >= 1 tensors [N_i, K], one dtype
// (fp32 masters or x's dtype); biases: none, or one [N_i] per weight (fp32 or
// x's dtype). Returns [..., sum N_i] in x's dtype. Gradients as linear's.
// CPU: the reference. Bad shapes or dtypes throw UsageError.
at::Tensor stacked_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                          const std::vector<at::Tensor>& biases = {});

// The plain-ATen fp32 reference: at::linear on the concatenated weights.
at::Tensor stacked_linear_reference(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    const std::vector<at::Tensor>& biases = {});

namespace detail {
// UsageError for arguments stacked_linear refuses (as documented above).
void check_stacked_linear_args(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                               const std::vector<at::Tensor>& biases);
// The pieces of its autograd function, which the Python operator
// perftrain::stacked_linear runs too (python/csrc/ops_linear.cpp):
// parts (weights or biases) in dtype, stacked (stacked_rows of their
// compute_weight copies);
at::Tensor stacked_weights_in(at::TensorList parts, at::ScalarType dtype);
// y = x w^T + b from the stacked w [N, K] and b [N] (or undefined) in x's dtype;
at::Tensor stacked_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// from dY [..., N]: dX (want_x) in dtype, through w; the stacked weight's
// gradient [N, K] in w_dtype and the bias's [N] in b_dtype where given (one
// product and one column sum, on the weight-gradient stream: ops/
// weight_grad_stream.h), from x2 = x as [M, K]; row_blocks splits them.
struct StackedLinearGrads {
  at::Tensor x, weight, bias;
};
StackedLinearGrads stacked_linear_backward(const at::Tensor& grad, const at::Tensor& x2, const at::Tensor& w,
                                           at::IntArrayRef x_sizes, at::ScalarType dtype, bool want_x,
                                           std::optional<at::ScalarType> w_dtype,
                                           std::optional<at::ScalarType> b_dtype);
// t's row blocks of the given heights, in order (undefined ones for an
// undefined t).
std::vector<at::Tensor> row_blocks(const at::Tensor& t, const std::vector<int64_t>& rows);
// The autograd function on any device (CPU: through the ATen fallbacks).
at::Tensor stacked_linear_function(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                   const std::vector<at::Tensor>& biases);
// The tensors as one [sum of sizes(0), ...] tensor: a view when they lie
// back to back in one storage, each contiguous; else their concatenation.
at::Tensor stacked_rows(const std::vector<at::Tensor>& parts);
}  // namespace detail

}  // namespace perftrain::ops
