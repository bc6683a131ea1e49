#include "kernels/gemm_bias_gelu_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/gelu_tanh.cuh"
#include "kernels/sm90.cuh"
#include "kernels/tensor_map.h"

namespace perftrain::kernels {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBN = 128, kBK = 64;  // tile rows and columns; 64 bf16 of K = one 128-byte row
constexpr int kNMultiple = 256;                 // the host takes N in multiples of this (the tested shapes)
constexpr int kThreads = 384;                   // producer warpgroup + two consumer warpgroups
constexpr uint32_t kATileBytes = kBM * kBK * 2;
// The epilogue writes through shared memory: each consumer warpgroup has
// buffers of 64 rows x 64 columns (bf16, 128-byte swizzle), filled from the
// accumulators and written out by TMA stores.
constexpr int kChunkCols = 64;
constexpr uint32_t kChunkBytes = 64 * kChunkCols * 2;

// The ring's depth, and the 64 x 64 epilogue buffers of each consumer warpgroup.
constexpr int kStages = 4, kBuffers = 4;
static_assert((kBuffers & (kBuffers - 1)) == 0, "buffers taken in turn by a mask");

// The column sums' hand-over between the warps of a consumer warpgroup
// (gemm_dgelu_sm90): 4 warps x 64 columns of fp32.
constexpr uint32_t kRedFloats = 4 * kChunkCols;

// Shared memory: the ring of kStages (A tiles and W tiles of kBN rows),
// each consumer warpgroup's kBuffers and column-sum hand-over, then the
// barriers (full and empty per stage, four for the kernel's own use); 1024
// bytes of slack to align the start.
struct SmemLayout {
  static constexpr uint32_t kRing = kStages * (kATileBytes + uint32_t(kBN) * kBK * 2);
  static constexpr uint32_t kStaging = 2 * kBuffers * kChunkBytes;
  static constexpr uint32_t kRed = 2 * kRedFloats * 4;
  static constexpr size_t kTotal = kRing + kStaging + kRed + (2 * kStages + 4) * sizeof(uint64_t) + 1024;
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

using namespace sm90;  // the instruction helpers (kernels/sm90.cuh)

// The tanh form, as cuBLASLt's GELU epilogue and ATen's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanh_approx(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

using gelu_math::gelu_tanh_grad;

__device__ __forceinline__ float2 bias_pair(const float* b) { return __ldg(reinterpret_cast<const float2*>(b)); }
__device__ __forceinline__ float2 bias_pair(const bf16* b) {
  return __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(b)));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float2 v) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

// The epilogues. In the layout of wgmma m64nNk16 a consumer thread holds rows
// `row` and row + 8 (h = 0, 1), columns cl + 8j and the next (cl = 2 (lane % 4)),
// in d[4j + 2h] and d[4j + 2h + 1]: a 64-column half jc of the 128-column tile
// is j = 8 jc + jj (jj < 8).
//
// An epilogue says how the tile's W is loaded: K-major (W [N, K], kWPieces
// boxes of 128 / kWPieces rows of N) or, with kWMnMajor, MN-major (W [K, N],
// two boxes of 64 rows of K x 64 columns of N: the atoms of the transposed
// operand); box p of k-step kb of tile column tn at (column, row) =
// w_box(tn, p, kb). And what it writes: kChunks 64-column chunks, each for
// both 64-row halves hh of the tile, chunk ch to output output(ch) at
// column column(tn, ch), its pair (jj, h) being value(...) (fp32, stored
// rounded to bf16); load(cl, tn, ch) fetches what a chunk needs from memory
// (a Chunk) while the one before is written. kLoadsC: the tile's input C (a [M, N] bf16 matrix,
// e.g. pre) comes by TMA into the warpgroup's staging buffers while its
// products run, each block (ch, hh) where its output will be staged, and
// value() gets the C pair at its own position. kColumnSums: the column sums
// of the values as stored, one row of fp32 partials per 128-row tile
// (column_partials).

