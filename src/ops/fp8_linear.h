// y = x W^T (+ b) with fp8 products (issue 39), as one autograd function:
//   forward  y  = (sx^-1 sw^-1) q(x sx) q(W sw)^T (+ b)       E4M3 x E4M3, fast accumulation
//   backward dX = (sd^-1 sw^-1) q(dY sd) q(W sw)^T^T           E5M2 x E4M3 (W^T from the cast-transpose)
//            dW = (sd^-1 sx^-1) q(dY sd)^T q(x sx)             E5M2 x E4M3 (both transposed copies), fp32
//            db = the column sums of dY (in bf16 / x's dtype, not quantised)
// where q is the saturating fp8 cast (ops/fp8_cast.h) and sx, sw, sd the
// delayed scales of the layer's Fp8Scaling (slots kFp8X, kFp8W, kFp8Dy; the
// casts max-accumulate its amax, and the caller runs fp8_scaling_update once
// a step, after the backward). Every product takes both operands K-major, so
// x, W and dY are each cast once, with their transposes from the same pass
// where a gradient needs them. The state is the caller's: a checkpoint saves
// its named_tensors().
//
// CUDA: the casts are kernels/fp8_cast's, the products cuBLASLt's fp8 ones
// (try_gemm_lt_fp8; a product cuBLASLt refuses, e.g. a bias epilogue it
// does not take, runs as the dequantised ATen product, counted by
// gemm_fallback_count()). M, K and N must be multiples of 16 there
// (fp8_linear_supported says whether: else UsageError, and the caller uses
// ops::linear). CPU: the same function on the references (any sizes), so
// CPU tests check the hand-written backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ops/fp8_cast.h"
#include "ops/fp8_scaling.h"

namespace perftrain::ops {

// The slots of a linear layer's Fp8Scaling.
constexpr int kFp8X = 0;   // the input, E4M3
constexpr int kFp8W = 1;   // the weight, E4M3
constexpr int kFp8Dy = 2;  // the output gradient, E5M2
Fp8Scaling make_fp8_linear_scaling(int64_t history_len, const at::Device& device);

// x [..., K] bf16 or fp32; weight [N, K] and bias [N] (may be undefined) fp32
// or x's dtype; state from make_fp8_linear_scaling on x's device. Returns
// [..., N] in x's dtype; gradients: x's in x's dtype, weight's and bias's in
// their own dtypes. Bad arguments throw UsageError.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Scaling& state);
// The same with x handed over as codes (ops/fp8_cast.h, Fp8Operand; written
// for fp8_linear_input_target(state)): x's cast is not made, x^T for dW comes
// from fp8_transpose of the codes, and dX flows back to x.x (in its dtype).
// The same bytes, so the same y and gradients as fp8_linear(h, ...). Codes
// undefined: fp8_linear(x.x, ...).
at::Tensor fp8_linear(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Scaling& state);

// The same for a weight given as its row blocks [N_i, K] (at least one, one K,
// one dtype), no bias (issue 39: the gate and up weights of a SwiGLU FFN): the
// product is the one on their concatenation [sum N_i, K], but none is made:
// the weight's cast reads each block in place and writes its codes at its row
// offset (ops/fp8_cast.h, fp8_cast_into), the W slot's amax the max over all
// blocks; each block's gradient is its row block of one dW buffer. The same
// bytes, y and gradients as fp8_linear on the concatenation. Bad blocks
// (none, mismatched K or dtype) throw UsageError.
at::Tensor fp8_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state);
at::Tensor fp8_linear(const Fp8Operand& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state);

// Where a kernel writes a linear's input codes for `state` (its x slot).
Fp8Target fp8_linear_input_target(const Fp8Scaling& state);

// Whether fp8_linear runs x's shape: any on the CPU; on CUDA M (the rows of
// x), K and N multiples of 16.
bool fp8_linear_supported(const at::Tensor& x, const at::Tensor& weight);
// The same for a weight of n rows (output features).
bool fp8_linear_supported(const at::Tensor& x, int64_t n);

// The fp32 references, with the state's current scales (its amax untouched):
// y = dq(q(x)) dq(q(W))^T + b, and the three gradients from dY as above.
at::Tensor fp8_linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const Fp8Scaling& state);
struct Fp8LinearGrads {
  at::Tensor dx, dw, db;  // fp32
};
Fp8LinearGrads fp8_linear_backward_reference(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                             const Fp8Scaling& state);

}  // namespace perftrain::ops
