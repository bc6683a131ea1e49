// The column-sum tiling that kernels/column_sums and kernels/gelu_backward
// share: a block covers a tile of 256 columns and a chunk of rows; 32 threads
// across the tile each own 8 adjacent columns (one 16-byte load of bf16 per
// row), 8 rows of threads walk the chunk. Each block writes one row of fp32
// partial sums, and column_sums_reduce adds the chunks in a fixed order.
#pragma once

#include <cstdint>

namespace perftrain::kernels::detail {

constexpr int kColVec = 8;                        // columns per thread
constexpr int kColThreadsX = 32;                  // threads across a column tile
constexpr int kColTile = kColThreadsX * kColVec;  // 256 columns per block
constexpr int kColThreadsY = 8;                   // rows walked at once

// The block's partial sums of its tile: each thread's 8 column sums (acc)
// go through shared memory, then 256 threads, one column each, add the 8
// row groups in order and write partials_row[column]. All threads of the
// block must call it.
__device__ __forceinline__ void write_column_partials(const float (&acc)[kColVec], float* __restrict__ partials_row,
                                                      int cols) {
  __shared__ float smem[kColThreadsY][kColTile];
#pragma unroll
  for (int j = 0; j < kColVec; ++j) smem[threadIdx.y][threadIdx.x * kColVec + j] = acc[j];
  __syncthreads();
  const int t = threadIdx.y * kColThreadsX + threadIdx.x;
  const int c = blockIdx.x * kColTile + t;
  if (c < cols) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kColThreadsY; ++y) s += smem[y][t];
    partials_row[c] = s;
  }
}

}  // namespace perftrain::kernels::detail
