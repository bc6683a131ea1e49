// Casts to fp8 with the input's amax fused in, for fp8 matrix products
// (issue 39): a bf16 or fp32 matrix x [rows, cols] (dense, row-major) to
//   q = saturate(x * scale)   in E4M3 (max finite 448) or E5M2 (57344),
// rounding to nearest even (cuda_fp8.h's __NV_SATFINITE conversion: a finite
// value beyond the max finite, and +-Inf, become +-max finite; NaN stays NaN;
// values below half the smallest subnormal become zero), where `scale` is a
// device float (the tensor's delayed scale, kernels/fp8_scaling.h), and
//   *amax = max(*amax, max |x|)
// over the input (not the scaled value), with NaN > Inf > any finite value:
// an atomic max on the bit pattern of |x| (the non-negative floats order as
// their bits, and every NaN's bits lie above Inf's), so a NaN or Inf
// anywhere reaches *amax and the scaling sees it. *amax must hold a
// non-negative value or NaN (0 before a step's first cast:
// fp8_scaling_update zeroes it after reading it). Max is order-free, so the
// result is deterministic. No allocation, no host sync: capturable.
//
// fp8_cast: q [rows, cols] only. One pass over n = rows * cols elements, 8
//   per thread and iteration (a 16-byte bf16 or two 16-byte fp32 loads, one
//   8-byte store) where the pointers allow (and with the SwiGLU prologue, cols
//   is a multiple of 8), else element by element; 256
//   threads a block, at most 8 blocks per SM, grid-stride. Bytes: n * (2 or
//   4) read + n written. One atomicMax per block.
// fp8_cast_transpose: q [rows, cols] (may be null: only the transpose) and
//   q_t [cols, rows] = q^T in one pass (TransformerEngine's cast-transpose):
//   Hopper's fp8 products take both operands K-major, so the backward's
//   operands (x^T for dW, W^T for dX, dY^T for dW) come from here and not
//   from a separate transpose. A block takes a 64 x 64 tile (256 threads, 16
//   elements each), the fp8 tile through shared memory. Where rows and cols
//   are multiples of 16 and x, q, q_t 16-byte aligned, a whole tile goes 16
//   elements a thread: 16 consecutive of a row loaded (32 or 64 bytes), cast,
//   stored as 16 bytes of q, and 16 consecutive bytes of a q_t row gathered
//   from shared memory and stored as one 16-byte vector; edge tiles and other
//   sizes go element by element (a warp along 32 consecutive elements of a
//   row, then of a q_t row). Bytes: n * (2 or 4) read + 2n written (n
//   without q). q_t's rows may lie q_t_ld apart: the cast of one row block
//   W_i of a weight [W_0; W_1; ...] writes its codes into the column block of
//   the whole q_t (a vector tile then also needs q_t_ld a multiple of 16).
//   With col_partials, the same pass also writes the column sums of the
//   values cast, a row of fp32 partials per 64-row tile row:
//     col_partials[t, c] = sum over r in [64 t, 64 t + 64) of v[r, c]
//   ([fp8_cast_partial_rows(rows), cols]; a tile adds its rows in groups,
//   then the groups in order: deterministic), so that the bias gradient of
//   the product the codes feed is one small reduction of these (ops/
//   column_sums.h, batch_sums_into) and not another read of the matrix.
//   Bytes: + 4 cols per 64 rows written.
// fp8_transpose: q_t [cols, rows] = q^T of fp8 bits q [rows, cols] (either
//   format: bytes), for an operand whose codes another kernel wrote (a norm's
//   fused output, Fp8RowOut) and whose transpose a backward product needs.
//   The cast-transpose's tiles and shape (64 x 64 a block of 256 threads, 16
//   bytes a thread in and out where rows, cols are multiples of 16 and the
//   pointers 16-byte aligned, else byte by byte). Bytes: n read + n written.
// Fp8RowOut: what a row kernel (kernels/row_norm.cuh: adaln_layernorm,
//   residual_adaln, rms_adaln, residual_rms_adaln) takes to write the E4M3
//   codes of its output h beside it, or in its place, for the fp8 product that
//   reads h: q = saturate(h_stored * scale) and *amax = max(*amax, max
//   |h_stored|), h_stored = h as its 16-bit (or fp32) type stores it, so the
//   same bytes and amax bits as fp8_cast of the stored h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

enum class Fp8Format { kE4M3, kE5M2 };

// The largest finite values: E4M3 1.75 * 2^8, E5M2 1.75 * 2^15.
constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::kE4M3 ? kFp8E4M3Max : kFp8E5M2Max; }
const char* fp8_format_name(Fp8Format f);