// The accumulators' pair (jj, h) of 64-column half jc.
__device__ __forceinline__ float2 acc_pair(const float (&d)[64], int jc, int jj, int h) {
  const int q = 4 * (8 * jc + jj) + 2 * h;
  return make_float2(d[q], d[q + 1]);
}

// fc1: chunks 0, 1 pre = acc + b (halves 0, 1), chunks 2, 3 act =
// gelu_tanh(acc + b); W's rows [128 tn, 128 tn + 128) in one box.
template <typename TB>
struct BiasGeluEpilogue {
  static constexpr int kWPieces = 1, kChunks = 4;
  static constexpr bool kWMnMajor = false, kLoadsC = false, kColumnSums = false;
  const TB* bias;
  struct Chunk {
    float2 b[8];
  };
  __device__ __forceinline__ static int2 w_box(int tn, int, int kb) { return make_int2(kb * kBK, tn * kBN); }
  __device__ __forceinline__ static int output(int ch) { return ch / 2; }
  __device__ __forceinline__ static int column(int tn, int ch) { return tn * kBN + kChunkCols * (ch % 2); }
  __device__ __forceinline__ Chunk load(int cl, int tn, int ch) const {
    Chunk c;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) c.b[jj] = bias_pair(bias + tn * kBN + cl + 8 * (8 * (ch % 2) + jj));
    return c;
  }
  __device__ __forceinline__ float2 value(const Chunk& c, int ch, int jj, int h, const float (&d)[64], uint32_t) const {
    const float2 v = acc_pair(d, ch % 2, jj, h);
    const float v0 = v.x + c.b[jj].x, v1 = v.y + c.b[jj].y;
    return ch < 2 ? make_float2(v0, v1) : make_float2(gelu_tanh(v0), gelu_tanh(v1));
  }
};

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// The single-stream FFN's gate-up product: tile column tn's B tile is W_gu's
// gate rows [64 tn, 64 tn + 64) then its up rows [F + 64 tn, ...) (two boxes),
// so accumulator half 0 is gate column c and half 1 up column c of the same
// rows. Chunk 0 writes gate_up's gate piece (column 64 tn), chunk 1 its up
// piece (F + 64 tn), chunk 2 h = silu(gate) * up (column 64 tn of h).
struct SwigluEpilogue {
  static constexpr int kWPieces = 2, kChunks = 3;
  static constexpr bool kWMnMajor = false, kLoadsC = false, kColumnSums = false;
  int f;
  struct Chunk {};
  __device__ __forceinline__ int2 w_box(int tn, int piece, int kb) const {
    return make_int2(kb * kBK, tn * kChunkCols + piece * f);
  }
  __device__ __forceinline__ static int output(int ch) { return ch / 2; }
  __device__ __forceinline__ int column(int tn, int ch) const { return tn * kChunkCols + (ch == 1 ? f : 0); }
  __device__ __forceinline__ Chunk load(int, int, int) const { return {}; }
  __device__ __forceinline__ float2 value(const Chunk&, int ch, int jj, int h, const float (&d)[64], uint32_t) const {
    if (ch < 2) return acc_pair(d, ch, jj, h);
    const float2 g = acc_pair(d, 0, jj, h), u = acc_pair(d, 1, jj, h);
    return make_float2(silu(g.x) * u.x, silu(g.y) * u.y);
  }
};

