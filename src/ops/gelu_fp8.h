// GELU (tanh) whose output only feeds an fp8 product (issue 39: the fp8 DiT
// MLP's fc2 input): act = gelu_tanh(pre) is not written; one pass over pre
// writes act's E4M3 codes under the consumer's x scale, their transpose (for
// fc2's dW) and act's amax (kernels/fp8_cast.h, the GELU prologue of the
// cast-transpose: pre's 2 bytes read, 2 written, where GELU and the cast
// apart move 8 bytes an element). act is ATen's bf16 gelu(pre, "tanh")
// (its fp32 formula, rounded to bf16), so the codes are the cast of what
// at::gelu would have stored.
//
// CUDA bf16 pre: the fused pass; the backward gives d(pre) =
// gelu_backward(d(act), pre, "tanh") from the output gradient that
// fp8_linear hands to the operand's x. Elsewhere (CPU, fp32): the reference.
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/fp8_cast.h"

namespace perftrain::ops {

// pre [..., F]; target: the consumer's x slot (ops/fp8_linear.h:
// fp8_linear_input_target), on pre's device. Returns {x: a stand-in of act
// carrying the gradient path to pre, codes [M, F], codes_t [F, M]}, or the
// reference's operand. Bad arguments throw UsageError.
Fp8Operand gelu_fp8(const at::Tensor& pre, const Fp8Target& target);

// The reference: at::gelu(pre, "tanh") and its cast (fp8_operand_of; no codes_t).
Fp8Operand gelu_fp8_reference(const at::Tensor& pre, const Fp8Target& target);

}  // namespace perftrain::ops
