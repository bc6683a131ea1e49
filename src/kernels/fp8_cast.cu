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

// The value cast (kernels/fp8_cast.h, Fp8Prologue), in ATen's fp32 formulas
// and order, rounded to bf16 as ATen's bf16 ops store their results:
//   kNone              x
//   kGeluTanh          gelu_tanh(x)                  (at::gelu(x, "tanh"))
//   kGeluTanhBackward  x * gelu_tanh'(x2), x2 = pre  (at::gelu_backward(x, x2, "tanh"))
//   kSwiglu            silu(x) * x2, x = gate, x2 = up (kernels/swiglu.h's forward)
// and kSwigluBackward's pair (swiglu_backward_values).
template <Fp8Prologue P>
__device__ __forceinline__ float cast_value(float x, float x2) {
  constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
  if constexpr (P == Fp8Prologue::kGeluTanh) {
    const float inner = kBeta * (x + kKappa * (x * x * x));
    return __bfloat162float(__float2bfloat16_rn(0.5f * x * (1.0f + tanhf(inner))));
  } else if constexpr (P == Fp8Prologue::kGeluTanhBackward) {
    const float x_sq = x2 * x2;
    const float inner = kBeta * (x2 + kKappa * (x_sq * x2));
    const float t = tanhf(inner);
    const float left_derivative = 0.5f * (1.0f + t);
    const float right_derivative = (0.5f * x2) * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * x_sq));
    return __bfloat162float(__float2bfloat16_rn(x * (left_derivative + right_derivative)));
  } else if constexpr (P == Fp8Prologue::kSwiglu) {
    return __bfloat162float(__float2bfloat16_rn(x / (1.f + expf(-x)) * x2));
  } else {
    return x;
  }
}

// SwiGLU's backward at one element (kernels/swiglu.h's formulas), each
// rounded to bf16: d(gate) and d(up) from d(h) = dy, gate g and up u.
__device__ __forceinline__ void swiglu_backward_values(float dy, float g, float u, float& dgate, float& dup) {
  const float s = 1.f / (1.f + expf(-g));  // exp overflow: s = 0, and no inf appears below
  dgate = __bfloat162float(__float2bfloat16_rn(dy * u * (s * (1.f + g * (1.f - s)))));
  dup = __bfloat162float(__float2bfloat16_rn(dy * (g * s)));
}

// Whether the prologue reads x2 (a second matrix of x's shape).
constexpr bool reads_x2(Fp8Prologue p) { return p == Fp8Prologue::kGeluTanhBackward; }
// Whether x is gate_up [rows, 2 cols]: the gate at column c, the up at cols + c.
constexpr bool reads_gate_up(Fp8Prologue p) { return p == Fp8Prologue::kSwiglu; }

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

// Where output element i (of rows x cols) reads x: i itself, or for
// gate_up [rows, 2 cols] the gate of row i / cols (its up is cols further).
template <Fp8Prologue P>
__device__ __forceinline__ int64_t source_index(int64_t i, int64_t cols) {
  if constexpr (reads_gate_up(P)) {
    return i / cols * 2 * cols + i % cols;
  } else {
    return i;
  }
}

