#include "kernels/swiglu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::load_vec;
using detail::store_vec;

// The block's threads: about this many (more only for one wide row).
constexpr int kBlockThreads = 256;
// Threads across one row at most; a wider row loops.
constexpr int kMaxRowThreads = 512;
// Blocks in the grid at most (many waves on any GPU); they stride over the
// rows beyond.
constexpr int64_t kMaxBlocks = 65536;

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Rows blockIdx.x * ty + threadIdx.y, striding by gridDim.x * ty; in each,
// the vectors threadIdx.x, + tx, ... of the row's `vecs`.
template <typename T, int VEC>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int cols,
                                      int vecs) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += int64_t(gridDim.x) * blockDim.y) {
    const T* gate = gate_up + r * 2 * cols;
    const T* up = gate + cols;
    T* o = out + r * cols;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      float g[VEC], u[VEC];
      load_vec<T, VEC>(gate + v * VEC, g);
      load_vec<T, VEC>(up + v * VEC, u);
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[j] = silu(g[j]) * u[j];
      store_vec<T, VEC>(o + v * VEC, g);
    }
  }
}

template <typename T, int VEC>
__global__ void swiglu_backward_kernel(const T* __restrict__ dout, const T* __restrict__ gate_up,
                                       T* __restrict__ dgate_up, int64_t rows, int cols, int vecs) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += int64_t(gridDim.x) * blockDim.y) {
    const T* gate = gate_up + r * 2 * cols;
    const T* up = gate + cols;
    const T* d = dout + r * cols;
    T* dgate = dgate_up + r * 2 * cols;
    T* dup = dgate + cols;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      float g[VEC], u[VEC], dy[VEC];
      load_vec<T, VEC>(gate + v * VEC, g);
      load_vec<T, VEC>(up + v * VEC, u);
      load_vec<T, VEC>(d + v * VEC, dy);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float s = 1.f / (1.f + expf(-g[j]));  // exp overflow: s = 0, and no inf appears below
        const float dg = dy[j] * u[j] * (s * (1.f + g[j] * (1.f - s)));
        u[j] = dy[j] * (g[j] * s);  // d(up)
        g[j] = dg;
      }
      store_vec<T, VEC>(dgate + v * VEC, g);
      store_vec<T, VEC>(dup + v * VEC, u);
    }
  }
}

bool aligned_to(const void* p, size_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_sizes(const char* what, int64_t rows, int cols) {
  if (rows < 0 || cols < 1 || cols > kSwigluMaxCols)
    throw std::invalid_argument(std::string(what) + ": unsupported sizes rows=" + std::to_string(rows) +
                                " cols=" + std::to_string(cols));
}

// The block and grid for rows of `vecs` vectors.
struct Launch {
  dim3 grid, block;
};

Launch launch_shape(int64_t rows, int vecs) {
  int tx, ty;
  if (vecs <= 32) {
    tx = 1;
    while (tx < vecs) tx *= 2;
    ty = kBlockThreads / tx;
  } else {
    const int loops = (vecs + kMaxRowThreads - 1) / kMaxRowThreads;
    tx = ((vecs + loops - 1) / loops + 31) / 32 * 32;
    ty = std::max(1, kBlockThreads / tx);
  }
  const int64_t blocks = std::min<int64_t>(std::max<int64_t>((rows + ty - 1) / ty, 1), kMaxBlocks);
  return {dim3(unsigned(blocks)), dim3(unsigned(tx), unsigned(ty))};
}

// Calls f(std::integral_constant<int, VEC>) with the vector width for these pointers.
template <typename T, typename F>
void with_vector_width(int cols, const void* a, const void* b, const void* c, F&& f) {
  switch (swiglu_vector_width<T>(cols, a, b, c)) {
    case 8: return f(std::integral_constant<int, 8>());
    case 4: return f(std::integral_constant<int, 4>());
    case 2: return f(std::integral_constant<int, 2>());
    default: return f(std::integral_constant<int, 1>());
  }
}

}  // namespace

template <typename T>
int swiglu_vector_width(int cols, const void* a, const void* b, const void* c) {
  for (int vec : {8, 4, 2}) {
    const size_t bytes = std::min<size_t>(16, vec * sizeof(T));
    if (cols % vec == 0 && aligned_to(a, bytes) && aligned_to(b, bytes) && aligned_to(c, bytes)) return vec;
  }
  return 1;
}

template <typename T>
void swiglu_forward(const T* gate_up, T* out, int64_t rows, int cols, cudaStream_t stream) {
  check_sizes("swiglu_forward", rows, cols);
  if (rows == 0) return;
  if (gate_up == nullptr || out == nullptr) throw std::invalid_argument("swiglu_forward: null pointer");
  with_vector_width<T>(cols, gate_up, out, nullptr, [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    const Launch l = launch_shape(rows, cols / VEC);
    swiglu_forward_kernel<T, VEC><<<l.grid, l.block, 0, stream>>>(gate_up, out, rows, cols, cols / VEC);
    PERFTRAIN_LAUNCH_CHECK();
  });
}

template <typename T>
void swiglu_backward(const T* dout, const T* gate_up, T* dgate_up, int64_t rows, int cols, cudaStream_t stream) {
  check_sizes("swiglu_backward", rows, cols);
  if (rows == 0) return;
  if (dout == nullptr || gate_up == nullptr || dgate_up == nullptr)
    throw std::invalid_argument("swiglu_backward: null pointer");
  with_vector_width<T>(cols, dout, gate_up, dgate_up, [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    const Launch l = launch_shape(rows, cols / VEC);
    swiglu_backward_kernel<T, VEC><<<l.grid, l.block, 0, stream>>>(dout, gate_up, dgate_up, rows, cols, cols / VEC);
    PERFTRAIN_LAUNCH_CHECK();
  });
}

#define PERFTRAIN_SWIGLU_INSTANTIATE(T)                                                            \
  template void swiglu_forward<T>(const T*, T*, int64_t, int, cudaStream_t);                       \
  template void swiglu_backward<T>(const T*, const T*, T*, int64_t, int, cudaStream_t);            \
  template int swiglu_vector_width<T>(int, const void*, const void*, const void*);
PERFTRAIN_SWIGLU_INSTANTIATE(float)
PERFTRAIN_SWIGLU_INSTANTIATE(__nv_bfloat16)
PERFTRAIN_SWIGLU_INSTANTIATE(__half)
#undef PERFTRAIN_SWIGLU_INSTANTIATE

}  // namespace perftrain::kernels
