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

// The same into given outputs, for one row block of a larger matrix: q
// [rows, cols] dense and q_t [cols, rows] with unit column stride and any row
// stride >= rows (a column block of the whole q^T, as narrow(1, ...) gives),
// in fp8_dtype(f) on x's device; either may be undefined (not written), not
// both. The bytes fp8_cast_transpose would give, and the same amax.
void fp8_cast_into(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                   const at::Tensor& q, const at::Tensor& q_t, const char* op = "fp8_cast_into");

// q^T [cols, rows] of fp8 codes q [rows, cols] (contiguous copy, q's dtype):
// kernels::fp8_transpose on CUDA (1 byte in, 1 out), ATen on the CPU.
at::Tensor fp8_transpose(const at::Tensor& q, const char* op = "fp8_transpose");

namespace detail {
// The cast-transpose with a prologue (kernels/fp8_cast.h, Fp8Prologue), for
// the ops that fuse an activation into their casts (ops/fp8_linear_gelu.h,
// ops/fp8_linear_swiglu.h): src bf16 (d(act) or d(h) for the backward
// prologues, gate_up [rows, 2 cols] for kSwiglu, else [rows, cols]), x2 where
// the prologue reads one (else undefined), into q and q_t of `format`
// (allocated by the caller), max-accumulating amax under scale; column
// partials where defined. CUDA only, arguments unchecked: the callers make them.
void fp8_cast_transpose_prologue(const at::Tensor& src, const at::Tensor& x2, int64_t rows, int64_t cols,
                                 kernels::Fp8Prologue prologue, Fp8Format format, const at::Tensor& scale,
                                 const at::Tensor& amax, const at::Tensor& q, const at::Tensor& q_t,
                                 const at::Tensor& partials);
// The row cast with an activation's forward prologue (kGeluTanh: src [rows,
// cols]; kSwiglu: src gate_up [rows, 2 cols]; bf16) into q [rows, cols] alone
// (allocated by the caller), max-accumulating amax under scale; the same
// codes and amax as the cast-transpose's, without the transpose (for a
// consumer that takes no dW: a forward under no-grad). CUDA only, arguments
// unchecked.
void fp8_cast_activation(const at::Tensor& src, int64_t rows, int64_t cols, kernels::Fp8Prologue prologue,
                         Fp8Format format, const at::Tensor& scale, const at::Tensor& amax, const at::Tensor& q);
}  // namespace detail

// An fp8 linear's input handed over by the kernel that made it (issue 39): a
// norm writes the E4M3 codes of its output h under the consumer's x scale and
// takes their amax in its own pass, so the linear casts nothing.
//   target: the consumer's x slot, one fp32 element each on h's device
//           (ops/fp8_linear.h: fp8_linear_input_target)
//   x:      what autograd sees of h ([..., K], h's dtype), the path of dX back
//           to the norm's backward. Where the codes are all that was written,
//           a stand-in: every element one NaN (zero strides, no storage of
//           its own), never read by the linear
//   codes:  [M, K] E4M3, the bytes fp8_cast(h, target.scale, target.amax)
//           gives (and the same amax); undefined: none (x is h itself, cast
//           by the linear as before)
struct Fp8Target {
  at::Tensor scale, amax;
};
//   codes_t: [K, M] E4M3, codes^T, where the producer wrote it in the same
//           pass (ops/fp8_linear_gelu.h); undefined: fp8_linear transposes codes
struct Fp8Operand {
  at::Tensor x, codes, codes_t;
};

// target's scale and amax: one fp32 element each on like's device (UsageError naming op).
void check_fp8_target(const Fp8Target& target, const at::Tensor& like, const char* op);
// The stand-in for an h that is not written: `sizes` in dtype on device.
at::Tensor fp8_stand_in(at::IntArrayRef sizes, const at::TensorOptions& options);
// An operand from an h that was written: h (with its graph) and the cast of
// its values (no graph), on any device; `op` names h in errors.
Fp8Operand fp8_operand_of(const at::Tensor& h, const Fp8Target& target, const char* op);

// The references, on any device, by ATen: q as above; q's values times
// scale_inv in fp32; max |x| as a 0-d fp32 tensor (0 for an empty x).
at::Tensor fp8_quantize_reference(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);
at::Tensor fp8_dequantize_reference(const at::Tensor& q, const at::Tensor& scale_inv);
at::Tensor fp8_amax_reference(const at::Tensor& x);

}  // namespace perftrain::ops
