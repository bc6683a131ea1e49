// fp8 casts with the fused amax (see the header for the maths, bytes and
// launch shapes).
#include "kernels/fp8_cast.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/device_info.h"
#include "kernels/fp8_encode.cuh"

namespace perftrain::kernels {

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kTile = 64;  // cast-transpose: a kTile x kTile tile per block

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// The value cast: x itself, or with the GELU prologue the tanh GELU of x
// rounded to bf16, as ATen's bf16 gelu(x, "tanh") stores it (its formula and
// order in fp32).
template <bool GELU>
__device__ __forceinline__ float cast_value(float x) {
  if constexpr (GELU) {
    constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
    const float inner = kBeta * (x + kKappa * (x * x * x));
    return __bfloat162float(__float2bfloat16_rn(0.5f * x * (1.0f + tanhf(inner))));
  } else {
    return x;
  }
}

// Block max of the threads' bits, then one atomicMax into *amax (null: none).
__device__ void block_amax(unsigned int bits, float* amax) {
  __shared__ unsigned int warp_max[kThreads / 32];
  bits = __reduce_max_sync(0xffffffffu, bits);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = bits;
  __syncthreads();
  if (warp == 0) {
    bits = lane < kThreads / 32 ? warp_max[lane] : 0u;
    bits = __reduce_max_sync(0xffffffffu, bits);
    if (lane == 0 && amax != nullptr) atomicMax(reinterpret_cast<unsigned int*>(amax), bits);
  }
}

// 8 consecutive elements of x as floats (16-byte loads).
__device__ __forceinline__ void load8(const __nv_bfloat16* x, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x));
  const auto* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(h[i]);
}
__device__ __forceinline__ void load8(const float* x, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(x)), b = __ldg(reinterpret_cast<const float4*>(x) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// VEC8: x 16-byte and q 8-byte aligned; the vectors cover [0, n / 8 * 8),
// the tail goes element by element.
template <typename T, Fp8Format F, bool VEC8, bool GELU>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale_ptr, uint8_t* __restrict__ q,
                    float* amax) {
  const float scale = *scale_ptr;
  unsigned int bits = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t tail = 0;
  if constexpr (VEC8) {
    const int64_t nv = n / 8;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nv; i += stride) {
      float v[8];
      load8(x + i * 8, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = cast_value<GELU>(v[j]);
      uint2 out;
      auto* o = reinterpret_cast<uint8_t*>(&out);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        bits = max(bits, detail::fp8_abs_bits(v[j]));
        o[j] = detail::fp8_encode<F>(v[j], scale);
      }
      reinterpret_cast<uint2*>(q)[i] = out;
    }
    tail = nv * 8;
  }
  for (int64_t i = tail + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const float v = cast_value<GELU>(to_float(x[i]));
    bits = max(bits, detail::fp8_abs_bits(v));
    q[i] = detail::fp8_encode<F>(v, scale);
  }
  block_amax(bits, amax);
}

// Cast-transpose tiles: kTile x kTile, the fp8 bits kept in shared memory
// with rows padded by 4 bytes (column reads then fall in different banks).
constexpr int kTileStride = kTile + 4;
using Tile = uint8_t[kTile][kTileStride];
static_assert(kThreads * 16 == kTile * kTile, "the vector tile gives each thread 16 elements");

// Scalar tile (any sizes, edges): x[r0 .. r0 + 64, c0 .. c0 + 64) read along
// rows (a warp covers 32 consecutive columns), q written likewise; then q_t's
// rows c0 .. c0 + 64 written along their length.
template <typename T, Fp8Format F, bool GELU>
__device__ unsigned cast_tile(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t r0, int64_t c0, float scale,
                              uint8_t* __restrict__ q, Tile& tile) {
  unsigned bits = 0;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (gr < rows && gc < cols) {
      const float v = cast_value<GELU>(to_float(x[gr * cols + gc]));
      bits = max(bits, detail::fp8_abs_bits(v));
      const uint8_t b = detail::fp8_encode<F>(v, scale);
      tile[r][c] = b;
      if (q != nullptr) q[gr * cols + gc] = b;
    }
  }
  return bits;
}

// q_t's rows are ld bytes apart (ld >= rows: q_t may be a column block of a
// wider matrix).
__device__ void write_tile_transposed(int64_t rows, int64_t cols, int64_t ld, int64_t r0, int64_t c0,
                                      uint8_t* __restrict__ q_t, const Tile& tile) {
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int c = e / kTile, r = e % kTile;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (gr < rows && gc < cols) q_t[gc * ld + gr] = tile[r][c];
  }
}

