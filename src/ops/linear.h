// y = x W^T + b on Tensor Cores through cuBLASLt, as one autograd function:
// the bias rides in the product's epilogue, and the backward's weight
// gradient is written straight in fp32; the bias gradient comes from the
// column-sum kernel (ops/column_sums). The DiT block's attention projection
// and final layers use it; qkv goes through projected_attention, the MLP
// through gelu_mlp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "ops/cublaslt_workspace.h"  // gemm_fallback_count()

namespace torch::autograd {
struct AutogradContext;
}

namespace perftrain::ops {

// x [..., K] in the compute dtype (bf16, fp16 or fp32; any leading dims),
// weight [N, K] and bias [N] (may be undefined) in fp32 (master parameters)
// or in x's dtype; they are cast to x's dtype for the product on each call.
// Returns [..., N] in x's dtype. Gradients: x's in x's dtype, weight's and
// bias's in their own dtypes (fp32 accumulation, written without a
// round-trip through bf16). CUDA: cuBLASLt, falling back to ATen where it
// refuses (counted by gemm_fallback_count()). CPU: linear_reference.
// Bad shapes or dtypes throw UsageError.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = at::Tensor());

// The same layer with its output split into column blocks of the given
// widths (positive, adding up to N): the blocks [..., widths[i]], views of one
// product, each a separate output with its own incoming gradient. The
// backward reads each block's gradient in place (no [..., N] gradient is
// assembled): dW's (and db's) row block i from block i's gradient, and dx as
// the sum of the blocks' products, each after the first accumulating into
// dx; an absent block gradient counts as zeros. The single-stream block's qkv
// projection: q | k goes on to QK-norm + RoPE, v straight to attention.
// CPU: linear_reference, split. Bad widths: UsageError naming them.
std::vector<at::Tensor> linear_column_blocks(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                             const std::vector<int64_t>& widths);

// The plain-ATen fp32 reference: at::linear on fp32 copies; returns fp32.
at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = at::Tensor());

namespace detail {

// The autograd function itself on any device: on CUDA what linear() runs;
// on CPU its products run through the same ATen fallbacks the CUDA path
// uses when cuBLASLt refuses, so CPU tests check the hand-written backward.
at::Tensor linear_function(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// linear_column_blocks' autograd function on any device, likewise.
std::vector<at::Tensor> linear_column_blocks_function(const at::Tensor& x, const at::Tensor& weight,
                                                      const at::Tensor& bias, const std::vector<int64_t>& widths);
// linear_column_blocks' argument checks (UsageError).
void check_column_blocks(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const std::vector<int64_t>& widths);

// Throws UsageError unless x [..., K], weight [N, K], bias [N] or undefined
// fit together (op names the op in the message: "linear", "gelu_mlp fc1").
void check_linear_args(const char* op, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// The weight/bias half of it, for an input of K features in `dtype` on `device`.
void check_linear_params(const char* op, int64_t k, at::ScalarType dtype, at::Device device, const at::Tensor& weight,
                         const at::Tensor& bias);

// The product of x's sizes but the last: the rows of x seen as [M, K].
int64_t leading_rows(const at::Tensor& x);
int64_t leading_rows(at::IntArrayRef sizes);

// What a linear layer's backward needs of its forward's arguments (x
// [..., K], weight [N, K], bias [N] or undefined), kept in an autograd
// context's saved_data by the forward (ops linear and fp8_linear).
struct LinearShapes {
  std::vector<int64_t> x_sizes;
  int64_t m = 0, n = 0;  // x's rows as [M, K]; output features
  at::ScalarType dtype = at::kFloat, w_dtype = at::kFloat;  // x's (the compute dtype), weight's
  std::optional<at::ScalarType> b_dtype;                    // none without a bias
};
void save_linear_shapes(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias);
LinearShapes saved_linear_shapes(torch::autograd::AutogradContext* ctx);

// The three products of a linear layer on 2-D contiguous tensors, each
// through cuBLASLt (with its fused epilogue) on CUDA, else plain ATen (counted as a
// fallback on CUDA). x2 [M, K], w [N, K] in x2's dtype, dy [M, N]. Outputs
// are written into preallocated contiguous tensors, so that an op can hand
// back a tensor of its caller's shape that is not a view.
// y2 [M, N] = x2 w^T + bias, in x2's dtype (bias fp32 or x2's dtype, or undefined).
void linear_forward_product(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& y2);
// dx2 [M, K] = dy w, in dy's dtype; with accumulate, dx2 += dy w (the input
// gradient of a layer whose output gradient arrives in column blocks).
void linear_input_grad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& dx2, bool accumulate = false);
// dW = dy^T x2 and db = the column sums of dy, into preallocated contiguous
// dw [N, K] and db [N] in their own dtypes (either may be undefined), e.g.
// row blocks of a larger weight's gradient.
void linear_weight_grad_into(const at::Tensor& dy, const at::Tensor& x2, const at::Tensor& dw, const at::Tensor& db);

// The forward and backward of the autograd function on their own, what it
// and the Python op (python/csrc/ops_mlp.cpp) run, on checked inputs.
// y [x_sizes but N last] = x2 w^T + bias in x2's dtype, from x2 = x as [M, K]
// rows (contiguous), w [N, K] in x2's dtype (compute_weight's) and bias [N]
// (fp32 or x2's dtype, or undefined).
at::Tensor linear_forward(const at::Tensor& x2, at::IntArrayRef x_sizes, const at::Tensor& w, const at::Tensor& bias);
// From the incoming gradient of y (any dtype and strides; made dense in
// `dtype`, x's), x2 and w as the forward read them (each may be undefined
// where no wanted gradient reads it: x2 for dW, w for dx): dx of x_sizes in
// `dtype` (want_x), dW and db in the given dtypes (nullopt: not wanted, left
// undefined), written directly (fp32 for master weights); dW and db through
// run_weight_grads (ops/weight_grad_stream.h), db as column sums.
struct LinearGrads {
  at::Tensor x, weight, bias;
};
LinearGrads linear_backward(const at::Tensor& grad, const at::Tensor& x2, const at::Tensor& w,
                            at::IntArrayRef x_sizes, at::ScalarType dtype, bool want_x,
                            std::optional<at::ScalarType> weight_dtype, std::optional<at::ScalarType> bias_dtype);

}  // namespace detail
}  // namespace perftrain::ops