// fc2's backward through GELU: dpre = (dY W2) * gelu_tanh'(pre), W2 [K, N]
// as fc2's weight is kept (MN-major: the two 64-column atoms of a k-step);
// chunks 0, 1 are the tile's column halves of dpre, pre the C that TMA
// brings into the staging buffers (a thread reads its pair where it then
// writes dpre's). The column sums of dpre as stored (fc1's bias gradient)
// go to `partials`.
struct DGeluEpilogue {
  static constexpr int kWPieces = 2, kChunks = 2;
  static constexpr bool kWMnMajor = true, kLoadsC = true, kColumnSums = true;
  float* partials;  // [m / 128, n] or null (no sums)
  struct Chunk {};
  __device__ __forceinline__ static int2 w_box(int tn, int piece, int kb) {
    return make_int2(tn * kBN + kChunkCols * piece, kb * kBK);
  }
  __device__ __forceinline__ static int output(int) { return 0; }
  __device__ __forceinline__ static int column(int tn, int ch) { return tn * kBN + kChunkCols * ch; }
  __device__ __forceinline__ Chunk load(int, int, int) const { return {}; }
  __device__ __forceinline__ float2 value(const Chunk&, int ch, int jj, int h, const float (&d)[64],
                                          uint32_t pre) const {
    const float2 g = acc_pair(d, ch, jj, h), x = unpack_bf16x2(pre);
    return make_float2(g.x * gelu_tanh_grad(x.x), g.y * gelu_tanh_grad(x.y));
  }
};

// The ring's barriers (full: the producer's arrive plus the TMA bytes;
// empty: one arrive per consumer warp that read the stage) and four more
// single-arrive barriers for the kernel's own use; thread 0 only, before
// the block's first __syncthreads.
__device__ __forceinline__ void init_ring_barriers(uint64_t* full, uint64_t* empty, int stages, int empty_arrivals,
                                                   uint64_t* extra) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], empty_arrivals);
  }
  for (int e = 0; e < 4; ++e) mbar_init(&extra[e], 1);
  fence_mbarrier_init();
}

// The dynamic shared memory, carved as SmemLayout says: the ring's A and W
// stages, the epilogue buffers, the column sums' hand-over, and the
// barriers (full and empty per stage, then four more for the kernel's own use).
struct SmemParts {
  bf16 *sa, *sw;
  unsigned char* staging;
  float* red;
  uint64_t *full, *empty, *extra;
};

__device__ __forceinline__ SmemParts carve_smem(unsigned char* smem_raw) {
  // The 128-byte swizzle repeats every 1024 bytes: tiles start on a multiple.
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  SmemParts p;
  p.sa = reinterpret_cast<bf16*>(smem);
  p.sw = reinterpret_cast<bf16*>(smem + kStages * kATileBytes);
  p.staging = smem + SmemLayout::kRing;
  p.red = reinterpret_cast<float*>(smem + SmemLayout::kRing + SmemLayout::kStaging);
  p.full = reinterpret_cast<uint64_t*>(smem + SmemLayout::kRing + SmemLayout::kStaging + SmemLayout::kRed);
  p.empty = p.full + kStages;
  p.extra = p.empty + kStages;
  return p;
}

// The producer warpgroup: it gives up registers to the consumers, and one
// thread, for each of the CTA's tiles (blockIdx.x, + gridDim.x, ...), loads
// its k-steps' A (128 rows) and W (128 columns of N, in the epilogue's
// boxes) into the ring, each stage once its last readers have released it.
template <typename Epilogue>
__device__ __forceinline__ void run_producer(const CUtensorMap* tma_a, const CUtensorMap* tma_w, const SmemParts& p,
                                             const Epilogue& epilogue, int tiles, int tiles_n, int kblocks) {
  constexpr int kWBoxRows = kBN / Epilogue::kWPieces;  // elements of a box: kWBoxRows x kBK
  static_assert(!Epilogue::kWMnMajor || Epilogue::kWPieces == 2, "MN-major W: two 64 x 64 atoms a k-step");
  setmaxnreg_dec<40>();
  if (threadIdx.x != 0) return;
  int it = 0;  // k-steps issued, over all tiles
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int tn = tile % tiles_n, m0 = (tile / tiles_n) * kBM;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&p.empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
      mbar_arrive_expect_tx(&p.full[s], kATileBytes + kBN * kBK * 2);
      tma_load_2d(p.sa + s * kBM * kBK, tma_a, &p.full[s], kb * kBK, m0);
      // K-major: boxes of whole 8-row swizzle groups back to back, the same layout as one box of kBN rows.
      // MN-major: the two 64-column atoms, 8 KB apart.
#pragma unroll
      for (int piece = 0; piece < Epilogue::kWPieces; ++piece) {
        const int2 box = epilogue.w_box(tn, piece, kb);
        tma_load_2d(p.sw + s * kBN * kBK + piece * kWBoxRows * kBK, tma_w, &p.full[s], box.x, box.y);
      }
    }
  }
}

