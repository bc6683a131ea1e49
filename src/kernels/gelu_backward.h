// GELU-tanh's backward in place, with the column sums of its result in the
// same pass:
//   g[r, c] <- g[r, c] * gelu_tanh'(pre[r, c])     (stored in T)
//   sums[c]  = sum_r g[r, c]                        (fp32, of the stored values)
// In the MLP's backward g is (dy w2), the product back through fc2; the
// result is fc1's output gradient and its column sums are fc1's bias
// gradient. As two passes (ATen's gelu_backward, then ops/column_sums) the
// result is written and then read again (200 MB per block at DiT-S/2 b256);
// here the sums come from the values still in registers.
//
// gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2), t = tanh(k (x + a x^3)),
// k = sqrt(2/pi), a = 0.044715, in fp32 as ATen computes it; tanh here is
// 1 - 2 / (exp(2u) + 1) with the fast exp and divide (absolute error ~1e-7
// in t, far below the bf16 rounding of the result).
//
// Shape: the tiling of kernels/column_sums (kernels/column_partials.cuh;
// here 4 rows per thread in flight), its fp32 partials and its reduce step;
// deterministic, shape-determined grid and scratch, so it captures in CUDA
// graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// Row chunks (grid rows) for a [rows, cols] call: one wave of blocks.
int gelu_backward_chunks(int64_t rows, int cols, int sm_count);

// grad, pre [rows, cols] dense row-major (T: float, __nv_bfloat16, __half).
// sums: [cols] fp32 or nullptr (then only the elementwise part runs).
// partials: chunks * cols floats, chunks from gelu_backward_chunks.
template <typename T>
void gelu_tanh_backward_column_sums(T* grad, const T* pre, int64_t rows, int cols, float* sums, float* partials,
                                    int chunks, cudaStream_t stream);

}  // namespace perftrain::kernels
