#include "kernels/gemm_bias_gelu_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
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

// Shared memory: the ring of kStages (A tiles and W tiles of kBN rows),
// each consumer warpgroup's kBuffers, then the barriers (full and empty per
// stage, two for the kernel's own use); 1024 bytes of slack to align the start.
struct SmemLayout {
  static constexpr uint32_t kRing = kStages * (kATileBytes + uint32_t(kBN) * kBK * 2);
  static constexpr uint32_t kStaging = 2 * kBuffers * kChunkBytes;
  static constexpr size_t kTotal = kRing + kStaging + (2 * kStages + 2) * sizeof(uint64_t) + 1024;
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

using namespace sm90;  // the instruction helpers (kernels/sm90.cuh)

// The tanh form, as cuBLASLt's GELU epilogue and ATen's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanh_approx(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float2 bias_pair(const float* b) { return __ldg(reinterpret_cast<const float2*>(b)); }
__device__ __forceinline__ float2 bias_pair(const bf16* b) {
  return __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(b)));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float v0, float v1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The epilogue. In the layout of wgmma m64nNk16 a consumer thread holds rows
// `row` and row + 8 (h = 0, 1), columns col + 8j and the next, in d[4j + 2h]
// and d[4j + 2h + 1]. The kernel walks the 64-column chunks jc of a tile
// (j = 8 jc + jj).
//
// Output 0 pre = acc + b, output 1 act = gelu_tanh(acc + b); load() fetches
// a chunk's bias pairs into registers (a Chunk) for value().
template <typename TB>
struct BiasGeluEpilogue {
  static constexpr int kOutputs = 2;
  const TB* bias;
  struct Chunk {
    float2 b[8];
  };
  __device__ __forceinline__ Chunk load(int col, int jc) const {
    Chunk c;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) c.b[jj] = bias_pair(bias + col + 8 * (8 * jc + jj));
    return c;
  }
  __device__ __forceinline__ uint32_t value(const Chunk& c, int o, int jj, float v0, float v1) const {
    v0 += c.b[jj].x;
    v1 += c.b[jj].y;
    return o == 0 ? pack_bf16x2(v0, v1) : pack_bf16x2(gelu_tanh(v0), gelu_tanh(v1));
  }
};

// The ring's barriers (full: the producer's arrive plus the TMA bytes;
// empty: one arrive per consumer warp that read the stage) and two more
// single-arrive barriers for the kernel's own use; thread 0 only, before
// the block's first __syncthreads.
__device__ __forceinline__ void init_ring_barriers(uint64_t* full, uint64_t* empty, int stages, int empty_arrivals,
                                                   uint64_t* extra) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], empty_arrivals);
  }
  mbar_init(&extra[0], 1);
  mbar_init(&extra[1], 1);
  fence_mbarrier_init();
}

// The dynamic shared memory, carved as SmemLayout says: the ring's A and W
// stages, the epilogue buffers, and the barriers (full and empty per stage,
// then two more for the kernel's own use).
struct SmemParts {
  bf16 *sa, *sw;
  unsigned char* staging;
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
  p.full = reinterpret_cast<uint64_t*>(smem + SmemLayout::kRing + SmemLayout::kStaging);
  p.empty = p.full + kStages;
  p.extra = p.empty + kStages;
  return p;
}

// The producer warpgroup: it gives up registers to the consumers, and one
// thread, for each of the CTA's tiles (blockIdx.x, + gridDim.x, ...), loads
// its k-steps' A (128 rows) and W (128 rows) boxes into the ring, each
// stage once its last readers have released it.
__device__ __forceinline__ void run_producer(const CUtensorMap* tma_a, const CUtensorMap* tma_w, const SmemParts& p,
                                             int tiles, int tiles_n, int kblocks) {
  setmaxnreg_dec<40>();
  if (threadIdx.x != 0) return;
  int it = 0;  // k-steps issued, over all tiles
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int n0 = (tile % tiles_n) * kBN, m0 = (tile / tiles_n) * kBM;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&p.empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
      mbar_arrive_expect_tx(&p.full[s], kATileBytes + kBN * kBK * 2);
      tma_load_2d(p.sa + s * kBM * kBK, tma_a, &p.full[s], kb * kBK, m0);
      tma_load_2d(p.sw + s * kBN * kBK, tma_w, &p.full[s], kb * kBK, n0);
    }
  }
}