// The kernel's start: thread 0 sets up the ring's barriers (a stage is read
// by one consumer warpgroup: its four warps release it) and the four extra
// ones; then the producer warpgroup runs the producer and returns false, and
// the consumer warpgroups take the registers it gave up and return true.
template <typename Epilogue>
__device__ __forceinline__ bool start_pipeline(const CUtensorMap* tma_a, const CUtensorMap* tma_w, const SmemParts& p,
                                               const Epilogue& epilogue, int m, int n, int k) {
  if (threadIdx.x == 0) init_ring_barriers(p.full, p.empty, kStages, 4, p.extra);
  __syncthreads();
  if (threadIdx.x < 128) {
    run_producer(tma_a, tma_w, p, epilogue, (m / kBM) * (n / kBN), n / kBN, k / kBK);
    return false;
  }
  setmaxnreg_inc<232>();
  return true;
}

// Where a consumer thread's pair (jj, h) of a 64 x 64 epilogue chunk goes in
// a 128-byte-swizzled buffer: 16-byte unit jj of row r at unit jj ^ (r % 8),
// as TMA's swizzle reads it back (the 32 lanes of a warp then hit 32
// different banks); r = the thread's row h (0: lane / 4, 1: + 8) of its warp's 16.
__device__ __forceinline__ uint32_t swizzled_pair(uint32_t buf, int warp, int lane, int jj, int h) {
  const int r = warp * 16 + lane / 4 + 8 * h;  // row within the warpgroup's 64
  return buf + r * 128 + ((jj ^ (r & 7)) << 4) + 4 * (lane & 3);
}

// A 64-column chunk's sums over the tile's 128 rows, from each thread's sums
// over its four rows (sums[jj]: columns cl + 8 jj and the next, cl = 2 (lane
// % 4)): added over the warp's eight row groups by shuffles, then over the
// four warps in order through `red` (the warpgroup's kRedFloats), and
// written by the warpgroup's first 64 threads to out[0 .. 63] (the tile's
// row of partials at the chunk's first column). The next writer of `red`
// has passed a later warpgroup barrier, so no reader is left behind.
__device__ __forceinline__ void column_partials(float2 (&sums)[8], float* red, int warp, int lane, int bar,
                                                float* out) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      sums[jj].x += __shfl_xor_sync(0xffffffffu, sums[jj].x, o);
      sums[jj].y += __shfl_xor_sync(0xffffffffu, sums[jj].y, o);
    }
  if (lane < 4)
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      red[warp * kChunkCols + 2 * lane + 8 * jj] = sums[jj].x;
      red[warp * kChunkCols + 2 * lane + 8 * jj + 1] = sums[jj].y;
    }
  warpgroup_barrier(bar);
  const int t = threadIdx.x % 128;
  if (t < kChunkCols)
    out[t] = ((red[t] + red[kChunkCols + t]) + red[2 * kChunkCols + t]) + red[3 * kChunkCols + t];
}

// Writes a filled 64 x 64 buffer (shared address buf) to the tensor map at
// (column c0, row c1): the warpgroup's writes made visible to the TMA, then
// its store thread issues the store.
__device__ __forceinline__ void store_chunk(const CUtensorMap* map, unsigned char* staging, uint32_t buf,
                                            int warpgroup_bar, bool store_thread, int c0, int c1) {
  fence_async_shared();
  warpgroup_barrier(warpgroup_bar);
  if (store_thread) tma_store_2d(map, staging + (buf - smem_u32(staging)), c0, c1);
}

