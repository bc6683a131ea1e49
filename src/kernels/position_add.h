// Adding a per-position table to a batch of token rows, as DiT does with its
// fixed sin-cos position embedding after the patch embedding:
//   out[r, :] = y[r, :] + table[r % period, :]          (fp32 math, out fp32)
// y [rows, cols] is the patch product (bf16 under autocast), table [period,
// cols] fp32, out [rows, cols] fp32: the residual stream. ATen does this as a
// broadcast add with a dtype promotion, which takes its non-vectorised
// elementwise kernel (~1.6 TB/s on the H200); this one moves 16 bytes of y
// per thread and the same bytes as ATen (y read once, out written once, the
// table from L2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// T: float, __nv_bfloat16 or __half. y and out dense row-major, table dense
// [period, cols]; rows a multiple of period. out must not overlap y or table.
template <typename T>
void position_add(const T* y, const float* table, float* out, int64_t rows, int period, int cols,
                  cudaStream_t stream);

}  // namespace perftrain::kernels