// The kernel's start: thread 0 sets up the ring's barriers (a stage is read
// by one consumer warpgroup: its four warps release it) and the two extra
// ones; then the producer warpgroup runs the producer and returns false, and
// the consumer warpgroups take the registers it gave up and return true.
__device__ __forceinline__ bool start_pipeline(const CUtensorMap* tma_a, const CUtensorMap* tma_w, const SmemParts& p,
                                               int m, int n, int k) {
  if (threadIdx.x == 0) init_ring_barriers(p.full, p.empty, kStages, 4, p.extra);
  __syncthreads();
  if (threadIdx.x < 128) {
    run_producer(tma_a, tma_w, p, (m / kBM) * (n / kBN), n / kBN, k / kBK);
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

// Writes a filled 64 x 64 buffer (shared address buf) to the tensor map at
// (column c0, row c1): the warpgroup's writes made visible to the TMA, then
// its store thread issues the store.
__device__ __forceinline__ void store_chunk(const CUtensorMap* map, unsigned char* staging, uint32_t buf,
                                            int warpgroup_bar, bool store_thread, int c0, int c1) {
  fence_async_shared();
  warpgroup_barrier(warpgroup_bar);
  if (store_thread) tma_store_2d(map, staging + (buf - smem_u32(staging)), c0, c1);
}

// pre and act = bias and GELU on A W^T, in "ping-pong": each consumer
// warpgroup owns whole 128 x 128 tiles (the CTA's tiles 0, 2, 4, ... go to
// warpgroup 1, and 1, 3, 5, ... to 2), so while one writes its tile's
// epilogue the other's products keep the tensor cores busy. One ring of
// stages in tile order: the producer fills tile i's stages after tile
// i - 1's, so the two warpgroups' main loops follow each other.
// Persistent: each CTA takes tiles blockIdx.x, + gridDim.x, ... (consecutive
// tiles run along N, so the CTAs at work share A's rows; W fits in L2).
template <typename Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_pingpong_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_w,
                              const __grid_constant__ CUtensorMap tma_out0, const __grid_constant__ CUtensorMap tma_out1,
                              const Epilogue epilogue, int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const SmemParts p = carve_smem(smem_raw);
  if (!start_pipeline(&tma_a, &tma_w, p, m, n, k)) return;
  // handoff[c]: the other warpgroup has passed the full barriers of its
  // latest tile. A warpgroup waits on it before its next tile's main loop:
  // its stages' full barriers are then at most one phase ahead of what it
  // waits for, as parity waits need (without it, warpgroup 2 would wait on
  // tile 1's phases while the barriers are still in tile 0's and pass).
  uint64_t* const handoff = p.extra;
  const int tiles_n = n / kBN, tiles = (m / kBM) * tiles_n;
  const int kblocks = k / kBK;
  const int c = threadIdx.x / 128 - 1;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x & 31;
  // Rows 0-63 and 64-127 of the tile. Not cleared: each tile's first product
  // takes scale_d = 0 (d = A B^T). Clearing them would put non-wgmma writes
  // of the accumulators in the pipeline, and ptxas then serialises the
  // products (its warning C7515).
  float d0[64], d1[64];
  int chunk = 0;
  const bool store_thread = threadIdx.x % 128 == 0;
  const uint32_t my_staging = smem_u32(p.staging) + c * kBuffers * kChunkBytes;
  // This warpgroup's tiles: the CTA's i-th tile for i = c, c + 2, ...
  int i = c;
  for (int tile = blockIdx.x + c * gridDim.x; tile < tiles; tile += 2 * gridDim.x, i += 2) {
    const int n0 = (tile % tiles_n) * kBN, m0 = (tile / tiles_n) * kBM;
    if (i > 0) mbar_wait(&handoff[c], ((i - 1) / 2) & 1);  // the CTA's tile i - 1 has passed its waits
    int it = i * kblocks;  // this tile's first stage in the ring's order
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&p.full[s], (it / kStages) & 1);
      const uint64_t da = smem_desc(p.sa + s * kBM * kBK);
      const uint64_t da_low = smem_desc(p.sa + s * kBM * kBK + 64 * kBK);
      const uint64_t dw = smem_desc(p.sw + s * kBN * kBK);
      fence_accumulators(d0);
      fence_accumulators(d1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wgmma_m64n128k16(d0, da + 2 * kk, dw + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
        wgmma_m64n128k16(d1, da_low + 2 * kk, dw + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
      }
      wgmma_commit();
      if (kb > 0) {  // the previous step's products are done: its stage may be refilled
        wgmma_wait<1>();
        fence_accumulators(d0);
        fence_accumulators(d1);
        if (lane == 0) mbar_arrive(&p.empty[(it - 1) % kStages]);
      }
    }
    if (store_thread) mbar_arrive(&handoff[1 - c]);  // this thread has passed every full barrier of tile i
    const int col = n0 + 2 * (lane & 3);
    typename Epilogue::Chunk next = epilogue.load(col, 0);  // while the last products run
    wgmma_wait<0>();
    fence_accumulators(d0);
    fence_accumulators(d1);
    if (lane == 0) mbar_arrive(&p.empty[(it - 1) % kStages]);  // the tile's last stage
    // Chunks: output o, row half hh (d0, d1), 64-column chunk jc (j = 8 jc + jj of the 16);
    // the buffers in turn, a chunk's bias loads out while the one before is written.
#pragma unroll
    for (int o = 0; o < Epilogue::kOutputs; ++o) {
#pragma unroll
      for (int jc = 0; jc < kBN / kChunkCols; ++jc) {
        const typename Epilogue::Chunk loaded = next;
        if (o + 1 < Epilogue::kOutputs || jc + 1 < kBN / kChunkCols)
          next = epilogue.load(col, (jc + 1) % (kBN / kChunkCols));
#pragma unroll
        for (int hh = 0; hh < 2; ++hh, ++chunk) {
          const float(&d)[64] = hh == 0 ? d0 : d1;
          const uint32_t buf = my_staging + (chunk & (kBuffers - 1)) * kChunkBytes;
          if (store_thread) tma_store_wait_read<kBuffers - 1>();  // this buffer's previous store has read it
          warpgroup_barrier(1 + c);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int q = 4 * (8 * jc + jj) + 2 * h;
              st_shared_u32(swizzled_pair(buf, warp, lane, jj, h), epilogue.value(loaded, o, jj, d[q], d[q + 1]));
            }
          }
          store_chunk(o == 0 ? &tma_out0 : &tma_out1, p.staging, buf, 1 + c, store_thread, n0 + kChunkCols * jc,
                      m0 + 64 * hh);
        }
      }
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
CUtensorMap tensor_map(const bf16* base, int64_t rows, int64_t cols, int box_rows) {
  return bf16_tensor_map(base, rows, cols, box_rows, "gemm_bias_gelu_sm90");
}

}  // namespace

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k) {
  // The tile index is an int: (m / 128) * (n / 128) must fit.
  return m > 0 && n > 0 && k > 0 && m % kBM == 0 && n % kNMultiple == 0 && k % kBK == 0 && m <= INT32_MAX &&
         n <= INT32_MAX && k <= INT32_MAX && (m / kBM) * (n / kBN) <= INT32_MAX;
}

