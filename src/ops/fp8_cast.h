// fp8 casts on tensors (issue 39): the amax-fused cast and cast-transpose of
// kernels/fp8_cast.h on CUDA, and the CPU reference that emulates the formats
// exactly through ATen's fp8 dtypes (at::kFloat8_e4m3fn, at::kFloat8_e5m2),
// which is also what these ops run on the CPU. The rule both follow:
//   q = saturate(x * scale): x * scale in fp32, then to the format rounding
//       to nearest even; beyond the max finite (448, 57344), and +-Inf, to
//       +-max finite; NaN to NaN
//   amax = max(amax, max |x|), NaN if x has a NaN, else Inf if it has an Inf
// (ATen's own fp8 conversion does not saturate: E4M3 overflows to NaN, E5M2
// to Inf; the reference clamps to +-max first, which gives the saturating
// conversion's bits: values between max and the next midpoint round down to
// max either way).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/fp8_cast.h"

namespace perftrain::ops {

using kernels::Fp8Format;

// at::kFloat8_e4m3fn or at::kFloat8_e5m2.
at::ScalarType fp8_dtype(Fp8Format f);

// x: a 2-D bf16 or fp32 tensor [rows, cols] (made contiguous); scale: one fp32
// element on x's device (read); amax: one fp32 element on x's device
// (max-accumulated), or undefined. Returns q [rows, cols] in fp8_dtype(f).
// Bad arguments throw UsageError naming `op`.
at::Tensor fp8_cast(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                    const char* op = "fp8_cast");

// q [rows, cols] (undefined unless with_rows) and q_t = q^T [cols, rows],
// contiguous, from one pass over x (CUDA); arguments as fp8_cast's.
struct Fp8Casts {
  at::Tensor q, q_t;
};
Fp8Casts fp8_cast_transpose(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                            bool with_rows = true, const char* op = "fp8_cast_transpose");

// The references, on any device, by ATen: q as above; q's values times
// scale_inv in fp32; max |x| as a 0-d fp32 tensor (0 for an empty x).
at::Tensor fp8_quantize_reference(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);
at::Tensor fp8_dequantize_reference(const at::Tensor& q, const at::Tensor& scale_inv);
at::Tensor fp8_amax_reference(const at::Tensor& x);

}  // namespace perftrain::ops
