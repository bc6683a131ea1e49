// QK-norm + rotary position embedding on the q and k of a single-stream
// block, one pass: per (token, head) RMSNorm of q and of k over the head
// dimension with their learned weights, then the rotary rotation. v is no
// input: it stays where the qkv projection wrote it, and attention reads it
// there (ops::qkv_attention's three-tensor form).
//
// qk [B, T, 2D] is q | k, each head-major (D = heads * hd, hd even): the first
// 2D columns of the projection's [B, T, 3D] output, read in place through its
// row stride. Returns {q, k}, each [B, T, D] in qk's dtype, views of one dense
// [B, T, 2D] result (rows 2D apart):
//   q: rope(rms(q_h) * q_weight), k: rope(rms(k_h) * k_weight)
// rms(v) = v * rsqrt(mean(v^2 over the head's hd values) + eps); rope rotates
// consecutive pairs (x[2k], x[2k+1]) of the head by the angle whose cos, sin
// are cos[t, k], sin[t, k]: (x0*c - x1*s, x0*s + x1*c) (exactly nn::apply_rope).
// fp32 math, ONE rounding to the output dtype. Two outputs, so that
// attention's dq and dk reach the backward as cuDNN wrote them (no pack).
//
// Backward saves the input (a view of the projection's output, which
// attention keeps anyway for v) and the per-(token, head) fp32 rstd of q and
// k (2 floats per token and head). Not the output: getting the normalised
// input back from it means dividing by the weights (a zero weight has no
// inverse) and reading a value already rounded to the output dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>

#include <cstdint>

namespace perftrain::ops {

// qk [B, T, 2D] float32/bfloat16/float16, its last dimension contiguous and
// its rows evenly strided (a column block of a wider tensor is read in place;
// anything else is copied); heads >= 1 dividing D, hd = D / heads even;
// q_weight, k_weight [hd] floating, on qk's device, or undefined (= ones);
// cos, sin [T, hd/2] float32 on qk's device (fixed tables: no gradient).
// Gradients: qk [B, T, 2D] dense in qk's dtype (q and k through the inverse
// rotation, then the RMSNorm backward per head; an absent gradient of q or k
// counts as zeros), q_weight and k_weight in their dtypes (fp32 partials summed
// in a fixed order, through ops::run_weight_grads). CUDA: the fused kernels
// (kernels/qk_norm_rope.h; hd up to 256). CPU: qk_norm_rope_reference. Bad
// shapes, dtypes or devices throw UsageError naming the op and the input.
std::array<at::Tensor, 2> qk_norm_rope(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                                       const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                       double eps = 1e-6);

// The plain-ATen reference: fp32 math (fp64 when qk, a weight or a table is
// fp64), the result cast to qk's dtype; autograd through ATen gives its
// backward. Takes the same arguments (checked the same way, except that fp64
// is allowed) on any device.
std::array<at::Tensor, 2> qk_norm_rope_reference(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                                                 const at::Tensor& k_weight, const at::Tensor& cos,
                                                 const at::Tensor& sin, double eps = 1e-6);

namespace detail {
// qk_norm_rope's checks of its arguments (UsageError naming the input).
void check_qk_norm_rope_args(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                             const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_attention.cpp) run, on checked inputs (weights
// undefined where absent). out: where to write q | k ([B, T, 2D], rows evenly
// strided and pair-aligned: a column block of the Python op's packed output),
// or undefined for a dense [B, T, 2D] made here. The forward's out, and what
// the backward reads: qk, cos and sin as the kernels read them, the weights as
// dense float32, and the per-(token, head) float32 rstd [B, T, 2, heads].
struct QkNormRopeForward {
  at::Tensor out, qk, rstd, q_weight, k_weight, cos, sin;
};
QkNormRopeForward qk_norm_rope_forward_cuda(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                                            const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                            double eps, const at::Tensor& out = at::Tensor());
// The backward from the incoming gradients of q and of k ([B, T, D] each,
// read in place where their last dimension is contiguous and their rows are
// evenly strided alike: cuDNN's dq, dk, or column blocks of a packed
// gradient; undefined = zeros), the forward's inputs (as given, or as
// QkNormRopeForward holds them) and rstd: d(qk) where wanted (into dqk_out
// when given, as `out` above, else a dense [B, T, 2D]), the weights' gradients
// in the given dtypes (nullopt: not wanted, undefined).
struct QkNormRopeGrads {
  at::Tensor qk, q_weight, k_weight;
};
QkNormRopeGrads qk_norm_rope_backward_cuda(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& qk,
                                           const at::Tensor& rstd, const at::Tensor& q_weight,
                                           const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                           int64_t heads, bool want_qk, std::optional<at::ScalarType> q_dtype,
                                           std::optional<at::ScalarType> k_dtype,
                                           const at::Tensor& dqk_out = at::Tensor());
}  // namespace detail

}  // namespace perftrain::ops
