// act = gelu_tanh(x W^T + b) as the input of an fp8 product (issue 39: the
// fp8 DiT MLP's fc1 and GELU, whose act only fc2 reads): one autograd
// function around fp8_linear's products (ops/fp8_linear.h) with GELU moved
// into the casts on either side, so that neither act nor d(pre) is written:
//   forward   pre = (sx^-1 sw^-1) q(x sx) q(W sw)^T + b    fp8_linear's product, bf16, kept
//             act's E4M3 codes under the consumer's x scale, their transpose
//             (the consumer's dW) and act's amax from one pass over pre
//             (kernels/fp8_cast.h, the GELU prologue): 2 bytes an element
//             read and 2 written, where GELU and the cast apart move 8
//   backward  d(pre) = bf16(d(act) gelu_tanh'(pre)) cast straight from d(act)
//             and pre under the layer's dY scale: its E5M2 codes, their
//             transpose, the dY amax and db's column partials in one pass
//             (the GELU-backward prologue): 4 bytes read and 2 written, where
//             GELU's backward, the cast-transpose and the column sums apart
//             move 12; then dX and dW are fp8_linear's products, db the
//             partials' sum
// Each code is the byte fp8_linear, at::gelu and the consumer's cast give
// (forward), and at::gelu_backward and fp8_linear's dY cast (backward): the
// prologues follow ATen's formulas; db adds the same values in another order.
// Under no-grad (sampling) act's codes come from a row pass over pre, with no
// transpose (codes_t undefined) and nothing saved.
//
// CUDA with bf16 x: the fused function. Elsewhere (CPU, fp32): the reference.
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/fp8_cast.h"
#include "ops/fp8_scaling.h"

namespace perftrain::ops {

// x: fc1's input (its codes where a norm wrote them, ops/fp8_cast.h:
// Fp8Operand), weight [N, K], bias [N] or undefined, state: fc1's
// (make_fp8_linear_scaling), act_target: the consumer's x slot
// (fp8_linear_input_target of its state). Returns the consumer's operand:
// {x: a stand-in of act [..., N] carrying the gradient path to x, W and b,
// codes [M, N], codes_t [N, M] (undefined under no-grad)}, or the
// reference's operand. Bad arguments
// throw UsageError (fp8_linear's checks, the target's).
Fp8Operand fp8_linear_gelu(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias,
                           const Fp8Scaling& state, const Fp8Target& act_target);

// The reference: fp8_linear(x, weight, bias, state), at::gelu(pre, "tanh")
// and its cast (fp8_operand_of: act written, no codes_t); autograd composes
// the backward.
Fp8Operand fp8_linear_gelu_reference(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias,
                                     const Fp8Scaling& state, const Fp8Target& act_target);

// Whether fp8_linear_gelu runs x's shape with a weight of n rows feeding a
// consumer of next_n outputs: fp8_linear_supported for both products.
bool fp8_linear_gelu_supported(const at::Tensor& x, int64_t n, int64_t next_n);

}  // namespace perftrain::ops