enum class Fp8Source { kF32, kBF16 };
// What is cast (the amax and column sums are of it too):
//   kNone              x itself;
//   kGeluTanh          act = gelu_tanh(x) rounded to bf16 (bf16 x only), the
//                      bytes ATen's bf16 gelu(x, "tanh") stores, so that a
//                      GELU feeding an fp8 product writes act's codes (and
//                      amax) straight from its input: n * 2 read + n (or 2n
//                      with q_t) written, where GELU and the cast apart read
//                      and write act too;
//   kGeluTanhBackward  d(pre) = x * gelu_tanh'(x2) rounded to bf16 (bf16 x =
//                      d(act) and x2 = pre), the bytes ATen's bf16
//                      gelu_backward(x, x2, "tanh") stores, so that the
//                      gradient of the product that made pre is cast (with
//                      its transpose and column sums) straight from GELU's
//                      backward: n * 4 read + 2n written, where GELU's
//                      backward, the cast-transpose and the bias's column
//                      sums apart move 12n.
//   kSwiglu            h = silu(gate) * up rounded to bf16, x = gate_up [rows,
//                      2 cols] bf16 (gate in columns [0, cols), up in [cols,
//                      2 cols)): the bytes kernels/swiglu.h's forward stores,
//                      so that SwiGLU feeding an fp8 product writes h's codes
//                      from gate_up: n * 4 read + 2n written (n with fp8_cast,
//                      no transpose), where SwiGLU and the cast apart move 10n
//                      (n = rows * cols);
//   kSwigluBackward    d(gate_up) [rows, 2 cols] from x = d(h) [rows, cols] and
//                      x2 = gate_up [rows, 2 cols] (bf16; cast-transpose
//                      only, its own kernel): d(gate) and d(up) rounded to
//                      bf16 as kernels/swiglu.h's backward stores them, their
//                      codes into q [rows, 2 cols] (columns c and cols + c)
//                      and q_t [2 cols, rows] (rows c and cols + c), the amax
//                      over both: n * 6 read + 4n written, where SwiGLU's
//                      backward and the cast-transpose of d(gate_up) apart
//                      move 18n. No column partials.
// The GELU values follow ATen's fp32 formulas in ATen's order (tanhf), the
// SwiGLU ones kernels/swiglu's (expf).
enum class Fp8Prologue { kNone, kGeluTanh, kGeluTanhBackward, kSwiglu, kSwigluBackward };

struct Fp8CastArgs {
  const void* x = nullptr;  // [rows, cols], dense row-major, in x_type
  Fp8Source x_type = Fp8Source::kBF16;
  int64_t rows = 0, cols = 0;
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale = nullptr;  // device scalar (read)
  uint8_t* q = nullptr;          // [rows, cols] fp8 bits
  uint8_t* q_t = nullptr;        // [cols, rows] fp8 bits (cast-transpose only)
  int64_t q_t_ld = 0;            // q_t's row pitch in bytes (>= rows; 0: rows)
  float* amax = nullptr;         // device scalar (max-accumulated); null: not taken
  Fp8Prologue prologue = Fp8Prologue::kNone;  // what is cast: x, or a GELU of it (above)
  const void* x2 = nullptr;  // the backward prologues only: pre [rows, cols] / gate_up [rows, 2 cols] bf16, dense
  float* col_partials = nullptr;  // cast-transpose only: [fp8_cast_partial_rows(rows), cols] fp32; null: none
};

// The rows of fp8_cast_transpose's column partials for `rows` rows: one per 64.
int64_t fp8_cast_partial_rows(int64_t rows);

// A row kernel's fp8 output (q null: none): q [rows, cols] E4M3 bits, scale
// a device scalar (read), amax a device scalar (max-accumulated, not null).
struct Fp8RowOut {
  uint8_t* q = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
};

// Throw std::invalid_argument on misuse (null x, scale or output, negative
// sizes, a q_t, col_partials or SwiGLU backward prologue given to fp8_cast, x2
// without a backward prologue or such a prologue without x2, a prologue on
// fp32 x, SwiGLU's backward without q or with col_partials). Nothing runs
// for an empty matrix.
void fp8_cast(const Fp8CastArgs& args, cudaStream_t stream);
void fp8_cast_transpose(const Fp8CastArgs& args, cudaStream_t stream);
// Throws std::invalid_argument on null pointers or negative sizes.
void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* q_t, cudaStream_t stream);

}  // namespace perftrain::kernels
