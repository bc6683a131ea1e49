// Column sums of up to four [rows, cols] matrices in one pass each, in fp32:
//   out_j[c] = sum_r in_j[r, c]
// This is the bias gradient of a linear layer (db = column sums of dY). Why
// not cuBLASLt's BGRADB epilogue: cuBLAS 13.0 runs it as a separate reduction
// after the product at about a third of streaming bandwidth, and the qkv
// projection's gradient blocks would need one each; here all matrices go
// through one launch at streaming bandwidth.
//
// Shape: block (column tile of 256, row chunk, matrix) in the tiling of
// kernels/column_partials.cuh; each block writes one row of fp32 partials
// [matrix][chunk][cols], and a second small kernel adds the chunks in a fixed
// order. Deterministic, no atomics, shape-determined grid and scratch:
// captures in CUDA graphs.
//
// Bytes: reads rows * cols * sizeof(T) per matrix (whatever ld is), writes 4 * cols * (chunks + 1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

constexpr int kColumnSumsMaxMatrices = 4;

// Row chunks per matrix the sums use; the caller allocates partials of
// count * chunks * cols floats.
int column_sums_chunks(int64_t rows, int cols, int count, int sm_count);

// inputs[j] [rows, cols] row-major with rows `ld` elements apart (ld >= cols;
// ld > cols: column blocks of a wider matrix, e.g. the q and v blocks of a
// packed qkv gradient without its k block) (T: float, __nv_bfloat16, __half),
// outputs[j] [cols] fp32, j < count <= kColumnSumsMaxMatrices. partials as above.
template <typename T>
void column_sums(const T* const* inputs, float* const* outputs, int count, int64_t rows, int cols, int64_t ld,
                 float* partials, int chunks, cudaStream_t stream);

// The second step alone, for kernels that write the same fp32 partials
// [count][chunks][cols] themselves (gelu_backward.h), and for any short fp32
// matrix (chunks = its rows, a few thousand at most): outputs[j][c] = the sum
// of matrix j's chunk rows, in a fixed order (rows k = g mod 8 summed per
// group g, then the eight groups in order).
void column_sums_reduce(const float* partials, float* const* outputs, int count, int chunks, int cols,
                        cudaStream_t stream);

}  // namespace perftrain::kernels