// The epilogue's outputs of A W^T (fc1's pre and act, or gate_up and h),
// in "ping-pong": each consumer warpgroup owns whole 128 x 128 tiles (the
// CTA's tiles 0, 2, 4, ... go to warpgroup 1, and 1, 3, 5, ... to 2), so
// while one writes its tile's epilogue the other's products keep the tensor
// cores busy. One ring of
// stages in tile order: the producer fills tile i's stages after tile
// i - 1's, so the two warpgroups' main loops follow each other.
// Persistent: each CTA takes tiles blockIdx.x, + gridDim.x, ... (consecutive
// tiles run along N, so the CTAs at work share A's rows; W fits in L2).
template <typename Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_pingpong_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_w,
                              const __grid_constant__ CUtensorMap tma_out0, const __grid_constant__ CUtensorMap tma_out1,
                              const __grid_constant__ CUtensorMap tma_c, const Epilogue epilogue, int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const SmemParts p = carve_smem(smem_raw);
  if (!start_pipeline(&tma_a, &tma_w, p, epilogue, m, n, k)) return;
  // handoff[c]: the other warpgroup has passed the full barriers of its
  // latest tile. A warpgroup waits on it before its next tile's main loop:
  // its stages' full barriers are then at most one phase ahead of what it
  // waits for, as parity waits need (without it, warpgroup 2 would wait on
  // tile 1's phases while the barriers are still in tile 0's and pass).
  uint64_t* const handoff = p.extra;
  // c_ready[c]: the C boxes of warpgroup c's tile have landed (kLoadsC).
  uint64_t* const c_ready = p.extra + 2;
  static_assert(!Epilogue::kLoadsC || 2 * Epilogue::kChunks == kBuffers, "a tile's C boxes fill the buffers once");
  const int tiles_n = n / kBN, tiles = (m / kBM) * tiles_n;
  const int kblocks = k / kBK;
  // warpgroup_index broadcasts from lane 0, so that c, the stage counters and the descriptors derived from it
  // stay in uniform registers. Computed per thread, the main loop's descriptor arithmetic ran in ordinary
  // registers, each moved to uniform ones for every product, and its dependent chain outlasted a k-step's
  // products (the tensor pipe 63% busy in the DGELU form at DiT-XL/2).
  const int c = warpgroup_index() - 1;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x & 31;
  // Rows 0-63 and 64-127 of the tile. Not cleared: each tile's first product
  // takes scale_d = 0 (d = A B^T). Clearing them would put non-wgmma writes
  // of the accumulators in the pipeline, and ptxas then serialises the
  // products (its warning C7515).
  float d0[64], d1[64];
  int chunk = 0;
  const bool store_thread = threadIdx.x % 128 == 0;
  const uint32_t my_staging = smem_u32(p.staging) + c * kBuffers * kChunkBytes;
  // The ring's stage 0 as wgmma descriptors. B's k16 step kk: 32 bytes along its K-major rows, or 16 rows
  // of 128 bytes into both MN-major atoms.
  constexpr bool kMn = Epilogue::kWMnMajor;
  constexpr uint64_t kStepB = kMn ? 128 : 2;
  const uint64_t desc_a0 = smem_desc(p.sa);
  const uint64_t desc_w0 = kMn ? smem_desc_mn_atoms(p.sw, kChunkCols * kBK * 2) : smem_desc(p.sw);
  // This warpgroup's tiles: the CTA's i-th tile for i = c, c + 2, ...
  int i = c;
  for (int tile = blockIdx.x + c * gridDim.x; tile < tiles; tile += 2 * gridDim.x, i += 2) {
    const int tn = tile % tiles_n, m0 = (tile / tiles_n) * kBM;
    if (i > 0) mbar_wait(&handoff[c], ((i - 1) / 2) & 1);  // the CTA's tile i - 1 has passed its waits
    uint32_t it = uint32_t(i) * kblocks;  // this tile's first stage in the ring's order
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const uint32_t s = it % kStages;
      mbar_wait(&p.full[s], (it / kStages) & 1);
      // Stage s's descriptors: stage 0's plus s stages (the address field counts 16-byte units).
      const uint64_t da = desc_a0 + s * (kATileBytes >> 4);
      const uint64_t da_low = da + ((64 * kBK * 2) >> 4);
      const uint64_t dw = desc_w0 + s * ((kBN * kBK * 2) >> 4);
      fence_accumulators(d0);
      fence_accumulators(d1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wgmma_m64n128k16<kMn>(d0, da + 2 * kk, dw + kStepB * kk, (kb > 0 || kk > 0) ? 1 : 0);
        wgmma_m64n128k16<kMn>(d1, da_low + 2 * kk, dw + kStepB * kk, (kb > 0 || kk > 0) ? 1 : 0);
      }
      wgmma_commit();
      if constexpr (Epilogue::kLoadsC)
        if (kb == 0 && store_thread) {
          // While this tile's products run: its C boxes into the buffers their outputs will be staged in
          // (block (ch, hh) into buffer 2 ch + hh), once the last tile's stores have read them.
          tma_store_wait_read<0>();
          mbar_arrive_expect_tx(&c_ready[c], kBuffers * kChunkBytes);
#pragma unroll
          for (int b = 0; b < kBuffers; ++b)
            tma_load_2d(p.staging + (c * kBuffers + b) * kChunkBytes, &tma_c, &c_ready[c], epilogue.column(tn, b / 2),
                        m0 + 64 * (b % 2));
        }
      if (kb > 0) {  // the previous step's products are done: its stage may be refilled
        wgmma_wait<1>();
        fence_accumulators(d0);
        fence_accumulators(d1);
        if (lane == 0) mbar_arrive(&p.empty[(it - 1) % kStages]);
      }
    }
    if (store_thread) mbar_arrive(&handoff[1 - c]);  // this thread has passed every full barrier of tile i
    const int cl = 2 * (lane & 3);
    typename Epilogue::Chunk next = epilogue.load(cl, tn, 0);  // while the last products run
    wgmma_wait<0>();
    fence_accumulators(d0);
    fence_accumulators(d1);
    if (lane == 0) mbar_arrive(&p.empty[(it - 1) % kStages]);  // the tile's last stage
    // The epilogue's chunks ch, each for row halves hh (d0, d1); the buffers
    // in turn, a chunk's loads out while the one before is written.
    float2 sums[8];  // kColumnSums: the chunk's columns over the thread's four rows
    if constexpr (Epilogue::kLoadsC) mbar_wait(&c_ready[c], (i / 2) & 1);  // this warpgroup's (i / 2)-th tile
