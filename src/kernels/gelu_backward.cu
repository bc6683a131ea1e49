#include "kernels/gelu_backward.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/column_partials.cuh"
#include "kernels/column_sums.h"
#include "kernels/cuda_check.h"
#include "kernels/gelu_tanh.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using namespace column_tiling;
using detail::from_float;
using detail::store_vec;
using detail::to_float;
using gelu_math::gelu_tanh_grad;

// One element: the stored result, and its value as stored (what the sums add).
template <typename T>
__device__ __forceinline__ float dgelu_stored(float g, float x) {
  return to_float(from_float<T>(g * gelu_tanh_grad(x)));
}

// Rows each thread has in flight at once on the vector path: their loads are
// all issued before any result is computed, so that a thread waits for
// memory once per kRowsInFlight rows (a latency-bound loop otherwise: one
// row's two 16-byte loads, then its math, then the next row's loads).
constexpr int kRowsInFlight = 4;
// Three blocks of 256 threads fit an SM at the vector path's 80 registers:
// the grid is sized to one such wave (gelu_backward_chunks).
constexpr int kBlocksPerSm = 3;

// 8 elements of T as raw 16-byte words (one for 16-bit types, two for fp32).
template <typename T>
struct Words {
  static constexpr int kCount = kVec * int(sizeof(T)) / 16;
  uint4 w[kCount];
};

template <typename T>
__device__ __forceinline__ Words<T> load_words(const T* p) {
  Words<T> r;
#pragma unroll
  for (int i = 0; i < Words<T>::kCount; ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}

template <typename T>
__device__ __forceinline__ void unpack(const Words<T>& r, float (&f)[kVec]) {
  T e[kVec];
  memcpy(e, r.w, sizeof(e));
#pragma unroll
  for (int j = 0; j < kVec; ++j) f[j] = to_float(e[j]);
}

// Block (column tile, row chunk). VEC8: whole 16-byte vectors (cols % 8 == 0
// and aligned), kRowsInFlight rows per thread at a time; else one column per
// access, same ownership. SUMS: also the chunk's column partials, as
// column_partials_kernel writes them.
template <typename T, bool VEC8, bool SUMS>
__global__ void __launch_bounds__(kThreadsX* kThreadsY)
    gelu_backward_partials_kernel(T* __restrict__ grad, const T* __restrict__ pre, int64_t rows, int cols,
                                  int64_t rows_per_chunk, float* __restrict__ partials) {
  const auto [c0, r0, r1] = thread_slice(rows, rows_per_chunk);
  float acc[kVec] = {};
  if (c0 < cols) {
    if constexpr (VEC8) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kThreadsY * kRowsInFlight) {
        Words<T> gw[kRowsInFlight], pw[kRowsInFlight];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t row = r + int64_t(u) * kThreadsY;
          if (row < r1) {
            gw[u] = load_words(grad + row * cols + c0);
            pw[u] = load_words(pre + row * cols + c0);
          }
        }
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t row = r + int64_t(u) * kThreadsY;
          if (row < r1) {
            float g[kVec], x[kVec];
            unpack(gw[u], g);
            unpack(pw[u], x);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              g[j] = dgelu_stored<T>(g[j], x[j]);
              acc[j] += g[j];
            }
            store_vec<T, kVec>(grad + row * cols + c0, g);  // already representable: stored exactly
          }
        }
      }
    } else {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kThreadsY) {
        const int64_t at = r * cols + c0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if (c0 + j < cols) {
            const float d = dgelu_stored<T>(to_float(grad[at + j]), to_float(pre[at + j]));
            grad[at + j] = from_float<T>(d);
            acc[j] += d;
          }
        }
      }
    }
  }
  if constexpr (SUMS) write_column_partials(acc, partials + int64_t(blockIdx.y) * cols, cols);
}

template <typename T, bool VEC8>
void launch(T* grad, const T* pre, int64_t rows, int cols, bool sums, int64_t rows_per_chunk, float* partials,
            dim3 grid, cudaStream_t stream) {
  const dim3 block(kThreadsX, kThreadsY);
  if (sums)
    gelu_backward_partials_kernel<T, VEC8, true><<<grid, block, 0, stream>>>(grad, pre, rows, cols, rows_per_chunk,
                                                                             partials);
  else
    gelu_backward_partials_kernel<T, VEC8, false><<<grid, block, 0, stream>>>(grad, pre, rows, cols, rows_per_chunk,
                                                                              partials);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace

int gelu_backward_chunks(int64_t rows, int cols, int sm_count) {
  return chunks_for(rows, cols, 1, int64_t(kBlocksPerSm) * std::max(sm_count, 1));
}

template <typename T>
void gelu_tanh_backward_column_sums(T* grad, const T* pre, int64_t rows, int cols, float* sums, float* partials,
                                    int chunks, cudaStream_t stream) {
  if (rows < 0 || cols < 1 || chunks < 1 || chunks > kMaxChunks || grad == nullptr || pre == nullptr ||
      (sums != nullptr && partials == nullptr))
    throw std::invalid_argument("gelu_tanh_backward_column_sums: unsupported rows=" + std::to_string(rows) +
                                " cols=" + std::to_string(cols) + " chunks=" + std::to_string(chunks));
  if (rows == 0 && sums == nullptr) return;
  const int64_t chunk_rows = rows_per_chunk(rows, chunks);
  const dim3 grid((cols + kTileCols - 1) / kTileCols, chunks);
  const bool vec8 = cols % kVec == 0 && detail::vec8_aligned(grad) && detail::vec8_aligned(pre);
  if (vec8)
    launch<T, true>(grad, pre, rows, cols, sums != nullptr, chunk_rows, partials, grid, stream);
  else
    launch<T, false>(grad, pre, rows, cols, sums != nullptr, chunk_rows, partials, grid, stream);
  if (sums != nullptr) {
    float* outputs[1] = {sums};
    column_sums_reduce(partials, outputs, 1, chunks, cols, stream);
  }
}

template void gelu_tanh_backward_column_sums<float>(float*, const float*, int64_t, int, float*, float*, int,
                                                    cudaStream_t);
template void gelu_tanh_backward_column_sums<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t, int,
                                                            float*, float*, int, cudaStream_t);
template void gelu_tanh_backward_column_sums<__half>(__half*, const __half*, int64_t, int, float*, float*, int,
                                                     cudaStream_t);

}  // namespace perftrain::kernels
