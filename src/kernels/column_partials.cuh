// The column-sum tiling that kernels/column_sums and kernels/gelu_backward
// share: a block (blockIdx.x, blockIdx.y) covers a tile of 256 columns and a
// chunk of rows; 32 threads across the tile each own 8 adjacent columns (one
// 16-byte load of bf16 per row), 8 rows of threads walk the chunk. Each
// block writes one row of fp32 partial sums, and column_sums_reduce adds the
// chunks in a fixed order. A kernel file says `using namespace
// column_tiling;` in its own anonymous namespace.
#pragma once

#include <algorithm>
#include <cstdint>

namespace perftrain::kernels::column_tiling {

constexpr int kVec = 8;                      // columns per thread
constexpr int kThreadsX = 32;                // threads across a column tile
constexpr int kTileCols = kThreadsX * kVec;  // 256 columns per block
constexpr int kThreadsY = 8;                 // rows walked at once
constexpr int kMaxChunks = 65535;            // gridDim.y

// Row chunks for `blocks` blocks in all over `matrices` [rows, cols]
// matrices, each chunk at least 64 rows (1 for an empty shape).
inline int chunks_for(int64_t rows, int cols, int matrices, int64_t blocks) {
  if (rows < 1 || cols < 1 || matrices < 1) return 1;
  const int64_t tiles = (cols + kTileCols - 1) / kTileCols * matrices;
  const int64_t want = (std::max<int64_t>(blocks, 1) + tiles - 1) / tiles;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, (rows + 63) / 64, kMaxChunks})));
}

// Rows per chunk when `rows` are cut into `chunks` (the last may be shorter).
inline int64_t rows_per_chunk(int64_t rows, int chunks) { return std::max<int64_t>(1, (rows + chunks - 1) / chunks); }

// This thread's part of its block: its first column c0 and the chunk's
// rows [r0, r1), for chunk blockIdx.y of rows_per_chunk rows.
struct ThreadSlice {
  int c0;
  int64_t r0, r1;
};

__device__ __forceinline__ ThreadSlice thread_slice(int64_t rows, int64_t rows_per_chunk) {
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  return {int(blockIdx.x) * kTileCols + int(threadIdx.x) * kVec, r0, r1};
}

// The block's partial sums of its tile: each thread's 8 column sums (acc)
// go through shared memory, then 256 threads, one column each, add the 8
// row groups in order and write partials_row[column]. All threads of the
// block must call it.
__device__ __forceinline__ void write_column_partials(const float (&acc)[kVec], float* __restrict__ partials_row,
                                                      int cols) {
  __shared__ float smem[kThreadsY][kTileCols];
#pragma unroll
  for (int j = 0; j < kVec; ++j) smem[threadIdx.y][threadIdx.x * kVec + j] = acc[j];
  __syncthreads();
  const int t = threadIdx.y * kThreadsX + threadIdx.x;
  const int c = blockIdx.x * kTileCols + t;
  if (c < cols) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kThreadsY; ++y) s += smem[y][t];
    partials_row[c] = s;
  }
}

}  // namespace perftrain::kernels::column_tiling
