#include "kernels/position_add.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::load_vec;
using detail::store_vec;

// One thread per VEC adjacent elements of one row (cols % VEC == 0), a
// grid-stride loop over all of them; the row index is one division per
// vector, the table row its remainder by period.
template <typename T, int VEC>
__global__ void position_add_kernel(const T* __restrict__ y, const float* __restrict__ table,
                                    float* __restrict__ out, int64_t vectors, int period, int vecs_per_row) {
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs_per_row;
    const int col_vec = int(v - row * vecs_per_row);
    const int64_t t = row % period;
    float a[VEC], p[VEC];
    load_vec<T, VEC>(y + v * VEC, a);
    load_vec<float, VEC>(table + (t * vecs_per_row + col_vec) * VEC, p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] += p[i];
    store_vec<float, VEC>(out + v * VEC, a);
  }
}

}  // namespace

template <typename T>
void position_add(const T* y, const float* table, float* out, int64_t rows, int period, int cols,
                  cudaStream_t stream) {
  if (rows < 0 || period < 1 || cols < 1 || rows % period != 0)
    throw std::invalid_argument("position_add: rows=" + std::to_string(rows) + " must be a multiple of period=" +
                                std::to_string(period) + ", cols=" + std::to_string(cols));
  if (rows == 0) return;
  constexpr int kThreads = 256;
  // Enough blocks to fill the GPU several times; the loop covers the rest.
  auto launch = [&](auto kernel, int vec) {
    const int64_t vectors = rows * cols / vec;
    const int64_t blocks = std::min<int64_t>((vectors + kThreads - 1) / kThreads, 65535LL * 8);
    kernel<<<int(blocks), kThreads, 0, stream>>>(y, table, out, vectors, period, cols / vec);
    PERFTRAIN_LAUNCH_CHECK();
  };
  const bool vec8 = cols % 8 == 0 && detail::vec8_aligned(y) && detail::vec8_aligned(table) &&
                    detail::vec8_aligned(out);
  if (vec8)
    launch(position_add_kernel<T, 8>, 8);
  else
    launch(position_add_kernel<T, 1>, 1);
}

template void position_add<float>(const float*, const float*, float*, int64_t, int, int, cudaStream_t);
template void position_add<__nv_bfloat16>(const __nv_bfloat16*, const float*, float*, int64_t, int, int,
                                          cudaStream_t);
template void position_add<__half>(const __half*, const float*, float*, int64_t, int, int, cudaStream_t);

}  // namespace perftrain::kernels