// VEC8: x 16-byte and q 8-byte aligned (and for gate_up, cols a multiple of
// 8: a vector stays in one row); the vectors cover [0, n / 8 * 8), the tail
// goes element by element. n = rows * cols.
template <typename T, Fp8Format F, bool VEC8, Fp8Prologue P>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_kernel(const T* __restrict__ x, const T* __restrict__ x2, int64_t n, int64_t cols,
                    const float* __restrict__ scale_ptr, uint8_t* __restrict__ q, float* amax) {
  const float scale = *scale_ptr;
  unsigned int bits = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t tail = 0;
  if constexpr (VEC8) {
    const int64_t nv = n / 8;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nv; i += stride) {
      float v[8], v2[8] = {};
      const int64_t at = source_index<P>(i * 8, cols);
      load8(x + at, v);
      if constexpr (reads_x2(P)) load8(x2 + at, v2);
      if constexpr (reads_gate_up(P)) load8(x + at + cols, v2);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = cast_value<P>(v[j], v2[j]);
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
    const int64_t at = source_index<P>(i, cols);
    const float v = cast_value<P>(to_float(x[at]), reads_x2(P)        ? to_float(x2[at])
                                                   : reads_gate_up(P) ? to_float(x[at + cols])
                                                                      : 0.f);
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
static_assert(kThreads % kTile == 0, "the scalar tile keeps each thread on one column");

// A tile's column sums (col_partials): kSumGroups row groups' fp32 sums per
// column, which the block adds in group order (kernels/fp8_cast.h).
constexpr int kSumGroups = kThreads / 32;  // the vector tile: one group per warp (8 rows)
using TileSums = float[kSumGroups][kTile];
constexpr int kScalarSumGroups = kThreads / kTile;  // the scalar tile: rows r = g mod 4 in group g

// The value a tile casts at [gr, gc] of its [rows, cols] output: from x
// (and x2 where the prologue reads it), or from gate_up's two halves.
template <typename T, Fp8Prologue P>
__device__ __forceinline__ float tile_value(const T* __restrict__ x, const T* __restrict__ x2, int64_t gr, int64_t gc,
                                            int64_t cols) {
  if constexpr (reads_gate_up(P)) {
    const T* row = x + gr * 2 * cols;
    return cast_value<P>(to_float(row[gc]), to_float(row[cols + gc]));
  } else {
    const int64_t at = gr * cols + gc;
    return cast_value<P>(to_float(x[at]), reads_x2(P) ? to_float(x2[at]) : 0.f);
  }
}

// Scalar tile (any sizes, edges): x[r0 .. r0 + 64, c0 .. c0 + 64) read along
// rows (a warp covers 32 consecutive columns), q written likewise; then q_t's
// rows c0 .. c0 + 64 written along their length. A thread stays on column
// threadIdx.x % 64 (rows threadIdx.x / 64 + 4k), so its column sum is its own.
template <typename T, Fp8Format F, Fp8Prologue P>
__device__ unsigned cast_tile(const T* __restrict__ x, const T* __restrict__ x2, int64_t rows, int64_t cols,
                              int64_t r0, int64_t c0, float scale, uint8_t* __restrict__ q, Tile& tile, TileSums* sums) {
  unsigned bits = 0;
  float acc = 0.f;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (gr < rows && gc < cols) {
      const float v = tile_value<T, P>(x, x2, gr, gc, cols);
      acc += v;
      bits = max(bits, detail::fp8_abs_bits(v));
      const uint8_t b = detail::fp8_encode<F>(v, scale);
      tile[r][c] = b;
      if (q != nullptr) q[gr * cols + gc] = b;
    }
  }
  if (sums != nullptr) (*sums)[threadIdx.x / kTile][threadIdx.x % kTile] = acc;
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
// of one q_t row from shared memory (one 16-byte store). Column sums: a
// warp's 8 rows are added across its lanes (xor 4, 8, 16: the lanes of one
// column group), then lanes 0..3 write the warp's group.
template <typename T, Fp8Format F, Fp8Prologue P>
__device__ unsigned cast_tile_vec(const T* __restrict__ x, const T* __restrict__ x2, int64_t cols, int64_t r0,
                                  int64_t c0, float scale, uint8_t* __restrict__ q, Tile& tile, TileSums* sums) {
  const int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 16;
  const int64_t at = (r0 + r) * cols + c0 + c;
  float v[2][8], v2[2][8] = {};
  if constexpr (reads_gate_up(P)) {  // gate, then up cols further along the row of 2 cols
    const T* gate = x + (r0 + r) * 2 * cols + c0 + c;
    load8(gate, v[0]);
    load8(gate + 8, v[1]);
    load8(gate + cols, v2[0]);
    load8(gate + cols + 8, v2[1]);
  } else {
    load8(x + at, v[0]);
    load8(x + at + 8, v[1]);
    if constexpr (reads_x2(P)) {
      load8(x2 + at, v2[0]);
      load8(x2 + at + 8, v2[1]);
    }
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j / 8][j % 8] = cast_value<P>(v[j / 8][j % 8], v2[j / 8][j % 8]);
  uint4 packed;
  auto* b = reinterpret_cast<uint8_t*>(&packed);
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    bits = max(bits, detail::fp8_abs_bits(v[j / 8][j % 8]));
    b[j] = detail::fp8_encode<F>(v[j / 8][j % 8], scale);
  }
  if (q != nullptr) *reinterpret_cast<uint4*>(q + at) = packed;
  const auto* w = reinterpret_cast<const uint32_t*>(&packed);
#pragma unroll
  for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(&tile[r][c + 4 * j]) = w[j];
  if (sums != nullptr) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float t = v[j / 8][j % 8];
      t += __shfl_xor_sync(0xffffffffu, t, 4);
      t += __shfl_xor_sync(0xffffffffu, t, 8);
      t += __shfl_xor_sync(0xffffffffu, t, 16);
      if (lane < 4) (*sums)[threadIdx.x >> 5][c + j] = t;
    }
  }
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