#pragma unroll
    for (int ch = 0; ch < Epilogue::kChunks; ++ch) {
      const typename Epilogue::Chunk loaded = next;
      if (ch + 1 < Epilogue::kChunks) next = epilogue.load(cl, tn, ch + 1);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh, ++chunk) {
        const float(&d)[64] = hh == 0 ? d0 : d1;
        const uint32_t buf = my_staging + (chunk & (kBuffers - 1)) * kChunkBytes;
        if (store_thread) tma_store_wait_read<kBuffers - 1>();  // this buffer's previous store has read it
        warpgroup_barrier(1 + c);
        // kLoadsC: the block's C pairs read all at once, before its first store: the shared accesses are
        // ordered asm, so a load after a store would wait for it and the pairs' math would run one at a time.
        uint32_t c_pairs[8][2];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            c_pairs[jj][h] = Epilogue::kLoadsC ? ld_shared_u32(swizzled_pair(buf, warp, lane, jj, h)) : 0u;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t at = swizzled_pair(buf, warp, lane, jj, h);
            const uint32_t v = pack_bf16x2(epilogue.value(loaded, ch, jj, h, d, c_pairs[jj][h]));
            st_shared_u32(at, v);
            if constexpr (Epilogue::kColumnSums) {
              const float2 stored = unpack_bf16x2(v);
              sums[jj] = hh == 0 && h == 0 ? stored : make_float2(sums[jj].x + stored.x, sums[jj].y + stored.y);
            }
          }
        }
        store_chunk(Epilogue::output(ch) == 0 ? &tma_out0 : &tma_out1, p.staging, buf, 1 + c, store_thread,
                    epilogue.column(tn, ch), m0 + 64 * hh);
      }
      if constexpr (Epilogue::kColumnSums)
        if (epilogue.partials != nullptr)
          column_partials(sums, p.red + c * kRedFloats, warp, lane, 1 + c,
                          epilogue.partials + int64_t(m0 / kBM) * n + epilogue.column(tn, ch));
    }
  }
  if (store_thread) tma_store_wait_read<0>();  // shared memory must outlive the stores' reads
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

