// Device helpers shared by the row kernels (gated_residual, the row norms of
// row_norm.cuh, qk_norm_rope, ...): fp32 math on float / __nv_bfloat16 / __half storage,
// vector loads and stores of up to 16 bytes, deterministic warp and row sums,
// the explicit instantiation over the storage types, and the host-side shape
// rules they agree on (16-byte alignment, threads per row, the tile split of
// the per-sample column reductions, the size check).
//
// Everything here is inline or a template: the header goes into several .cu
// files of one library.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace perftrain::kernels::detail {

// ---- element conversion (fp32 math on every storage type) ----

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// ---- vector access: VEC elements per call, in words of at most 16 bytes ----

template <int Bytes> struct RawWord;
template <> struct RawWord<16> { using type = uint4; };
template <> struct RawWord<8> { using type = uint2; };
template <> struct RawWord<4> { using type = unsigned int; };
template <> struct RawWord<2> { using type = unsigned short; };

// Elements per memory instruction: VEC elements, at most 16 bytes.
template <typename T, int VEC>
constexpr int chunk_elems() { return VEC * sizeof(T) > 16 ? int(16 / sizeof(T)) : VEC; }

// VEC elements of T as the memory words they were loaded in: a load issued
// early (a row ahead) is converted only where it is used, so that the
// conversion does not make the thread wait for it at the load.
template <typename T, int VEC>
struct RawVec {
  static constexpr int kChunk = chunk_elems<T, VEC>();
  using Word = typename RawWord<kChunk * sizeof(T)>::type;
  Word w[VEC / kChunk];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_raw(const T* p, RawVec<T, VEC>& r) {
  constexpr int C = RawVec<T, VEC>::kChunk;
  using Word = typename RawVec<T, VEC>::Word;
#pragma unroll
  for (int i = 0; i < VEC / C; ++i) r.w[i] = *reinterpret_cast<const Word*>(p + i * C);
}

template <typename T, int VEC>
__device__ __forceinline__ void raw_to_float(const RawVec<T, VEC>& r, float (&f)[VEC]) {
  constexpr int C = RawVec<T, VEC>::kChunk;
#pragma unroll
  for (int i = 0; i < VEC / C; ++i) {
    T e[C];
    memcpy(e, &r.w[i], sizeof(r.w[i]));
#pragma unroll
    for (int j = 0; j < C; ++j) f[i * C + j] = to_float(e[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[VEC]) {
  RawVec<T, VEC> r;
  load_raw(p, r);
  raw_to_float(r, f);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[VEC]) {
  constexpr int C = chunk_elems<T, VEC>();
  using Word = typename RawWord<C * sizeof(T)>::type;
#pragma unroll
  for (int i = 0; i < VEC; i += C) {
    T e[C];
#pragma unroll
    for (int j = 0; j < C; ++j) e[j] = from_float<T>(f[i + j]);
    Word w;
    memcpy(&w, e, sizeof(w));
    *reinterpret_cast<Word*>(p + i) = w;
  }
}

// ---- reductions over the threads of one row ----

__device__ __forceinline__ float warp_sum(float v) {
  // Butterfly: every lane ends with the same bits (each step adds a pair in
  // both orders, and fp32 addition is commutative).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sums K values over the blockDim.x threads that share a row; every one of
// them gets the same result, in a fixed order (deterministic). With more than
// one warp per row the block must hold exactly one row (blockDim.y == 1), and
// all its threads must call this.
template <int K>
__device__ __forceinline__ void row_sum(float (&v)[K], float* smem /* [32 * K] */) {
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  if (blockDim.x == 32) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  __syncthreads();  // the previous call's readers are done with smem
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[warp * K + k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float t = 0.f;
    for (int w = 0; w < warps; ++w) t += smem[w * K + k];
    v[k] = t;
  }
}

// ---- the per-sample column sums' reduction over row tiles ----

// s[k] (k < K) = the sum over `tiles` row tiles, in tile order, of plane k's
// partial sums of one column: p points at (sample b, tile 0, column c) of
// plane 0 in fp32 partials [planes][batch][tiles][cols], planes `plane`
// floats apart. The fixed order makes the reduce kernels deterministic.
template <int K>
__device__ __forceinline__ void sum_tiles(const float* p, int64_t plane, int tiles, int cols, float* s) {
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = 0.f;
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] += p[k * plane + int64_t(t) * cols];
  }
}

// One plane of per-column partial sums, stored once: the thread's vectors c = x + i *
// blockDim.x (c < nvec) of VEC sums in acc[i], at p + c * VEC (p: this block's row of the
// plane).
template <int ITEMS, int VEC>
__device__ __forceinline__ void store_plane(float* p, const float (&acc)[ITEMS][VEC], int nvec) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) store_vec<float, VEC>(p + c * VEC, acc[i]);
  }
}

// ---- explicit instantiation over the storage types ----