// Checks the bias, the shape, the pointers and the GPU, then launches the
// kernel with one CTA per SM, each looping over tiles.
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
  const int device = sm90_device(what);
  const CUtensorMap map_a = tensor_map(a, m, k, kBM), map_w = tensor_map(w, n, k, kBN);
  const CUtensorMap map_pre = tensor_map(pre, m, n, 64), map_act = tensor_map(act, m, n, 64);
  const auto kernel = gemm_sm90_pingpong_kernel<BiasGeluEpilogue<TB>>;
  static std::atomic<uint64_t> attribute_set_on{0};  // one flag per bias type (one kernel each)
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(SmemLayout::kTotal), device, attribute_set_on);
  int sms = 0;
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (m / kBM) * (n / kBN);
  const unsigned grid = unsigned(std::min<int64_t>(tiles, std::max(sms, 1)));
  kernel<<<grid, kThreads, SmemLayout::kTotal, stream>>>(map_a, map_w, map_pre, map_act, BiasGeluEpilogue<TB>{bias},
                                                         int(m), int(n), int(k));
  PERFTRAIN_LAUNCH_CHECK();
}

template void gemm_bias_gelu_sm90<float>(const bf16*, const bf16*, const float*, bf16*, bf16*, int64_t, int64_t,
                                         int64_t, cudaStream_t);
template void gemm_bias_gelu_sm90<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, int64_t, int64_t,
                                        int64_t, cudaStream_t);

}  // namespace perftrain::kernels