// The tile's row of column partials: partials[tile row][c0 + c] = its groups'
// sums added in order (after the barrier that follows the cast).
__device__ void write_tile_partials(const TileSums& sums, int groups, int64_t cols, int64_t c0,
                                    float* __restrict__ partials) {
  const int c = threadIdx.x;
  if (c >= kTile || c0 + c >= cols) return;
  float s = 0.f;
  for (int g = 0; g < groups; ++g) s += sums[g][c];
  partials[int64_t(blockIdx.y) * cols + c0 + c] = s;
}

// Block (tile column, tile row): the vector tile where `vec` allows and the
// tile is whole, else the scalar one (the choice is the block's, uniform).
template <typename T, Fp8Format F, Fp8Prologue P>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_transpose_kernel(const T* __restrict__ x, const T* __restrict__ x2, int64_t rows, int64_t cols,
                              const float* __restrict__ scale_ptr, uint8_t* __restrict__ q, uint8_t* __restrict__ q_t,
                              int64_t ld, float* amax, float* __restrict__ partials, bool vec) {
  __shared__ __align__(16) Tile tile;
  __shared__ TileSums sums;
  TileSums* tile_sums = partials != nullptr ? &sums : nullptr;
  const float scale = *scale_ptr;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const bool whole = vec && r0 + kTile <= rows && c0 + kTile <= cols;
  const unsigned bits = whole ? cast_tile_vec<T, F, P>(x, x2, cols, r0, c0, scale, q, tile, tile_sums)
                              : cast_tile<T, F, P>(x, x2, rows, cols, r0, c0, scale, q, tile, tile_sums);
  __syncthreads();
  if (whole) {
    write_tile_transposed_vec(ld, r0, c0, q_t, tile);
  } else {
    write_tile_transposed(rows, cols, ld, r0, c0, q_t, tile);
  }
  if (partials != nullptr) write_tile_partials(sums, whole ? kSumGroups : kScalarSumGroups, cols, c0, partials);
  block_amax(bits, amax);
}

