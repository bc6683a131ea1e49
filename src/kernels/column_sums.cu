#include "kernels/column_sums.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/column_partials.cuh"
#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using namespace column_tiling;
using detail::load_vec;
using detail::to_float;

struct Pointers {
  const void* in[kColumnSumsMaxMatrices];
  float* out[kColumnSumsMaxMatrices];
};

// Block (column tile, chunk, matrix): the chunk's rows, summed per column.
// VEC8: whole 16-byte vectors (cols % 8 == 0 and aligned); else one column
// per load, same ownership.
template <typename T, bool VEC8>
__global__ void __launch_bounds__(kThreadsX* kThreadsY)
    column_partials_kernel(Pointers p, int64_t rows, int cols, int64_t ld, int64_t rows_per_chunk,
                           float* __restrict__ partials) {
  const int chunk = blockIdx.y, chunks = gridDim.y, mat = blockIdx.z;
  const T* __restrict__ in = static_cast<const T*>(p.in[mat]);
  const auto [c0, r0, r1] = thread_slice(rows, rows_per_chunk);
  float acc[kVec] = {};
  if (c0 < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kThreadsY) {
      const T* row = in + r * ld;
      if constexpr (VEC8) {
        float v[kVec];
        load_vec<T, kVec>(row + c0, v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += v[j];
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (c0 + j < cols) acc[j] += to_float(row[c0 + j]);
      }
    }
  }
  write_column_partials(acc, partials + (int64_t(mat) * chunks + chunk) * cols, cols);
}

// Block (32 columns, 8 row groups): group g adds rows g, g + 8, ... of its
// columns, then the 8 group sums are added in group order. Short sums (a few
// hundred chunk or batch rows) so spread over cols / 32 blocks with eight
// loads in flight per column, where one thread per column walking every row
// left all but a few SMs idle.
constexpr int kReduceCols = 32, kReduceGroups = 8;

__global__ void __launch_bounds__(kReduceCols* kReduceGroups)
    column_reduce_kernel(Pointers p, const float* __restrict__ partials, int chunks, int cols) {
  __shared__ float group_sums[kReduceGroups][kReduceCols];
  const int mat = blockIdx.y;
  const int c = blockIdx.x * kReduceCols + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    const float* q = partials + int64_t(mat) * chunks * cols + c;
#pragma unroll 4
    for (int k = threadIdx.y; k < chunks; k += kReduceGroups) s += q[int64_t(k) * cols];
  }
  group_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = group_sums[0][threadIdx.x];
#pragma unroll
    for (int g = 1; g < kReduceGroups; ++g) t += group_sums[g][threadIdx.x];
    p.out[mat][c] = t;
  }
}

}  // namespace

int column_sums_chunks(int64_t rows, int cols, int count, int sm_count) {
  // About four blocks per SM in all, each with at least 64 rows to walk.
  return chunks_for(rows, cols, count, 4LL * std::max(sm_count, 1));
}

template <typename T>
void column_sums(const T* const* inputs, float* const* outputs, int count, int64_t rows, int cols, int64_t ld,
                 float* partials, int chunks, cudaStream_t stream) {
  if (count < 1 || count > kColumnSumsMaxMatrices || rows < 0 || cols < 1 || ld < cols || chunks < 1 ||
      chunks > kMaxChunks)
    throw std::invalid_argument("column_sums: unsupported count=" + std::to_string(count) +
                                " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                                " ld=" + std::to_string(ld) + " chunks=" + std::to_string(chunks));
  Pointers p{};
  bool vec8 = cols % kVec == 0 && ld % kVec == 0;
  for (int j = 0; j < count; ++j) {
    if (inputs[j] == nullptr || outputs[j] == nullptr) throw std::invalid_argument("column_sums: null pointer");
    p.in[j] = inputs[j];
    p.out[j] = outputs[j];
    vec8 = vec8 && detail::vec8_aligned(inputs[j]);
  }
  const int64_t chunk_rows = rows_per_chunk(rows, chunks);
  const dim3 block(kThreadsX, kThreadsY);
  const dim3 grid((cols + kTileCols - 1) / kTileCols, chunks, count);
  if (vec8)
    column_partials_kernel<T, true><<<grid, block, 0, stream>>>(p, rows, cols, ld, chunk_rows, partials);
  else
    column_partials_kernel<T, false><<<grid, block, 0, stream>>>(p, rows, cols, ld, chunk_rows, partials);
  PERFTRAIN_LAUNCH_CHECK();
  column_sums_reduce(partials, outputs, count, chunks, cols, stream);
}

void column_sums_reduce(const float* partials, float* const* outputs, int count, int chunks, int cols,
                        cudaStream_t stream) {
  if (count < 1 || count > kColumnSumsMaxMatrices || cols < 1 || chunks < 1 || partials == nullptr)
    throw std::invalid_argument("column_sums_reduce: unsupported count=" + std::to_string(count) +
                                " cols=" + std::to_string(cols) + " chunks=" + std::to_string(chunks));
  Pointers p{};
  for (int j = 0; j < count; ++j) {
    if (outputs[j] == nullptr) throw std::invalid_argument("column_sums_reduce: null output");
    p.out[j] = outputs[j];
  }
  const dim3 grid((cols + kReduceCols - 1) / kReduceCols, count), block(kReduceCols, kReduceGroups);
  column_reduce_kernel<<<grid, block, 0, stream>>>(p, partials, chunks, cols);
  PERFTRAIN_LAUNCH_CHECK();
}

template void column_sums<float>(const float* const*, float* const*, int, int64_t, int, int64_t, float*, int,
                                 cudaStream_t);
template void column_sums<__nv_bfloat16>(const __nv_bfloat16* const*, float* const*, int, int64_t, int, int64_t,
                                         float*, int, cudaStream_t);
template void column_sums<__half>(const __half* const*, float* const*, int, int64_t, int, int64_t, float*, int,
                                  cudaStream_t);

}  // namespace perftrain::kernels