// Vector tile (a whole tile; rows and cols multiples of 16, the pointers
// 16-byte aligned): a thread casts 16 consecutive elements of one row (16- or
// 32-byte loads, one 16-byte store of q), then gathers 16 consecutive bytes
// of one q_t row from shared memory (one 16-byte store).
template <typename T, Fp8Format F, bool GELU>
__device__ unsigned cast_tile_vec(const T* __restrict__ x, int64_t cols, int64_t r0, int64_t c0, float scale,
                                  uint8_t* __restrict__ q, Tile& tile) {
  const int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 16;
  const T* src = x + (r0 + r) * cols + c0 + c;
  float v[2][8];
  load8(src, v[0]);
  load8(src + 8, v[1]);
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j / 8][j % 8] = cast_value<GELU>(v[j / 8][j % 8]);
  uint4 packed;
  auto* b = reinterpret_cast<uint8_t*>(&packed);
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    bits = max(bits, detail::fp8_abs_bits(v[j / 8][j % 8]));
    b[j] = detail::fp8_encode<F>(v[j / 8][j % 8], scale);
  }
  if (q != nullptr) *reinterpret_cast<uint4*>(q + (r0 + r) * cols + c0 + c) = packed;
  const auto* w = reinterpret_cast<const uint32_t*>(&packed);
#pragma unroll
  for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(&tile[r][c + 4 * j]) = w[j];
  return bits;
}

__device__ void write_tile_transposed_vec(int64_t ld, int64_t r0, int64_t c0, uint8_t* __restrict__ q_t,
                                          const Tile& tile) {
  const int c = threadIdx.x >> 2, r = (threadIdx.x & 3) * 16;
  uint4 packed;
  auto* b = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 16; ++i) b[i] = tile[r + i][c];
  *reinterpret_cast<uint4*>(q_t + (c0 + c) * ld + r0 + r) = packed;
}

// Block (tile column, tile row): the vector tile where `vec` allows and the
// tile is whole, else the scalar one (the choice is the block's, uniform).
template <typename T, Fp8Format F, bool GELU>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ scale_ptr,
                              uint8_t* __restrict__ q, uint8_t* __restrict__ q_t, int64_t ld, float* amax, bool vec) {
  __shared__ __align__(16) Tile tile;
  const float scale = *scale_ptr;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const bool whole = vec && r0 + kTile <= rows && c0 + kTile <= cols;
  const unsigned bits = whole ? cast_tile_vec<T, F, GELU>(x, cols, r0, c0, scale, q, tile)
                              : cast_tile<T, F, GELU>(x, rows, cols, r0, c0, scale, q, tile);
  __syncthreads();
  if (whole) {
    write_tile_transposed_vec(ld, r0, c0, q_t, tile);
  } else {
    write_tile_transposed(rows, cols, ld, r0, c0, q_t, tile);
  }
  block_amax(bits, amax);
}

// fp8 -> fp8 transpose by the cast-transpose's tiles: q's tile into shared
// memory (16 bytes a thread where the tile is whole and `vec` allows, else byte
// by byte), then q_t's rows as fp8_cast_transpose_kernel writes them.
__global__ void __launch_bounds__(kThreads)
    fp8_transpose_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t cols, uint8_t* __restrict__ q_t,
                         bool vec) {
  __shared__ __align__(16) Tile tile;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const bool whole = vec && r0 + kTile <= rows && c0 + kTile <= cols;
  if (whole) {
    const int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 16;
    const uint4 packed = *reinterpret_cast<const uint4*>(q + (r0 + r) * cols + c0 + c);
    const auto* w = reinterpret_cast<const uint32_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(&tile[r][c + 4 * j]) = w[j];
  } else {
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      if (r0 + r < rows && c0 + c < cols) tile[r][c] = q[(r0 + r) * cols + c0 + c];
    }
  }
  __syncthreads();
  if (whole) {
    write_tile_transposed_vec(rows, r0, c0, q_t, tile);
  } else {
    write_tile_transposed(rows, cols, rows, r0, c0, q_t, tile);
  }
}

dim3 tile_grid(int64_t rows, int64_t cols, const char* op) {
  const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
  if (grid.y > 65535u) throw std::invalid_argument(std::string(op) + ": more than 65535 * 64 rows");
  return grid;
}