// SwiGLU's backward into fp8 (kSwigluBackward): a block takes a 64 x 64 tile
// of d(h) [rows, cols] and the same tile of both halves of gate_up [rows,
// 2 cols], and writes two tiles of d(gate_up)'s codes, d(gate) at column c
// and d(up) at cols + c of q [rows, 2 cols], through two shared-memory tiles
// into q_t's rows c and cols + c. Vector tiles as the cast-transpose's (16
// elements a thread; three 32-byte loads, two 16-byte stores of q); edges
// element by element. amax over both halves.
template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    fp8_swiglu_backward_kernel(const __nv_bfloat16* __restrict__ dh, const __nv_bfloat16* __restrict__ gate_up,
                               int64_t rows, int64_t cols, const float* __restrict__ scale_ptr,
                               uint8_t* __restrict__ q, uint8_t* __restrict__ q_t, int64_t ld, float* amax, bool vec) {
  __shared__ __align__(16) Tile tile_gate;
  __shared__ __align__(16) Tile tile_up;
  const float scale = *scale_ptr;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const bool whole = vec && r0 + kTile <= rows && c0 + kTile <= cols;
  unsigned bits = 0;
  if (whole) {
    const int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 16;
    const __nv_bfloat16* gate = gate_up + (r0 + r) * 2 * cols + c0 + c;
    const __nv_bfloat16* d = dh + (r0 + r) * cols + c0 + c;
    float dy[2][8], g[2][8], u[2][8];
    load8(d, dy[0]);
    load8(d + 8, dy[1]);
    load8(gate, g[0]);
    load8(gate + 8, g[1]);
    load8(gate + cols, u[0]);
    load8(gate + cols + 8, u[1]);
    uint4 packed_gate, packed_up;
    auto* bg = reinterpret_cast<uint8_t*>(&packed_gate);
    auto* bu = reinterpret_cast<uint8_t*>(&packed_up);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float dgate, dup;
      swiglu_backward_values(dy[j / 8][j % 8], g[j / 8][j % 8], u[j / 8][j % 8], dgate, dup);
      bits = max(bits, max(detail::fp8_abs_bits(dgate), detail::fp8_abs_bits(dup)));
      bg[j] = detail::fp8_encode<F>(dgate, scale);
      bu[j] = detail::fp8_encode<F>(dup, scale);
    }
    uint8_t* q_row = q + (r0 + r) * 2 * cols + c0 + c;
    *reinterpret_cast<uint4*>(q_row) = packed_gate;
    *reinterpret_cast<uint4*>(q_row + cols) = packed_up;
    const auto* wg = reinterpret_cast<const uint32_t*>(&packed_gate);
    const auto* wu = reinterpret_cast<const uint32_t*>(&packed_up);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint32_t*>(&tile_gate[r][c + 4 * j]) = wg[j];
      *reinterpret_cast<uint32_t*>(&tile_up[r][c + 4 * j]) = wu[j];
    }
  } else {
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      const int64_t gr = r0 + r, gc = c0 + c;
      if (gr < rows && gc < cols) {
        const __nv_bfloat16* row = gate_up + gr * 2 * cols;
        float dgate, dup;
        swiglu_backward_values(to_float(dh[gr * cols + gc]), to_float(row[gc]), to_float(row[cols + gc]), dgate, dup);
        bits = max(bits, max(detail::fp8_abs_bits(dgate), detail::fp8_abs_bits(dup)));
        tile_gate[r][c] = q[gr * 2 * cols + gc] = detail::fp8_encode<F>(dgate, scale);
        tile_up[r][c] = q[gr * 2 * cols + cols + gc] = detail::fp8_encode<F>(dup, scale);
      }
    }
  }
  __syncthreads();
  if (whole) {
    write_tile_transposed_vec(ld, r0, c0, q_t, tile_gate);
    write_tile_transposed_vec(ld, r0, c0, q_t + cols * ld, tile_up);
  } else {
    write_tile_transposed(rows, cols, ld, r0, c0, q_t, tile_gate);
    write_tile_transposed(rows, cols, ld, r0, c0, q_t + cols * ld, tile_up);
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
  if (a.prologue != Fp8Prologue::kNone && a.x_type != Fp8Source::kBF16) fail("the GELU prologues read bf16 x");
  const bool backward = a.prologue == Fp8Prologue::kGeluTanhBackward || a.prologue == Fp8Prologue::kSwigluBackward;
  if (backward != (a.x2 != nullptr)) fail("x2 is given with the backward prologues and only there");
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <typename T, Fp8Format F, Fp8Prologue P>
void launch_cast(const Fp8CastArgs& a, cudaStream_t stream) {
  const int64_t n = a.rows * a.cols;
  const T* x = static_cast<const T*>(a.x);
  const T* x2 = static_cast<const T*>(a.x2);
  const bool vec = aligned(a.x, 16) && aligned(a.x2, 16) && aligned(a.q, 8) && (!reads_gate_up(P) || a.cols % 8 == 0);
  const int64_t work = vec ? std::max<int64_t>(n / 8, 1) : n;
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int grid = int(std::min<int64_t>(wanted, int64_t(multiprocessor_count()) * kBlocksPerSm));
  if (vec) {
    fp8_cast_kernel<T, F, true, P><<<grid, kThreads, 0, stream>>>(x, x2, n, a.cols, a.scale, a.q, a.amax);
  } else {
    fp8_cast_kernel<T, F, false, P><<<grid, kThreads, 0, stream>>>(x, x2, n, a.cols, a.scale, a.q, a.amax);
  }
  PERFTRAIN_LAUNCH_CHECK();
}

// The tile kernels' launch: the grid, q_t's row pitch and whether whole
// tiles may take the vector path (sizes multiples of 16, pointers 16-byte aligned).
struct TileLaunch {
  dim3 grid;
  int64_t ld;
  bool vec;
};
TileLaunch tile_launch(const Fp8CastArgs& a) {
  const int64_t ld = a.q_t_ld != 0 ? a.q_t_ld : a.rows;
  const bool vec = a.rows % 16 == 0 && a.cols % 16 == 0 && ld % 16 == 0 && aligned(a.x, 16) && aligned(a.x2, 16) &&
                   aligned(a.q, 16) && aligned(a.q_t, 16);
  return {tile_grid(a.rows, a.cols, "fp8_cast_transpose"), ld, vec};
}

template <Fp8Format F>
void launch_swiglu_backward(const Fp8CastArgs& a, cudaStream_t stream) {
  const TileLaunch t = tile_launch(a);
  fp8_swiglu_backward_kernel<F><<<t.grid, kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(a.x), static_cast<const __nv_bfloat16*>(a.x2), a.rows, a.cols, a.scale, a.q,
      a.q_t, t.ld, a.amax, t.vec);
  PERFTRAIN_LAUNCH_CHECK();
}

