// The transformer MLP, fc2(gelu_tanh(fc1(x))), as one autograd function
// with no separate GELU or bias-add kernel on the fused path. Forward: fc1's
// bias and GELU in one product (our Hopper kernel, ops/gemm_bias_gelu.h,
// where it applies; else cuBLASLt's GELU_AUX_BIAS epilogue), keeping the
// pre-activation; fc2's bias in its product's epilogue. Backward: fc2's
// weight gradient and its bias gradient as column sums (ops/column_sums);
// pre's gradient, (dy w2) * gelu_tanh'(pre), and fc1's bias gradient from
// our Hopper kernel (the same product with GELU's backward and the column
// partials in its epilogue), cuBLASLt's DGELU epilogue, or a plain product
// followed by one GELU-backward pass (see DGeluPath).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/cublaslt_workspace.h"  // gemm_fallback_count()

namespace perftrain::ops {

// x [..., C] in the compute dtype (bf16, fp16 or fp32); w1 [H, C], b1 [H],
// w2 [D, H], b2 [D] (b1 required; b2 may be undefined, e.g. when the gated
// residual after the MLP adds it) in fp32 or x's dtype, cast to x's
// dtype per call. Returns [..., D] in x's dtype; gradients as ops::linear.
// Saves for backward x, the cast weights, the pre-activation and the
// activation ([M, H] each; see keep_activation), only those the wanted
// gradients read.
// The fused GELU path needs H % 8 == 0 (cuBLASLt's aux leading dimension);
// other widths, and any epilogue cuBLASLt refuses, run through ATen and are
// counted by gemm_fallback_count(). CPU: gelu_mlp_reference.
// keep_activation: whether the activation is kept for fc2's weight gradient,
// or only the pre-activation, computing the activation again in backward:
// one [M, H] tensor less per MLP held from forward to backward, for one
// elementwise pass in backward. The DiT block passes !gelu_recompute (the
// [speed] key).
at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, bool keep_activation = true);

// Where the backward makes pre's gradient (dy w2) * gelu_tanh'(pre): in
// our Hopper kernel (kernels/gemm_bias_gelu_sm90's gemm_dgelu_sm90: bf16 on
// sm_90, m % 128, H % 256, D % 64), in cuBLASLt's DGELU epilogue of that
// product, or with a plain product and then GELU's backward in place on its
// result (split). cuBLASLt's DGELU kernel is slow on small products (about
// twice the plain product's time at DiT-S/2 b32) and for some larger
// shapes is a pre-Hopper one (DiT-L/2 b128), and it gives no fp32 bias
// gradient with a bf16 output; the split form pays one more pass over two
// [M, H] tensors. So kAuto (the default) times the forms on the first
// backward of a shape when GEMM tuning is on (ops/cublaslt_workspace.h's
// gemm_tune, recorded beside the products' tuning) and keeps the fastest,
// our kernel only where it times 10% under the best other form (timed one
// call at a time it looks faster than it runs in a power-capped step); with
// tuning off, products of more than kSplitDGeluMaxElements outputs take
// cuBLASLt's epilogue and the others the split form. A forced kKernel takes
// the split form where the kernel does not apply. The setter (process-wide)
// is for tests and benchmarks.
enum class DGeluPath { kAuto, kKernel, kEpilogue, kSplit };
constexpr int64_t kSplitDGeluMaxElements = 65536LL * 1536;
DGeluPath gelu_mlp_dgelu_path();
void set_gelu_mlp_dgelu_path(DGeluPath path);
// The size rule between cuBLASLt's epilogue and the split form for a
// backward of `rows` rows and `hidden` MLP features (a forced path, or kAuto
// without timing where our kernel does not apply).
bool gelu_mlp_dgelu_in_epilogue(int64_t rows, int64_t hidden);

// The split form's GELU backward: ATen's gelu_backward (fc1's bias gradient
// summed afterwards, beside the critical path when the weight-gradient
// stream is on) or the fused pass of ops/gelu_backward (the bias gradient
// from the same pass). kAuto: ATen's for the shapes whose weight gradients
// run on the second stream (weight_grad_stream_size_rule of rows and model width),
// where it measured faster, the fused pass otherwise; by shape, so that one
// stream and two give the same bits. The setter is for tests.
enum class GeluBackwardForm { kAuto, kAten, kFused };
GeluBackwardForm gelu_mlp_gelu_backward_form();
void set_gelu_mlp_gelu_backward_form(GeluBackwardForm form);
// The decision for a backward of `rows` rows of width `width` (fc2's output).
bool gelu_mlp_fused_gelu_backward(int64_t rows, int64_t width);

// The plain-ATen fp32 reference: linear, gelu(..., "tanh"), linear on fp32
// copies; returns fp32.
at::Tensor gelu_mlp_reference(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                              const at::Tensor& b2);

namespace detail {
// fc1 with its bias and GELU in one product, what gelu_mlp's forward runs
// (and the Python op linear_gelu): pre = x2 w^T + b and act = gelu_tanh(pre)
// written into the given [m, h] tensors of x2's dtype. x2 [m, c] contiguous,
// w [h, c] in x2's dtype, b [h] contiguous in fp32 or x2's dtype. Our Hopper
// kernel where it applies, else cuBLASLt's GELU_AUX_BIAS epilogue, else ATen
// (counted by gemm_fallback_count() on CUDA).
void linear_bias_gelu_into(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                           const at::Tensor& act);
// gelu_mlp's checks of its arguments (UsageError naming the input).
void check_gelu_mlp_args(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                         const at::Tensor& b2);
// The forward and backward of the autograd function on their own, what it
// and the Python op (python/csrc/ops_mlp.cpp) run, on checked inputs. The
// forward from x2 = x as [M, C] rows (contiguous) and w1, w2 in x2's dtype
// (compute_weight's), into the caller's contiguous tensors of x2's dtype:
// the pre-activation and activation [M, H] that the backward reads, and
// y2 [M, D].
void gelu_mlp_forward_into(const at::Tensor& x2, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                           const at::Tensor& b2, const at::Tensor& pre, const at::Tensor& act, const at::Tensor& y2);
// What the backward reads, as the forward left it; each may be undefined
// where no wanted gradient reads it: x2 (for dW1), w1 (dx), w2 and pre (any
// of fc1's gradients), act (dW2; undefined with pre defined: GELU again).
struct GeluMlpSaved {
  at::Tensor x2, w1, w2, pre, act;
};
// The gradients wanted: dx (in the compute dtype), the parameters' in the
// given dtypes (nullopt: not wanted, left undefined).
struct GeluMlpWanted {
  bool x = false;
  std::optional<at::ScalarType> w1, b1, w2, b2;
};
struct GeluMlpGrads {
  at::Tensor x, w1, b1, w2, b2;
};
// From the incoming gradient of y (any dtype and strides; made dense in
// `dtype`, x's): fc2's weight gradient and its bias's column sums, pre's
// gradient through GELU (our kernel, the DGELU epilogue or the split form:
// DGeluPath), then fc1's; the weight gradients through run_weight_grads
// (ops/weight_grad_stream.h).
GeluMlpGrads gelu_mlp_backward(const at::Tensor& grad, const GeluMlpSaved& saved, at::IntArrayRef x_sizes,
                               at::ScalarType dtype, const GeluMlpWanted& wanted);
// The autograd function on any device (CPU: its ATen fallbacks), for tests.
at::Tensor gelu_mlp_function(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                             const at::Tensor& b2, bool keep_activation = true);
}  // namespace detail

}  // namespace perftrain::ops