// M(A, B, C) for every combination of the three storage types (27 in all):
// the row kernels' host functions are templates on three of them.
#define PERFTRAIN_STORAGE_TYPES_C(M, A, B) M(A, B, float) M(A, B, __nv_bfloat16) M(A, B, __half)
#define PERFTRAIN_STORAGE_TYPES_BC(M, A)                                                  \
  PERFTRAIN_STORAGE_TYPES_C(M, A, float) PERFTRAIN_STORAGE_TYPES_C(M, A, __nv_bfloat16) \
      PERFTRAIN_STORAGE_TYPES_C(M, A, __half)
#define PERFTRAIN_FOR_STORAGE_TYPES3(M)                                             \
  PERFTRAIN_STORAGE_TYPES_BC(M, float) PERFTRAIN_STORAGE_TYPES_BC(M, __nv_bfloat16) \
      PERFTRAIN_STORAGE_TYPES_BC(M, __half)

// ---- host-side shape rules ----

// 16-byte vectors need every row start aligned: cols and the strides a
// multiple of 8 elements (the caller checks those) and the base pointers
// aligned to one memory word.
template <typename T>
bool vec8_aligned(const T* p) {
  const size_t word = std::min<size_t>(16, 8 * sizeof(T));
  return reinterpret_cast<uintptr_t>(p) % word == 0;
}

// Threads per row: the fewest whole warps that cover nvec vectors at `items`
// vectors a thread; std::invalid_argument naming `what` above max_threads.
inline int row_threads(int nvec, int items, int max_threads, const char* what) {
  const int t = (nvec + items - 1) / items;
  const int threads = std::max(32, (t + 31) / 32 * 32);
  if (threads > max_threads) throw std::invalid_argument(std::string(what) + ": row too wide for the kernel");
  return threads;
}

// How many row tiles per sample a backward with per-sample column sums uses:
// about 8 blocks per SM in all, at least 4 rows per tile, and no empty tile.
// The tile count fixes the summation order, so it depends on shapes and the
// SM count only.
inline int sample_row_tiles(int batch, int tokens, int sm_count) {
  constexpr int kBlocksPerSm = 8;
  if (batch < 1 || tokens < 1) return 1;
  const int64_t target = int64_t(kBlocksPerSm) * std::max(sm_count, 1);
  int64_t tiles = (target + batch - 1) / batch;
  tiles = std::max<int64_t>(1, std::min<int64_t>(tiles, tokens / 4));
  const int64_t rows_per_tile = (tokens + tiles - 1) / tiles;
  return int((tokens + rows_per_tile - 1) / rows_per_tile);
}

// The same, by waves: with `slots` blocks resident on the GPU at once, the
// tile count that minimises waves x (rows per tile + overhead_rows), fewest
// tiles on a tie. The model: a block's time grows with its rows, and a last
// wave that fills the GPU only partly still takes a block's time. So, e.g.,
// 256 samples on 660 slots take 5 tiles (1280 blocks, 2 full-ish waves of 52
// rows) rather than 4 (1024 blocks, 1.55 waves of 64). Where the kernel is
// bandwidth-bound the waves matter less than the model says: on the DiT steps
// it matches a tuned blocks-per-SM target without needing the constant.
// overhead_rows stands for the per-block start and the partial sums' store.
// Shapes, SMs and the kernel's block size only, so the summation order
// stays fixed.
inline int wave_row_tiles(int batch, int tokens, int64_t slots, int overhead_rows) {
  if (batch < 1 || tokens < 1) return 1;
  slots = std::max<int64_t>(slots, 1);
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int t = 1; t <= std::max(1, tokens / 4); ++t) {
    const int64_t rows = (tokens + t - 1) / t;
    if ((tokens + rows - 1) / rows != t) continue;  // the same tiles as a smaller t
    const int64_t waves = (int64_t(batch) * t + slots - 1) / slots;
    const int64_t cost = waves * (rows + overhead_rows);
    if (cost < best_cost) {
      best_cost = cost;
      best = t;
    }
  }
  return best;
}

// Sizes every row kernel takes: a grid of (tiles, batch) and 32-bit row indices.
inline void check_sizes(const char* what, int batch, int tokens, int cols, int max_cols) {
  if (batch < 0 || tokens < 0 || cols < 1 || cols > max_cols || batch > 65535 || int64_t(batch) * tokens > INT32_MAX)
    throw std::invalid_argument(std::string(what) + ": unsupported sizes batch=" + std::to_string(batch) +
                                " tokens=" + std::to_string(tokens) + " cols=" + std::to_string(cols));
}

inline void check_tiles(const char* what, int tiles_per_sample, int tokens) {
  if (tiles_per_sample < 1 || tiles_per_sample > std::max(tokens, 1))
    throw std::invalid_argument(std::string(what) + ": tiles_per_sample=" + std::to_string(tiles_per_sample) +
                                " for tokens=" + std::to_string(tokens));
}

}  // namespace perftrain::kernels::detail
