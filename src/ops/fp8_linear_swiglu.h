// h = silu(gate) * up, [gate | up] = x [W_gate; W_up]^T, as the input of an
// fp8 product (issue 39: the fp8 single-stream FFN's gate-up product and
// SwiGLU, whose h only ffn.down reads): one autograd function around
// fp8_linear's products (ops/fp8_linear.h; the gate and up weights as row
// blocks of one product, cast in place) with SwiGLU moved into the casts on
// either side, so that neither h nor d(gate_up) is written:
//   forward   gate_up = (sx^-1 sw^-1) q(x sx) q([W_gate; W_up] sw)^T   bf16 [M, 2F], kept
//             h's E4M3 codes under the consumer's x scale, their transpose
//             (the consumer's dW) and h's amax from one pass over gate_up
//             (kernels/fp8_cast.h, the SwiGLU prologue): 4 bytes read and 2
//             written an element of h, where SwiGLU and the cast apart move 10
//   backward  d(gate_up) = SwiGLU's backward from d(h) and gate_up, cast
//             straight to E5M2 under the layer's dY scale with its transpose
//             and the dY amax (the SwiGLU-backward prologue: 6 bytes read and
//             4 written an element of h, where SwiGLU's backward and the
//             cast-transpose apart move 18); then dX and each weight's dW
//             (its row block of one buffer) are fp8_linear's products
// Each code is the byte fp8_linear, ops::swiglu and the consumer's cast give
// (forward), and ops::swiglu's backward and fp8_linear's dY cast (backward):
// the prologues follow kernels/swiglu's formulas.
// Under no-grad (sampling) h's codes come from a row pass over gate_up, with
// no transpose (codes_t undefined), no operand transposes and nothing saved.
//
// CUDA with bf16 x: the fused function. Elsewhere (CPU, fp32): the reference.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ops/fp8_cast.h"
#include "ops/fp8_scaling.h"

namespace perftrain::ops {

// x: the product's input (its codes where a norm wrote them, ops/fp8_cast.h:
// Fp8Operand); weights: {W_gate, W_up}, each [F, K] (one dtype); state: the
// product's (make_fp8_linear_scaling); act_target: the consumer's x slot
// (fp8_linear_input_target of its state). Returns the consumer's operand:
// {x: a stand-in of h [..., F] carrying the gradient path to x and the
// weights, codes [M, F], codes_t [F, M] (undefined under no-grad)}, or the
// reference's operand. Bad
// arguments throw UsageError (fp8_linear's checks, two blocks of one F, the
// target's).
Fp8Operand fp8_linear_swiglu(const Fp8Operand& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state,
                             const Fp8Target& act_target);

// The reference: fp8_linear(x, weights, state), ops::swiglu and its cast
// (fp8_operand_of: h written, no codes_t); autograd composes the backward.
Fp8Operand fp8_linear_swiglu_reference(const Fp8Operand& x, const std::vector<at::Tensor>& weights,
                                       const Fp8Scaling& state, const Fp8Target& act_target);

// Whether fp8_linear_swiglu runs x's shape with gate and up weights of f rows
// each feeding a consumer of next_n outputs: fp8_linear_supported for both
// products.
bool fp8_linear_swiglu_supported(const at::Tensor& x, int64_t f, int64_t next_n);

}  // namespace perftrain::ops
