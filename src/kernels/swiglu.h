// SwiGLU's gating from the packed product output, forward and backward:
//   out[r, c] = silu(g) * u,                    g = gate_up[r, c], u = gate_up[r, F + c]
//   dgate_up[r, c]     = dout[r, c] * u * s * (1 + g * (1 - s)),   s = sigmoid(g)
//   dgate_up[r, F + c] = dout[r, c] * silu(g)
// with silu(g) = g / (1 + exp(-g)) as ATen writes it, fp32 math on float,
// __nv_bfloat16 or __half storage and one rounding per stored element. For
// |g| large exp(-g) overflows to inf or underflows to 0, which gives s = 0 or 1
// and finite results (no inf * 0).
//
// Bytes per row (e = element size): forward reads 2F e, writes F e (6F bytes
// in bf16), ~4F FLOPs and F exponentials; backward reads 3F e (dout, gate_up)
// and writes 2F e. Pure streaming: both move each byte once, at 16 bytes per
// access where the row allows it.
//
// Shape: each thread owns VEC adjacent columns of the gate half and the same
// columns of the up half (and of out / dout), VEC the widest of 8, 4, 2, 1
// elements that divides F and keeps every pointer aligned to one access of
// min(16, VEC * e) bytes (so F % 8 == 0, the DiT and 8/3-of-hidden widths,
// moves 16 bytes per bf16 access; an odd F goes element by element). A block
// is tx x ty threads: tx threads across a row's F / VEC vectors (whole warps,
// at most 512, looping when the row is wider; a power of two up to 32 when
// it is narrower, so one warp spans several rows) and ty rows, about 256
// threads; blocks stride over the rows. Nothing is summed, so every rerun
// gives the same bits; the launch depends on the shape and the pointers'
// alignment only, so it captures in CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// The widest F the calls take (the op checks it up front): 2F indexes a row in 32 bits.
constexpr int kSwigluMaxCols = (1 << 30) - 1;

// gate_up [rows, 2F] and out [rows, F] dense row-major; T: float,
// __nv_bfloat16 or __half. out must not overlap gate_up. rows >= 0,
// 1 <= F <= kSwigluMaxCols; std::invalid_argument otherwise.
template <typename T>
void swiglu_forward(const T* gate_up, T* out, int64_t rows, int cols, cudaStream_t stream);

// dout [rows, F], gate_up [rows, 2F] and dgate_up [rows, 2F] dense row-major;
// dgate_up must not overlap the inputs. Sizes as for the forward.
template <typename T>
void swiglu_backward(const T* dout, const T* gate_up, T* dgate_up, int64_t rows, int cols, cudaStream_t stream);

// The elements per access (8, 4, 2 or 1) these calls use for F = cols and
// these pointers (null ones ignored): for the tests of each path.
template <typename T>
int swiglu_vector_width(int cols, const void* a, const void* b, const void* c);

}  // namespace perftrain::kernels