template <typename T, Fp8Format F, Fp8Prologue P>
void launch_cast_transpose(const Fp8CastArgs& a, cudaStream_t stream) {
  const TileLaunch t = tile_launch(a);
  fp8_cast_transpose_kernel<T, F, P><<<t.grid, kThreads, 0, stream>>>(static_cast<const T*>(a.x),
                                                                       static_cast<const T*>(a.x2), a.rows, a.cols,
                                                                       a.scale, a.q, a.q_t, t.ld, a.amax,
                                                                       a.col_partials, t.vec);
  PERFTRAIN_LAUNCH_CHECK();
}

// The launcher for (x_type, format, prologue): the prologues read bf16 only;
// SwiGLU's backward has its own kernel.
template <template <typename, Fp8Format, Fp8Prologue> class Launch>
void dispatch(const Fp8CastArgs& a, cudaStream_t stream) {
  using BF16 = __nv_bfloat16;
  constexpr Fp8Format kE4M3 = Fp8Format::kE4M3, kE5M2 = Fp8Format::kE5M2;
  const bool e4m3 = a.format == kE4M3;
  switch (a.prologue) {
    case Fp8Prologue::kGeluTanh:
      e4m3 ? Launch<BF16, kE4M3, Fp8Prologue::kGeluTanh>::run(a, stream)
           : Launch<BF16, kE5M2, Fp8Prologue::kGeluTanh>::run(a, stream);
      return;
    case Fp8Prologue::kGeluTanhBackward:
      e4m3 ? Launch<BF16, kE4M3, Fp8Prologue::kGeluTanhBackward>::run(a, stream)
           : Launch<BF16, kE5M2, Fp8Prologue::kGeluTanhBackward>::run(a, stream);
      return;
    case Fp8Prologue::kSwiglu:
      e4m3 ? Launch<BF16, kE4M3, Fp8Prologue::kSwiglu>::run(a, stream)
           : Launch<BF16, kE5M2, Fp8Prologue::kSwiglu>::run(a, stream);
      return;
    case Fp8Prologue::kSwigluBackward:  // its own kernel (fp8_cast_transpose); fp8_cast refuses it
      return;
    case Fp8Prologue::kNone:
      break;
  }
  if (a.x_type == Fp8Source::kBF16) {
    e4m3 ? Launch<BF16, kE4M3, Fp8Prologue::kNone>::run(a, stream) : Launch<BF16, kE5M2, Fp8Prologue::kNone>::run(a, stream);
  } else {
    e4m3 ? Launch<float, kE4M3, Fp8Prologue::kNone>::run(a, stream)
         : Launch<float, kE5M2, Fp8Prologue::kNone>::run(a, stream);
  }
}