// A [rows, cols] bf16 row-major matrix in boxes of box_rows x 64 columns
// (128 bytes: the swizzle's row), for loads into the ring or stores from the
// epilogue's buffers.
static_assert(kBK == 64, "the tensor maps' boxes are 64 columns wide");
CUtensorMap tensor_map(const bf16* base, int64_t rows, int64_t cols, int box_rows, const char* what) {
  return bf16_tensor_map(base, rows, cols, box_rows, what);
}

// The kernel with one CTA per SM, each looping over the (m / 128) x (n / 128)
// tiles; W's boxes of 128 / kWPieces rows.
template <typename Epilogue>
void launch_pingpong(const char* what, const bf16* a, const bf16* w, bf16* out0, int64_t out0_cols, bf16* out1,
                     int64_t out1_cols, const bf16* c, const Epilogue& epilogue, int64_t m, int64_t n, int64_t k,
                     cudaStream_t stream) {
  const int device = sm90_device(what);
  const CUtensorMap map_a = tensor_map(a, m, k, kBM, what);
  const CUtensorMap map_w = Epilogue::kWMnMajor ? tensor_map(w, k, n, kBK, what)  // W [K, N]: 64 x 64 atoms
                                                : tensor_map(w, n, k, kBN / Epilogue::kWPieces, what);
  const CUtensorMap map_0 = tensor_map(out0, m, out0_cols, 64, what), map_1 = tensor_map(out1, m, out1_cols, 64, what);
  const CUtensorMap map_c = Epilogue::kLoadsC ? tensor_map(c, m, n, 64, what) : map_0;  // unused without C
  const auto kernel = gemm_sm90_pingpong_kernel<Epilogue>;
  static std::atomic<uint64_t> attribute_set_on{0};  // one flag per epilogue (one kernel each)
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(SmemLayout::kTotal), device, attribute_set_on);
  int sms = 0;
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (m / kBM) * (n / kBN);
  const unsigned grid = unsigned(std::min<int64_t>(tiles, std::max(sms, 1)));
  kernel<<<grid, kThreads, SmemLayout::kTotal, stream>>>(map_a, map_w, map_0, map_1, map_c, epilogue, int(m), int(n),
                                                         int(k));
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k) {
  // The tile index is an int: (m / 128) * (n / 128) must fit.
  return m > 0 && n > 0 && k > 0 && m % kBM == 0 && n % kNMultiple == 0 && k % kBK == 0 && m <= INT32_MAX &&
         n <= INT32_MAX && k <= INT32_MAX && (m / kBM) * (n / kBN) <= INT32_MAX;
}

