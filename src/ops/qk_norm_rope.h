// QK-norm + rotary position embedding on the packed qkv of a single-stream
// block, one pass: per (token, head) RMSNorm of q and of k over the head
// dimension with their learned weights, then the rotary rotation; v copied.
//
// qkv [B, T, 3D] packed as view(B, T, 3, H, hd) (q | k | v, each head-major),
// D = heads * hd, hd even. Returns out [B, T, 3D] in qkv's dtype, same packing:
//   q part: rope(rms(q_h) * q_weight), k part: rope(rms(k_h) * k_weight), v part: v (copied)
// rms(v) = v * rsqrt(mean(v^2 over the head's hd values) + eps); rope rotates
// consecutive pairs (x[2k], x[2k+1]) of the head by the angle whose cos, sin
// are cos[t, k], sin[t, k]: (x0*c - x1*s, x0*s + x1*c) (exactly nn::apply_rope).
// fp32 math, ONE rounding to the output dtype. The caller views out as q, k, v
// [B, H, T, hd] (strided, hd contiguous) for attention.
//
// Backward saves the input qkv and the per-(token, head) fp32 rstd of q and k
// (2 floats per token and head). Not the output, though attention keeps it
// anyway: getting the normalised input back from it means dividing by the
// weights (a zero weight has no inverse) and reading a value already rounded
// to the output dtype; the input is exact and costs one extra [B, T, 3D]
// tensor of the compute dtype per block.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include <cstdint>

namespace perftrain::ops {

// qkv [B, T, 3D] float32/bfloat16/float16 (a view whose last dimension is
// contiguous is fine; otherwise copied); heads >= 1 dividing D, hd = D / heads
// even; q_weight, k_weight [hd] floating, on qkv's device, or undefined
// (= ones); cos, sin [T, hd/2] float32 on qkv's device (fixed tables: no
// gradient). Gradients: qkv [B, T, 3D] in qkv's dtype (the v part passes
// through; q and k through the inverse rotation, then the RMSNorm backward per
// head), q_weight and k_weight in their dtypes (fp32 partials summed in a
// fixed order, through ops::run_weight_grads). CUDA: the fused kernels
// (kernels/qk_norm_rope.h; hd up to 256). CPU: qk_norm_rope_reference. Bad
// shapes, dtypes or devices throw UsageError naming the op and the input.
at::Tensor qk_norm_rope(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight,
                        const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps = 1e-6);

// The plain-ATen reference: fp32 math (fp64 when qkv, a weight or a table is
// fp64), the result cast to qkv's dtype; autograd through ATen gives its
// backward. Takes the same arguments (checked the same way, except that fp64
// is allowed) on any device.
at::Tensor qk_norm_rope_reference(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight,
                                  const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                  double eps = 1e-6);

namespace detail {
// qk_norm_rope's checks of its arguments (UsageError naming the input).
void check_qk_norm_rope_args(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight,
                             const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_attention.cpp) run, on checked inputs (weights
// undefined where absent). The forward's out, and what the backward reads:
// qkv, cos and sin as the kernels read them, the weights as dense float32,
// and the per-(token, head) float32 rstd [B, T, 2, heads].
struct QkNormRopeForward {
  at::Tensor out, qkv, rstd, q_weight, k_weight, cos, sin;
};
QkNormRopeForward qk_norm_rope_forward_cuda(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight,
                                            const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                            double eps);
// The backward from the incoming gradient of out, the forward's inputs (as
// given, or as QkNormRopeForward holds them) and rstd: d(qkv) where wanted,
// the weights' gradients in the given dtypes (nullopt: not wanted, undefined).
struct QkNormRopeGrads {
  at::Tensor qkv, q_weight, k_weight;
};
QkNormRopeGrads qk_norm_rope_backward_cuda(const at::Tensor& dout, const at::Tensor& qkv, const at::Tensor& rstd,
                                           const at::Tensor& q_weight, const at::Tensor& k_weight,
                                           const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                                           bool want_qkv, std::optional<at::ScalarType> q_dtype,
                                           std::optional<at::ScalarType> k_dtype);
}  // namespace detail

}  // namespace perftrain::ops
