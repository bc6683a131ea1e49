#include "kernels/attention_tiled_bwd_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/attention_sm90.cuh"
#include "kernels/cuda_check.h"
#include "kernels/sm90.cuh"
#include "kernels/tensor_map.h"

namespace perftrain::kernels {
namespace {

using namespace attention_sm90;  // the shared pieces (kernels/attention_sm90.cuh), sm90 with them
using bf16 = __nv_bfloat16;

constexpr int kChunk = 64;                   // rows per warpgroup: keys in launch 2, queries in launch 3
constexpr int kBlock = 2 * kChunk;           // rows per CTA
constexpr int kThreads = 256;                // two warpgroups
constexpr uint32_t kBox = kChunk * 128;      // 64 rows of a panel's 64 columns: 8 KB
constexpr uint32_t kTailBox = kChunk * 16;   // its columns 64-71: 1 KB
constexpr uint32_t kPad = 128;               // 8 zero rows after a tail that a K-major tail step reads past
constexpr float kLog2e = 1.4426950408889634f;

constexpr uint32_t round_1024(uint32_t x) { return (x + 1023) / 1024 * 1024; }

// The tensor maps of one call, 3-D (columns, tokens, samples), boxes of 64
// rows; the tails' boxes of 8 columns at 72 and 96 (the main maps stand in
// at 64 and 128); the key bias's 2-D (keys, samples) in boxes of 64 keys,
// for launch 3 (q's map stands in without one).
struct BwdMaps {
  CUtensorMap q, k, v, d_o, dq, dk, dv;
  CUtensorMap q_t, k_t, v_t, d_o_t, dq_t, dk_t, dv_t;
  CUtensorMap bias;
};

struct BwdArgs {
  const void* bias;
  int64_t bias_stride;
  const float* lse;
  const float* delta;
  int tokens, heads;
  float scale;
};

// Launch 1: D = rowsum(dO * O) for each row (b, t, h) of [B, T, H, d],
// four threads a row (columns c = part mod 4), into delta [B, H, T].
constexpr int kDeltaThreads = 256;

__global__ void __launch_bounds__(kDeltaThreads)
    attention_delta_kernel(const bf16* __restrict__ out, const bf16* __restrict__ d_out, float* __restrict__ delta,
                           int64_t rows, int heads, int tokens, int dim) {
  const int64_t idx = int64_t(blockIdx.x) * kDeltaThreads + threadIdx.x, row = idx / 4;
  const int part = int(idx % 4);
  float acc = 0.f;
  if (row < rows)
    for (int c = part; c < dim; c += 4)
      acc = fmaf(__bfloat162float(out[row * dim + c]), __bfloat162float(d_out[row * dim + c]), acc);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (row < rows && part == 0) {
    const int64_t h = row % heads, bt = row / heads, t = bt % tokens, b = bt / tokens;
    delta[(b * heads + h) * tokens + t] = acc;
  }
}

// Writes 8 zero rows (128 bytes) at `pad` for the async proxy: warp w of
// the CTA takes pad w.
__device__ __forceinline__ void zero_pad(uint32_t pad, int lane) { st_shared_u32(pad + 4 * lane, 0u); }

// The tails of a thread's two accumulator rows (r_lo, r_lo + 8) of a 64-row
// tail box as a k16 A fragment, columns 72-79 zero.
__device__ __forceinline__ void tail_fragment(uint32_t (&a)[4], uint32_t box, int r_lo, int lane) {
  a[0] = ld_shared_u32(box + r_lo * 16 + 4 * (lane & 3));
  a[1] = ld_shared_u32(box + (r_lo + 8) * 16 + 4 * (lane & 3));
  a[2] = a[3] = 0;
}

// Launch 2's shared memory: K and V of the block (per panel two 64-row
// boxes each: panel p of chunk c at 2p + c), two stages of a query chunk
// (Q's panels, dO's, their tails, 8 zero rows that dO's tail step reads
// past, then its lse (log2 e times) and D), K's and V's tails (read into
// registers only), the barriers; 1024 to align the start.
template <int D>
struct KvSmem {
  static constexpr int kP = TiledHead<D>::kPanels;
  static constexpr bool kTail = TiledHead<D>::kTail;
  static constexpr uint32_t kK = 0, kV = 2 * kP * kBox, kStage = 4 * kP * kBox;
  static constexpr uint32_t kSQ = 0, kSDo = kP * kBox, kSQt = 2 * kP * kBox;
  static constexpr uint32_t kSDot = kSQt + (kTail ? kTailBox : 0);
  static constexpr uint32_t kSPad = kSDot + (kTail ? kTailBox : 0), kSLse = kSPad + (kTail ? kPad : 0);
  static constexpr uint32_t kSDelta = kSLse + kChunk * 4;
  static constexpr uint32_t kStageBytes = round_1024(kSDelta + kChunk * 4);
  static constexpr uint32_t kStageTx = 2 * kP * kBox + (kTail ? 2 * kTailBox : 0);  // TMA bytes of a chunk
  static constexpr uint32_t kKt = kStage + 2 * kStageBytes, kVt = kKt + (kTail ? 2 * kTailBox : 0);
  static constexpr uint32_t kBar = kVt + (kTail ? 2 * kTailBox : 0);
  static constexpr size_t kTotal = kBar + 5 * 8 + 1024;
  static_assert(kSDot + kTailBox == kSPad || !kTail, "dO's tail step reads the 8 zero rows after it");
  static_assert(kSQt + kTailBox == kSDot || !kTail, "Q's tail step reads dO's tail after it");
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// Launch 2: dK, dV of 128 keys of one head. The loop and its prologue and
// epilogue share the barrier phases and the gradients' registers: one body.
template <int D, KeyBias B>
__global__ void __launch_bounds__(kThreads, 1)
    attention_tiled_dkdv_kernel(const __grid_constant__ BwdMaps maps, const BwdArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = KvSmem<D>;
  constexpr bool kTail = L::kTail;
  constexpr int kP = L::kP;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  uint64_t* kv_ready = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* chunk_ready = kv_ready + 1;  // one per stage: its Q, dO, lse and D are there
  uint64_t* chunk_free = kv_ready + 3;   // one per stage: every warp computing is done with it
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (keys within the warpgroup's 64)
  const int T = args.tokens, h = blockIdx.y, b = blockIdx.z;
  const int k_block = blockIdx.x * kBlock, k0 = k_block + wg * kChunk;
  const bool active = k0 < T;
  const int blocks = k_block + kChunk < T ? 2 : 1, chunks = (T + kChunk - 1) / kChunk;
  const float* lse = args.lse + (int64_t(b) * args.heads + h) * T;
  const float* delta = args.delta + (int64_t(b) * args.heads + h) * T;

  if (tid == 0) {
    mbar_init(&chunk_ready[0], kChunk);  // the threads writing lse and D, thread 0's with the TMA bytes
    mbar_init(&chunk_ready[1], kChunk);
    mbar_init(&chunk_free[0], 4 * blocks);  // lane 0 of each warp of the warpgroups with keys
    mbar_init(&chunk_free[1], 4 * blocks);
    init_barriers<1>(kv_ready);  // K and V's, and the fence for all five
  }
  if constexpr (kTail)
    if (warp == 0) zero_pad(base + L::kStage + wg * L::kStageBytes + L::kSPad, lane);
  fence_async_shared();
  // A chunk's lse (times log2 e; +inf past T: weight 0) and D written by
  // the first 64 threads, each arriving on the stage's barrier after its
  // write; thread 0's arrival brings the TMA bytes of Q and dO.
  auto load_chunk = [&](int qc, int stage) {
    if (tid >= kChunk) return;
    unsigned char* at = smem + L::kStage + stage * L::kStageBytes;
    uint64_t* bar = &chunk_ready[stage];
    const int q = qc * kChunk + tid;
    reinterpret_cast<float*>(at + L::kSLse)[tid] = q < T ? lse[q] * kLog2e : INFINITY;
    reinterpret_cast<float*>(at + L::kSDelta)[tid] = q < T ? delta[q] : 0.f;
    if (tid != 0) {
      mbar_arrive(bar);
      return;
    }
    mbar_arrive_expect_tx(bar, L::kStageTx);
    tma_load_head<D>(at + L::kSQ, kBox, at + L::kSQt, &maps.q, &maps.q_t, bar, h * D, qc * kChunk, b);
    tma_load_head<D>(at + L::kSDo, kBox, at + L::kSDot, &maps.d_o, &maps.d_o_t, bar, h * D, qc * kChunk, b);
  };
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(kv_ready, blocks * (2 * kP * kBox + (kTail ? 2 * kTailBox : 0)));
    for (int c = 0; c < blocks; ++c) {
      const int row = k_block + c * kChunk;
      tma_load_head<D>(smem + L::kK + c * kBox, 2 * kBox, smem + L::kKt + c * kTailBox, &maps.k, &maps.k_t, kv_ready,
                       h * D, row, b);
      tma_load_head<D>(smem + L::kV + c * kBox, 2 * kBox, smem + L::kVt + c * kTailBox, &maps.v, &maps.v_t, kv_ready,
                       h * D, row, b);
    }
  }
  load_chunk(0, 0);

  const float scale_log2 = args.scale * kLog2e;
  // The key bias of this thread's two rows (log2 e times; 0 past T: those rows are not stored).
  float bias_l2[2] = {0.f, 0.f};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = k0 + r_lo + 8 * hh;
    if constexpr (B == KeyBias::kF32)
      if (key < T) bias_l2[hh] = static_cast<const float*>(args.bias)[b * args.bias_stride + key] * kLog2e;
    if constexpr (B == KeyBias::kBf16)
      if (key < T)
        bias_l2[hh] = __bfloat162float(static_cast<const bf16*>(args.bias)[b * args.bias_stride + key]) * kLog2e;
  }
  uint32_t k_t[4] = {0, 0, 0, 0}, v_t[4] = {0, 0, 0, 0};  // this warpgroup's K and V tails as A fragments
  if (active) {
    mbar_wait(kv_ready, 0);
    if constexpr (kTail) {
      tail_fragment(k_t, base + L::kKt + wg * kTailBox, r_lo, lane);
      tail_fragment(v_t, base + L::kVt + wg * kTailBox, r_lo, lane);
    }
  }
  float dv[kP][32], dk[kP][32], dv_t[4] = {0.f, 0.f, 0.f, 0.f}, dk_t[4] = {0.f, 0.f, 0.f, 0.f};
  const uint64_t da_k = smem_desc(smem + L::kK + wg * kBox), da_v = smem_desc(smem + L::kV + wg * kBox);
  // The second panel's (96, 128): 2 kBox on; a descriptor counts 16-byte units.
  constexpr uint64_t kNextPanel = 2 * kBox / 16;
#pragma unroll 1
  for (int qc = 0; qc < chunks; ++qc) {
    const int stage = qc & 1;
    // The next chunk into the other stage once both warpgroups are done with
    // the chunk before this one there (they may drift a chunk apart).
    if (qc + 1 < chunks) {
      if (tid < kChunk && qc >= 1) mbar_wait(&chunk_free[stage ^ 1], ((qc - 1) >> 1) & 1);
      load_chunk(qc + 1, stage ^ 1);
    }
    if (active) {
      unsigned char* st_at = smem + L::kStage + stage * L::kStageBytes;
      const uint32_t st_u32 = smem_u32(st_at);
      const float* s_lse = reinterpret_cast<const float*>(st_at + L::kSLse);
      const float* s_delta = reinterpret_cast<const float*>(st_at + L::kSDelta);
      mbar_wait(&chunk_ready[stage], (qc >> 1) & 1);
      // S^T = K Q^T and dP^T = V dO^T: [64 keys][64 queries of the chunk].
      float st[32], dpt[32];
      const uint64_t db_q = smem_desc(st_at + L::kSQ), db_do = smem_desc(st_at + L::kSDo);
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(st, da_k + 2 * t, db_q + 2 * t, t > 0);
#pragma unroll
      for (int t = 0; t < TiledHead<D>::kSteps1; ++t)
        wgmma_m64n64k16_ss<0>(st, da_k + kNextPanel + 2 * t, db_q + kBox / 16 + 2 * t, 1);
      if constexpr (kTail) wgmma_m64n64k16_rs(st, k_t, smem_desc_tail(st_u32 + L::kSQt), 1);
#pragma unroll
      for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(dpt, da_v + 2 * t, db_do + 2 * t, t > 0);
#pragma unroll
      for (int t = 0; t < TiledHead<D>::kSteps1; ++t)
        wgmma_m64n64k16_ss<0>(dpt, da_v + kNextPanel + 2 * t, db_do + kBox / 16 + 2 * t, 1);
      if constexpr (kTail) wgmma_m64n64k16_rs(dpt, v_t, smem_desc_tail(st_u32 + L::kSDot), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(st);
      fence_accumulators(dpt);
      // P^T = 2^(s log2e S^T + b_k log2e - lse_q log2e), dS^T = P^T (dP^T - D_q); query column 8j + 2 (lane % 4) + e.
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = 8 * j + 2 * (lane & 3) + e;
          const float l2 = s_lse[q], dl = s_delta[q];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int i = 4 * j + 2 * hh + e;
            const float p = exp2_approx(fmaf(st[i], scale_log2, bias_l2[hh] - l2));
            st[i] = p;
            dpt[i] = p * (dpt[i] - dl);
          }
        }
      // dV += P^T dO and dK += dS^T Q over the chunk's 64 queries (B: their rows, MN-major).
      uint32_t ap[4][4], ads[4][4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        a_fragment(st, t, ap[t]);
        a_fragment(dpt, t, ads[t]);
      }
      wgmma_rows_mn<4, kTail>(dv[0], dv_t, ap, st_u32 + L::kSDo, st_u32 + L::kSDot, qc > 0);
      if constexpr (kP > 1) wgmma_rows_mn<4, false>(dv[kP - 1], dv_t, ap, st_u32 + L::kSDo + kBox, 0, qc > 0);
      wgmma_rows_mn<4, kTail>(dk[0], dk_t, ads, st_u32 + L::kSQ, st_u32 + L::kSQt, qc > 0);
      if constexpr (kP > 1) wgmma_rows_mn<4, false>(dk[kP - 1], dk_t, ads, st_u32 + L::kSQ + kBox, 0, qc > 0);
      wgmma_wait<0>();
#pragma unroll
      for (int p = 0; p < kP; ++p) {
        fence_accumulators(dv[p]);
        fence_accumulators(dk[p]);
      }
      if constexpr (kTail) {
        fence_accumulators(dv_t);
        fence_accumulators(dk_t);
      }
      if (lane == 0) mbar_arrive(&chunk_free[stage]);  // this warp's products and reads are done with the stage
    }
  }
  if (!active) return;
  // dK (scaled) and dV staged where this warpgroup's K and V were, then
  // stored by TMA; rows past T are not written.
  warpgroup_barrier(2 + wg);
  stage_head<D>(base + L::kK + wg * kBox, 2 * kBox, base + L::kKt + wg * kTailBox, dk, dk_t, r_lo, lane, args.scale);
  stage_head<D>(base + L::kV + wg * kBox, 2 * kBox, base + L::kVt + wg * kTailBox, dv, dv_t, r_lo, lane, 1.f);
  fence_async_shared();
  warpgroup_barrier(2 + wg);
  if (wg_lead) {
    tma_store_head<D>(&maps.dk, &maps.dk_t, smem + L::kK + wg * kBox, 2 * kBox, smem + L::kKt + wg * kTailBox, h * D,
                      k0, b);
    tma_store_head<D>(&maps.dv, &maps.dv_t, smem + L::kV + wg * kBox, 2 * kBox, smem + L::kVt + wg * kTailBox, h * D,
                      k0, b);
    tma_store_wait_read<0>();  // the boxes are read before the CTA's shared memory goes
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

// Launch 3's shared memory: Q and dO of the block (per panel two 64-row
// boxes each, as launch 2's K and V) and their tails (read into registers
// only), then two stages of a 64-key tile (K's panels, V's, K's tail, V's
// tail, 8 zero rows: the tail step of S reads 8 rows past K's tail, which
// are V's, and dP's past V's, the zeros), each stage's key bias (room for
// 64 fp32 keys), the barriers; 1024 to align the start.
template <int D>
struct QSmem {
  static constexpr int kP = TiledHead<D>::kPanels;
  static constexpr bool kTail = TiledHead<D>::kTail;
  static constexpr uint32_t kQ = 0, kDo = 2 * kP * kBox, kQt = 4 * kP * kBox;
  static constexpr uint32_t kDot = kQt + (kTail ? 2 * kTailBox : 0);
  static constexpr uint32_t kStage = round_1024(kDot + (kTail ? 2 * kTailBox : 0));
  static constexpr uint32_t kSK = 0, kSV = kP * kBox, kSKt = 2 * kP * kBox, kSVt = kSKt + (kTail ? kTailBox : 0);
  static constexpr uint32_t kSPad = kSVt + (kTail ? kTailBox : 0);
  static constexpr uint32_t kStageBytes = round_1024(kSPad + (kTail ? kPad : 0));
  static constexpr uint32_t kStageTx = 2 * kP * kBox + (kTail ? 2 * kTailBox : 0);
  static constexpr uint32_t kBiasSlot = kChunk * 4, kBias = kStage + 2 * kStageBytes;
  static constexpr uint32_t kBar = kBias + 2 * kBiasSlot;
  static constexpr size_t kTotal = kBar + 5 * 8 + 1024;
  static_assert(kSKt + kTailBox == kSVt || !kTail, "K's tail step reads V's tail after it");
  static_assert(kSVt + kTailBox == kSPad || !kTail, "V's tail step reads the 8 zero rows after it");
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// Launch 3: dQ of 128 queries of one head. One body, as launch 2.
template <int D, KeyBias B>
__global__ void __launch_bounds__(kThreads, 1)
    attention_tiled_dq_kernel(const __grid_constant__ BwdMaps maps, const BwdArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = QSmem<D>;
  constexpr bool kTail = L::kTail;
  constexpr int kP = L::kP;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  uint64_t* q_ready = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* kv_ready = q_ready + 1;  // one per stage: its K, V have landed
  uint64_t* kv_free = q_ready + 3;   // one per stage: every warp computing is done with it
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (queries within the warpgroup's 64)
  const int T = args.tokens, h = blockIdx.y, b = blockIdx.z;
  const int q_block = blockIdx.x * kBlock, q0 = q_block + wg * kChunk;
  const bool active = q0 < T;
  const int blocks = q_block + kChunk < T ? 2 : 1, tiles = (T + kChunk - 1) / kChunk;

  if (tid == 0) {
    mbar_init(&kv_free[0], 4 * blocks);  // lane 0 of each warp of the warpgroups with queries
    mbar_init(&kv_free[1], 4 * blocks);
    init_barriers<3>(q_ready);  // Q and dO's and each stage's landing, and the fence for all five
  }
  if constexpr (kTail)
    if (warp == 0) zero_pad(base + L::kStage + wg * L::kStageBytes + L::kSPad, lane);
  fence_async_shared();
  __syncthreads();
  auto load_tile = [&](int tile, int stage) {
    unsigned char* at = smem + L::kStage + stage * L::kStageBytes;
    uint64_t* bar = &kv_ready[stage];
    mbar_arrive_expect_tx(bar, L::kStageTx + kChunk * kStagedBiasKeyBytes<B>);
    tma_load_head<D>(at + L::kSK, kBox, at + L::kSKt, &maps.k, &maps.k_t, bar, h * D, tile * kChunk, b);
    tma_load_head<D>(at + L::kSV, kBox, at + L::kSVt, &maps.v, &maps.v_t, bar, h * D, tile * kChunk, b);
    if constexpr (B != KeyBias::kNone)
      tma_load_2d(smem + L::kBias + stage * L::kBiasSlot, &maps.bias, bar, tile * kChunk, b);
  };
  if (tid == 0) {
    mbar_arrive_expect_tx(q_ready, blocks * (2 * kP * kBox + (kTail ? 2 * kTailBox : 0)));
    for (int c = 0; c < blocks; ++c) {
      const int row = q_block + c * kChunk;
      tma_load_head<D>(smem + L::kQ + c * kBox, 2 * kBox, smem + L::kQt + c * kTailBox, &maps.q, &maps.q_t, q_ready,
                       h * D, row, b);
      tma_load_head<D>(smem + L::kDo + c * kBox, 2 * kBox, smem + L::kDot + c * kTailBox, &maps.d_o, &maps.d_o_t,
                       q_ready, h * D, row, b);
    }
    load_tile(0, 0);
  }

  const float scale_log2 = args.scale * kLog2e;
  // This thread's two queries: lse (log2 e times; +inf past T: weight 0) and D.
  float lse_l2[2], dl[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int q = q0 + r_lo + 8 * hh;
    const int64_t at = (int64_t(b) * args.heads + h) * T + q;
    lse_l2[hh] = q < T ? args.lse[at] * kLog2e : INFINITY;
    dl[hh] = q < T ? args.delta[at] : 0.f;
  }
  uint32_t q_t[4] = {0, 0, 0, 0}, do_t[4] = {0, 0, 0, 0};  // this warpgroup's Q and dO tails as A fragments
  if (active) {
    mbar_wait(q_ready, 0);
    if constexpr (kTail) {
      tail_fragment(q_t, base + L::kQt + wg * kTailBox, r_lo, lane);
      tail_fragment(do_t, base + L::kDot + wg * kTailBox, r_lo, lane);
    }
  }
  float dq[kP][32], dq_t[4] = {0.f, 0.f, 0.f, 0.f};
  const uint64_t da_q = smem_desc(smem + L::kQ + wg * kBox), da_do = smem_desc(smem + L::kDo + wg * kBox);
  constexpr uint64_t kNextPanel = 2 * kBox / 16;  // the second panel's, in a descriptor's 16-byte units
#pragma unroll 1
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    // The next tile into the other stage once both warpgroups are done with
    // the tile before this one there (they may drift a tile apart).
    if (tid == 0 && tile + 1 < tiles) {
      if (tile >= 1) mbar_wait(&kv_free[stage ^ 1], ((tile - 1) >> 1) & 1);
      load_tile(tile + 1, stage ^ 1);
    }
    if (active) {
      unsigned char* st_at = smem + L::kStage + stage * L::kStageBytes;
      const uint32_t st_u32 = smem_u32(st_at);
      mbar_wait(&kv_ready[stage], (tile >> 1) & 1);
      // S = Q K^T and dP = dO V^T: [64 queries][64 keys of the tile].
      float s[32], dp[32];
      const uint64_t db_k = smem_desc(st_at + L::kSK), db_v = smem_desc(st_at + L::kSV);
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(s, da_q + 2 * t, db_k + 2 * t, t > 0);
#pragma unroll
      for (int t = 0; t < TiledHead<D>::kSteps1; ++t)
        wgmma_m64n64k16_ss<0>(s, da_q + kNextPanel + 2 * t, db_k + kBox / 16 + 2 * t, 1);
      if constexpr (kTail) wgmma_m64n64k16_rs(s, q_t, smem_desc_tail(st_u32 + L::kSKt), 1);
#pragma unroll
      for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(dp, da_do + 2 * t, db_v + 2 * t, t > 0);
#pragma unroll
      for (int t = 0; t < TiledHead<D>::kSteps1; ++t)
        wgmma_m64n64k16_ss<0>(dp, da_do + kNextPanel + 2 * t, db_v + kBox / 16 + 2 * t, 1);
      if constexpr (kTail) wgmma_m64n64k16_rs(dp, do_t, smem_desc_tail(st_u32 + L::kSVt), 1);
      wgmma_commit();
      float add[16];  // the staged bias read while the products run
      staged_key_terms<B, 8>(add, smem_u32(smem + L::kBias + stage * L::kBiasSlot), lane, T - tile * kChunk);
      wgmma_wait<0>();
      fence_accumulators(s);
      fence_accumulators(dp);
      // dS = P (dP - D), P = 2^(s log2e S + b log2e - lse log2e) (-inf past the last key).
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * j + e, hh = e / 2;
          const float p = exp2_approx(fmaf(s[i], scale_log2, add[2 * j + (e & 1)] - lse_l2[hh]));
          s[i] = p * (dp[i] - dl[hh]);
        }
      // dQ += dS K over the tile's 64 keys (B: K's rows, MN-major).
      uint32_t ads[4][4];
#pragma unroll
      for (int t = 0; t < 4; ++t) a_fragment(s, t, ads[t]);
      wgmma_rows_mn<4, kTail>(dq[0], dq_t, ads, st_u32 + L::kSK, st_u32 + L::kSKt, tile > 0);
      if constexpr (kP > 1) wgmma_rows_mn<4, false>(dq[kP - 1], dq_t, ads, st_u32 + L::kSK + kBox, 0, tile > 0);
      wgmma_wait<0>();
#pragma unroll
      for (int p = 0; p < kP; ++p) fence_accumulators(dq[p]);
      if constexpr (kTail) fence_accumulators(dq_t);
      if (lane == 0) mbar_arrive(&kv_free[stage]);  // this warp's products have read the stage
    }
  }
  if (!active) return;
  // dQ (scaled) staged where this warpgroup's Q was, then stored by TMA.
  warpgroup_barrier(2 + wg);
  stage_head<D>(base + L::kQ + wg * kBox, 2 * kBox, base + L::kQt + wg * kTailBox, dq, dq_t, r_lo, lane, args.scale);
  fence_async_shared();
  warpgroup_barrier(2 + wg);
  if (wg_lead) {
    tma_store_head<D>(&maps.dq, &maps.dq_t, smem + L::kQ + wg * kBox, 2 * kBox, smem + L::kQt + wg * kTailBox, h * D,
                      q0, b);
    tma_store_wait_read<0>();
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

// A 3-D map of 64-row boxes and its tail map (the main map again at 64 and 128).
void operand_maps(CUtensorMap& main, CUtensorMap& tail, const void* data, int64_t row_stride, int batch, int tokens,
                  int64_t cols, int head_dim) {
  constexpr const char* kWho = "attention_tiled_bwd_sm90";
  main = bf16_tensor_map_3d(data, batch, tokens, cols, row_stride, kChunk, kWho);
  tail = head_dim % 64 != 0 ? bf16_tensor_map_3d(data, batch, tokens, cols, row_stride, kChunk, kWho, 8) : main;
}

template <int D, KeyBias B>
void launch(const BwdMaps& maps, const BwdArgs& args, int batch, int device, cudaStream_t stream) {
  static std::atomic<uint64_t> kv_set_on{0}, q_set_on{0};
  const auto kv_kernel = attention_tiled_dkdv_kernel<D, B>;
  const auto q_kernel = attention_tiled_dq_kernel<D, B>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kv_kernel), int(KvSmem<D>::kTotal), device, kv_set_on);
  allow_dynamic_smem(reinterpret_cast<const void*>(q_kernel), int(QSmem<D>::kTotal), device, q_set_on);
  const dim3 grid((args.tokens + kBlock - 1) / kBlock, args.heads, batch);
  kv_kernel<<<grid, kThreads, KvSmem<D>::kTotal, stream>>>(maps, args);
  PERFTRAIN_LAUNCH_CHECK();
  q_kernel<<<grid, kThreads, QSmem<D>::kTotal, stream>>>(maps, args);
  PERFTRAIN_LAUNCH_CHECK();
}

template <int D>
void launch_for_bias(const BwdMaps& maps, const BwdArgs& args, const AttentionKeyBias& bias, int batch, int device,
                     cudaStream_t stream) {
  if (bias.data == nullptr)
    launch<D, KeyBias::kNone>(maps, args, batch, device, stream);
  else if (bias.fp32)
    launch<D, KeyBias::kF32>(maps, args, batch, device, stream);
  else
    launch<D, KeyBias::kBf16>(maps, args, batch, device, stream);
}

}  // namespace

void attention_tiled_bwd_sm90(AttentionOperand q, AttentionOperand k, AttentionOperand v,
                              const AttentionKeyBias& bias, const bf16* out, const bf16* d_out, const float* lse,
                              float* delta, AttentionGradOperand dq, AttentionGradOperand dk, AttentionGradOperand dv,
                              int batch, int tokens, int heads, int head_dim, float scale, cudaStream_t stream) {
  constexpr const char* kWho = "attention_tiled_bwd_sm90";
  if (batch < 1 || heads < 1 || batch > 65535 || heads > 65535)
    throw std::invalid_argument(std::string(kWho) + ": needs 1 <= batch, heads <= 65535");
  if (tokens < kTiledAttentionMinTokens)
    throw std::invalid_argument(std::string(kWho) + ": needs at least 64 tokens, not " + std::to_string(tokens));
  if (!tiled_attention_dim_supported(head_dim))
    throw std::invalid_argument(std::string(kWho) + ": head dim must be 64, 72, 96 or 128, not " +
                                std::to_string(head_dim));
  if (bias.data != nullptr && bias.sample_stride < tokens)
    throw std::invalid_argument(std::string(kWho) + ": the key bias's sample stride is below the token count");
  check_tma_pointers(kWho, {q.data, k.data, v.data, out, d_out, lse, delta, dq.data, dk.data, dv.data});
  if (bias.data != nullptr) check_tma_pointers(kWho, {bias.data});
  const int device = sm90_device(kWho);
  const int64_t cols = int64_t(heads) * head_dim;
  BwdMaps maps;
  operand_maps(maps.q, maps.q_t, q.data, q.row_stride, batch, tokens, cols, head_dim);
  operand_maps(maps.k, maps.k_t, k.data, k.row_stride, batch, tokens, cols, head_dim);
  operand_maps(maps.v, maps.v_t, v.data, v.row_stride, batch, tokens, cols, head_dim);
  operand_maps(maps.d_o, maps.d_o_t, d_out, cols, batch, tokens, cols, head_dim);
  operand_maps(maps.dq, maps.dq_t, dq.data, dq.row_stride, batch, tokens, cols, head_dim);
  operand_maps(maps.dk, maps.dk_t, dk.data, dk.row_stride, batch, tokens, cols, head_dim);
  operand_maps(maps.dv, maps.dv_t, dv.data, dv.row_stride, batch, tokens, cols, head_dim);
  maps.bias = bias.data != nullptr ? row_tensor_map(bias.data, batch, tokens, bias.sample_stride, bias.fp32 ? 4 : 2,
                                                    kChunk, kWho)
                                   : maps.q;
  const int64_t rows = int64_t(batch) * tokens * heads;
  const int64_t delta_blocks = (rows * 4 + kDeltaThreads - 1) / kDeltaThreads;
  attention_delta_kernel<<<unsigned(delta_blocks), kDeltaThreads, 0, stream>>>(out, d_out, delta, rows, heads, tokens,
                                                                               head_dim);
  PERFTRAIN_LAUNCH_CHECK();
  const BwdArgs args{bias.data, bias.sample_stride, lse, delta, tokens, heads, scale};
  switch (head_dim) {
    case 64: launch_for_bias<64>(maps, args, bias, batch, device, stream); break;
    case 72: launch_for_bias<72>(maps, args, bias, batch, device, stream); break;
    case 96: launch_for_bias<96>(maps, args, bias, batch, device, stream); break;
    default: launch_for_bias<128>(maps, args, bias, batch, device, stream); break;
  }
}

}  // namespace perftrain::kernels