template <typename T, Fp8Format F, Fp8Prologue P>
struct CastLaunch {
  static void run(const Fp8CastArgs& a, cudaStream_t s) { launch_cast<T, F, P>(a, s); }
};
template <typename T, Fp8Format F, Fp8Prologue P>
struct CastTransposeLaunch {
  static void run(const Fp8CastArgs& a, cudaStream_t s) { launch_cast_transpose<T, F, P>(a, s); }
};

}  // namespace

void fp8_cast(const Fp8CastArgs& a, cudaStream_t stream) {
  check(a, "fp8_cast");
  if (a.q == nullptr) throw std::invalid_argument("fp8_cast: q must be non-null");
  if (a.q_t != nullptr) throw std::invalid_argument("fp8_cast: q_t is fp8_cast_transpose's output");
  if (a.col_partials != nullptr) throw std::invalid_argument("fp8_cast: col_partials is fp8_cast_transpose's output");
  if (a.prologue == Fp8Prologue::kSwigluBackward)
    throw std::invalid_argument("fp8_cast: SwiGLU's backward prologue is fp8_cast_transpose's");
  if (a.rows * a.cols == 0) return;
  dispatch<CastLaunch>(a, stream);
}

void fp8_cast_transpose(const Fp8CastArgs& a, cudaStream_t stream) {
  check(a, "fp8_cast_transpose");
  if (a.q_t == nullptr) throw std::invalid_argument("fp8_cast_transpose: q_t must be non-null");
  if (a.prologue == Fp8Prologue::kSwigluBackward) {
    if (a.q == nullptr || a.col_partials != nullptr)
      throw std::invalid_argument("fp8_cast_transpose: SwiGLU's backward writes q and takes no column partials");
    if (a.rows * a.cols == 0) return;
    a.format == Fp8Format::kE4M3 ? launch_swiglu_backward<Fp8Format::kE4M3>(a, stream)
                                 : launch_swiglu_backward<Fp8Format::kE5M2>(a, stream);
    return;
  }
  if (a.rows * a.cols == 0) return;
  dispatch<CastTransposeLaunch>(a, stream);
}

int64_t fp8_cast_partial_rows(int64_t rows) { return (rows + kTile - 1) / kTile; }

void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* q_t, cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("fp8_transpose: sizes must be non-negative");
  if (q == nullptr || q_t == nullptr) throw std::invalid_argument("fp8_transpose: q and q_t must be non-null");
  if (rows * cols == 0) return;
  const bool vec = rows % 16 == 0 && cols % 16 == 0 && aligned(q, 16) && aligned(q_t, 16);
  fp8_transpose_kernel<<<tile_grid(rows, cols, "fp8_transpose"), kThreads, 0, stream>>>(q, rows, cols, q_t, vec);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