bool gemm_swiglu_sm90_supported(int64_t m, int64_t f, int64_t k) {
  // As fc1's with n = 2F; a tile's 64 gate and 64 up rows need F % 64.
  return f > 0 && f % kChunkCols == 0 && f <= INT32_MAX / 2 && m > 0 && k > 0 && m % kBM == 0 && k % kBK == 0 &&
         m <= INT32_MAX && k <= INT32_MAX && (m / kBM) * (2 * f / kBN) <= INT32_MAX;
}

void gemm_swiglu_sm90(const bf16* a, const bf16* w_gu, bf16* gate_up, bf16* h, int64_t m, int64_t f, int64_t k,
                      cudaStream_t stream) {
  const char* const what = "gemm_swiglu_sm90";
  if (!gemm_swiglu_sm90_supported(m, f, k))
    throw std::invalid_argument(std::string(what) + ": unsupported shape m=" + std::to_string(m) + " f=" +
                                std::to_string(f) + " k=" + std::to_string(k) + " (needs m % 128, f % 64, k % 64 == 0)");
  check_tma_pointers(what, {a, w_gu, gate_up, h});
  launch_pingpong(what, a, w_gu, gate_up, 2 * f, h, f, nullptr, SwigluEpilogue{int(f)}, m, 2 * f, k, stream);
}

bool gemm_dgelu_sm90_supported(int64_t m, int64_t n, int64_t k) { return gemm_bias_gelu_sm90_supported(m, n, k); }

void gemm_dgelu_sm90(const bf16* dy, const bf16* w2, const bf16* pre, bf16* dpre, float* partials, int64_t m, int64_t n,
                     int64_t k, cudaStream_t stream) {
  const char* const what = "gemm_dgelu_sm90";
  if (!gemm_dgelu_sm90_supported(m, n, k))
    throw std::invalid_argument(std::string(what) + ": unsupported shape m=" + std::to_string(m) + " n=" +
                                std::to_string(n) + " k=" + std::to_string(k) + " (needs m % 128, n % 256, k % 64 == 0)");
  check_tma_pointers(what, {dy, w2, pre, dpre});
  if (partials != nullptr && reinterpret_cast<uintptr_t>(partials) % 4 != 0)
    throw std::invalid_argument(std::string(what) + ": partials must be 4-byte aligned");
  launch_pingpong(what, dy, w2, dpre, n, dpre, n, pre, DGeluEpilogue{partials}, m, n, k, stream);
}

// Checks the bias, the shape and the pointers, then launches (the GPU checked there).
template <typename TB>
void gemm_bias_gelu_sm90(const bf16* a, const bf16* w, const TB* bias, bf16* pre, bf16* act, int64_t m, int64_t n,
                         int64_t k, cudaStream_t stream) {
  static_assert(std::is_same_v<TB, float> || std::is_same_v<TB, bf16>, "bias: float or bf16");
  const char* const what = "gemm_bias_gelu_sm90";
  if (bias == nullptr || reinterpret_cast<uintptr_t>(bias) % (2 * sizeof(TB)) != 0)
    throw std::invalid_argument(std::string(what) + ": bias must be given, aligned to two elements");
  if (!gemm_bias_gelu_sm90_supported(m, n, k))
    throw std::invalid_argument(std::string(what) + ": unsupported shape m=" + std::to_string(m) + " n=" +
                                std::to_string(n) + " k=" + std::to_string(k) + " (needs m % 128, n % 256, k % 64 == 0)");
  check_tma_pointers(what, {a, w, pre, act});
  launch_pingpong(what, a, w, pre, n, act, n, nullptr, BiasGeluEpilogue<TB>{bias}, m, n, k, stream);
}

template void gemm_bias_gelu_sm90<float>(const bf16*, const bf16*, const float*, bf16*, bf16*, int64_t, int64_t,
                                         int64_t, cudaStream_t);
template void gemm_bias_gelu_sm90<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, int64_t, int64_t,
                                        int64_t, cudaStream_t);

}  // namespace perftrain::kernels