void check(const Fp8CastArgs& a, const char* op) {
  auto fail = [&](const std::string& why) { throw std::invalid_argument(std::string(op) + ": " + why); };
  if (a.rows < 0 || a.cols < 0) fail("sizes must be non-negative");
  if (a.q_t_ld != 0 && a.q_t_ld < a.rows) fail("q_t's row pitch must be at least rows");
  if (a.x == nullptr || a.scale == nullptr) fail("x and scale must be non-null");
  if (a.prologue == Fp8Prologue::kGeluTanh && a.x_type != Fp8Source::kBF16) fail("the GELU prologue reads bf16 x");
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <typename T, Fp8Format F, bool GELU>
void launch_cast(const Fp8CastArgs& a, cudaStream_t stream) {
  const int64_t n = a.rows * a.cols;
  const T* x = static_cast<const T*>(a.x);
  const bool vec = aligned(a.x, 16) && aligned(a.q, 8);
  const int64_t work = vec ? std::max<int64_t>(n / 8, 1) : n;
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int grid = int(std::min<int64_t>(wanted, int64_t(multiprocessor_count()) * kBlocksPerSm));
  if (vec) {
    fp8_cast_kernel<T, F, true, GELU><<<grid, kThreads, 0, stream>>>(x, n, a.scale, a.q, a.amax);
  } else {
    fp8_cast_kernel<T, F, false, GELU><<<grid, kThreads, 0, stream>>>(x, n, a.scale, a.q, a.amax);
  }
  PERFTRAIN_LAUNCH_CHECK();
}

template <typename T, Fp8Format F, bool GELU>
void launch_cast_transpose(const Fp8CastArgs& a, cudaStream_t stream) {
  const dim3 grid = tile_grid(a.rows, a.cols, "fp8_cast_transpose");
  const T* x = static_cast<const T*>(a.x);
  const int64_t ld = a.q_t_ld != 0 ? a.q_t_ld : a.rows;
  const bool vec = a.rows % 16 == 0 && a.cols % 16 == 0 && ld % 16 == 0 && aligned(a.x, 16) && aligned(a.q, 16) &&
                   aligned(a.q_t, 16);
  fp8_cast_transpose_kernel<T, F, GELU><<<grid, kThreads, 0, stream>>>(x, a.rows, a.cols, a.scale, a.q, a.q_t, ld,
                                                                        a.amax, vec);
  PERFTRAIN_LAUNCH_CHECK();
}

// The launcher for (x_type, format, prologue): the GELU prologue reads bf16 only.
template <template <typename, Fp8Format, bool> class Launch>
void dispatch(const Fp8CastArgs& a, cudaStream_t stream) {
  const bool e4m3 = a.format == Fp8Format::kE4M3;
  if (a.prologue == Fp8Prologue::kGeluTanh) {
    e4m3 ? Launch<__nv_bfloat16, Fp8Format::kE4M3, true>::run(a, stream)
         : Launch<__nv_bfloat16, Fp8Format::kE5M2, true>::run(a, stream);
  } else if (a.x_type == Fp8Source::kBF16) {
    e4m3 ? Launch<__nv_bfloat16, Fp8Format::kE4M3, false>::run(a, stream)
         : Launch<__nv_bfloat16, Fp8Format::kE5M2, false>::run(a, stream);
  } else {
    e4m3 ? Launch<float, Fp8Format::kE4M3, false>::run(a, stream) : Launch<float, Fp8Format::kE5M2, false>::run(a, stream);
  }
}

template <typename T, Fp8Format F, bool GELU>
struct CastLaunch {
  static void run(const Fp8CastArgs& a, cudaStream_t s) { launch_cast<T, F, GELU>(a, s); }
};
template <typename T, Fp8Format F, bool GELU>
struct CastTransposeLaunch {
  static void run(const Fp8CastArgs& a, cudaStream_t s) { launch_cast_transpose<T, F, GELU>(a, s); }
};

}  // namespace

void fp8_cast(const Fp8CastArgs& a, cudaStream_t stream) {
  check(a, "fp8_cast");
  if (a.q == nullptr) throw std::invalid_argument("fp8_cast: q must be non-null");
  if (a.q_t != nullptr) throw std::invalid_argument("fp8_cast: q_t is fp8_cast_transpose's output");
  if (a.rows * a.cols == 0) return;
  dispatch<CastLaunch>(a, stream);
}

void fp8_cast_transpose(const Fp8CastArgs& a, cudaStream_t stream) {
  check(a, "fp8_cast_transpose");
  if (a.q_t == nullptr) throw std::invalid_argument("fp8_cast_transpose: q_t must be non-null");
  if (a.rows * a.cols == 0) return;
  dispatch<CastTransposeLaunch>(a, stream);
}

void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* q_t, cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("fp8_transpose: sizes must be non-negative");
  if (q == nullptr || q_t == nullptr) throw std::invalid_argument("fp8_transpose: q and q_t must be non-null");
  if (rows * cols == 0) return;
  const bool vec = rows % 16 == 0 && cols % 16 == 0 && aligned(q, 16) && aligned(q_t, 16);
  fp8_transpose_kernel<<<tile_grid(rows, cols, "fp8_transpose"), kThreads, 0, stream>>>(q, rows, cols, q_t, vec);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
