#include "kernels/attention_head_bwd_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/attention_sm90.cuh"
#include "kernels/sm90.cuh"
#include "kernels/tensor_map.h"

namespace perftrain::kernels {
namespace {

using namespace attention_sm90;  // the shared pieces (kernels/attention_sm90.cuh), sm90 with them
using bf16 = __nv_bfloat16;

constexpr int kT = kHeadBwdTokens;
static_assert(kT == kHeadTokens, "the shared layout is for 256 tokens");
constexpr int kChunk = 64;                     // queries per chunk
constexpr int kChunks = kT / kChunk;
constexpr int kKeyBlock = 64;                  // keys per wgmma M
constexpr int kThreads = 256;                  // two warpgroups
constexpr uint32_t kMatBytes = kT * 64 * 2;    // one operand's first 64 columns, 128-byte rows: 32 KB
constexpr uint32_t kDsBytes = kChunk * kT * 2; // dS of a chunk, [64 queries][256 keys] as 4 panels of 64 keys

// Shared memory: Q, K, V, dO (TMA; first 64 columns, then the tails), two dS
// buffers (a chunk's dQ is staged for its TMA store in its first panels
// once dQ's product has read them), slots for O's chunks (for D), lse per
// query, D per query for each warpgroup, mbarriers per chunk (Q, dO, and
// with chunk 0 K, V, lse) and per O chunk, a counter of the warpgroups done
// with a chunk's D; 1024 bytes to align the start.
template <int D>
struct Smem {
  using H = Head<D>;
  static constexpr uint32_t kQ = 0, kK = kMatBytes, kV = 2 * kMatBytes, kDO = 3 * kMatBytes;
  // The tails, per 64-row block c: Q's, dO's and K's side by side, then all
  // of V's. The k16 tail step of S (dP) reads 8 rows past a block of Q
  // (dO): they must hold finite numbers (the products multiply them by zero)
  // and are dO's (K's) rows of the same block, loaded with it or before.
  static constexpr uint32_t kTails = 4 * kMatBytes;
  __host__ __device__ static constexpr uint32_t q_tail(int c) { return kTails + c * 3 * H::kTailBox; }
  __host__ __device__ static constexpr uint32_t do_tail(int c) { return q_tail(c) + H::kTailBox; }
  __host__ __device__ static constexpr uint32_t k_tail(int c) { return q_tail(c) + 2 * H::kTailBox; }
  static constexpr uint32_t kVt = kTails + 3 * kChunks * H::kTailBox;  // [256][8]
  static constexpr uint32_t kDS = kTails + 4 * H::kTailMat;    // 2 x kDsBytes
  static constexpr uint32_t kO = kDS + 2 * kDsBytes;           // kOSlots x kOSlot
  static constexpr uint32_t kLse = kO + H::kOSlots * H::kOSlot;  // float[256]
  static constexpr uint32_t kDelta = kLse + kT * 4;            // float[2][256]
  static constexpr uint32_t kBar = kDelta + 2 * kT * 4;        // uint64_t[kChunks] chunks, then [kChunks] O
  static constexpr uint32_t kDoneD = kBar + 16 * kChunks;      // uint32_t
  static constexpr size_t kTotal = kDoneD + 16 + 1024;
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
  static_assert(kDS % 1024 == 0 && kO % 1024 == 0, "swizzled panels need 1024-byte alignment");
};

// Dot product of 8 bf16 pairs at two shared-memory addresses (16 bytes each).
__device__ __forceinline__ float dot8_shared(uint32_t x, uint32_t y) {
  const uint4 xv = ld_shared_v4_u32(x), yv = ld_shared_v4_u32(y);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
  const __nv_bfloat162* yp = reinterpret_cast<const __nv_bfloat162*>(&yv);
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 xf = __bfloat1622float2(xp[k]), yf = __bfloat1622float2(yp[k]);
    acc = fmaf(xf.x, yf.x, acc);
    acc = fmaf(xf.y, yf.y, acc);
  }
  return acc;
}

// The tensor maps of one call: boxes of 64 x 64 (128-byte swizzle) and, at
// head dim 72, boxes of 64 rows x 8 columns for the tails (the same maps
// stand in for them at 64).
struct Maps {
  CUtensorMap qkv, o, d_o, dqkv, qkv_t, o_t, d_o_t, dqkv_t;
};

// One body: the chunk loop, its prologue and the dK/dV epilogue share the
// barrier phases and the gradients' registers (split, they would be passed
// through memory).
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_head_bwd_kernel(const __grid_constant__ Maps maps, const float* __restrict__ lse, int heads, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using H = Head<D>;
  using L = Smem<D>;
  constexpr bool kTail = H::kTail;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const float* s_lse = reinterpret_cast<const float*>(smem + L::kLse);
  uint64_t* chunk_ready = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* o_ready = chunk_ready + kChunks;
  unsigned int* d_done = reinterpret_cast<unsigned int*>(smem + L::kDoneD);
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int row0 = b * kT;  // the sample's first token
  const int col_q = h * D, col_k = (heads + h) * D, col_v = (2 * heads + h) * D, col_o = h * D;
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  float* s_delta = reinterpret_cast<float*>(smem + L::kDelta) + wg * kT;  // this warpgroup's D

  if (tid == 0) {
#pragma unroll
    for (int c = 0; c < 2 * kChunks; ++c) mbar_init(&chunk_ready[c], 1);
    *d_done = 0;
    fence_mbarrier_init();
  }
  __syncthreads();
  // 64 rows from (col, row): the first 64 columns and, at D = 72, the tail.
  auto load_rows = [&](uint32_t main_at, uint32_t tail_at, const CUtensorMap* map, const CUtensorMap* map_t,
                       uint64_t* bar, int col, int row) {
    tma_load_2d(smem + main_at, map, bar, col, row);
    if constexpr (kTail) tma_load_2d(smem + tail_at, map_t, bar, col + 64, row);
  };
  // O's chunk c goes to slot c % kOSlots: the first kOSlots now, each later
  // one once both warpgroups have their D of the chunk before it in the slot.
  auto load_o = [&](int c) {
    const uint32_t slot = L::kO + (c % H::kOSlots) * H::kOSlot;
    mbar_arrive_expect_tx(&o_ready[c], H::kOSlot);
    load_rows(slot, slot + kBoxBytes, &maps.o, &maps.o_t, &o_ready[c], col_o, row0 + c * kChunk);
  };
  if (tid == 0) {  // chunk 0 brings K, V and lse with its Q and dO: the first products wait for ~half the bytes
    constexpr uint32_t kPair = kBoxBytes + (kTail ? H::kTailBox : 0);  // 64 rows with their tail
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      mbar_arrive_expect_tx(&chunk_ready[c], (c == 0 ? 8 * kPair + kT * 4 : 0) + 2 * kPair);
      load_rows(L::kQ + c * kBoxBytes, L::q_tail(c), &maps.qkv, &maps.qkv_t, &chunk_ready[c], col_q,
                row0 + c * kChunk);
      load_rows(L::kDO + c * kBoxBytes, L::do_tail(c), &maps.d_o, &maps.d_o_t, &chunk_ready[c], col_o,
                row0 + c * kChunk);
      if (c == 0) {
        for (int r = 0; r < kT; r += 64) {
          load_rows(L::kK + r * 128, L::k_tail(r / 64), &maps.qkv, &maps.qkv_t, &chunk_ready[0], col_k, row0 + r);
          load_rows(L::kV + r * 128, L::kVt + r * 16, &maps.qkv, &maps.qkv_t, &chunk_ready[0], col_v, row0 + r);
        }
        bulk_load(smem + L::kLse, lse + (int64_t(b) * heads + h) * kT, kT * 4, &chunk_ready[0]);
        for (int c2 = 0; c2 < H::kOSlots; ++c2) load_o(c2);
      }
    }
  }

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = scale * kLog2e;
  // This warpgroup's key blocks 2 wg, 2 wg + 1, and their gradients (columns
  // 0-63; 64-71 in the tails at D = 72).
  float dv[2][32], dk[2][32], dv_t[2][4], dk_t[2][4];
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (keys within the block)

  for (int qc = 0; qc < kChunks; ++qc) {
    const uint32_t ds_buf = base + L::kDS + (qc & 1) * kDsBytes;
    mbar_wait(&chunk_ready[qc], 0);
#pragma unroll
    for (int kbi = 0; kbi < 2; ++kbi) {
      const int kb = 2 * wg + kbi;
      float st[32], dpt[32];  // S^T and dP^T: [64 keys][64 queries of the chunk]
      {
        const uint64_t da_k = smem_desc(smem + L::kK + kb * kKeyBlock * 128);
        const uint64_t da_v = smem_desc(smem + L::kV + kb * kKeyBlock * 128);
        const uint64_t db_q = smem_desc(smem + L::kQ + qc * kChunk * 128);
        const uint64_t db_do = smem_desc(smem + L::kDO + qc * kChunk * 128);
        // The tails of this block's K and V rows as k16 A fragments: columns
        // 64-71 from shared memory, 72-79 zero.
        uint32_t k_t[4] = {0, 0, 0, 0}, v_t[4] = {0, 0, 0, 0};
        if constexpr (kTail) {
          const uint32_t at = r_lo * 16 + 4 * (lane & 3);
          k_t[0] = ld_shared_u32(base + L::k_tail(kb) + at);
          k_t[1] = ld_shared_u32(base + L::k_tail(kb) + at + 8 * 16);
          v_t[0] = ld_shared_u32(base + L::kVt + kb * H::kTailBox + at);
          v_t[1] = ld_shared_u32(base + L::kVt + kb * H::kTailBox + at + 8 * 16);
        }
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(st, da_k + 2 * t, db_q + 2 * t, t > 0);
        if constexpr (kTail) wgmma_m64n64k16_rs(st, k_t, smem_desc_tail(base + L::q_tail(qc)), 1);
#pragma unroll
        for (int t = 0; t < 4; ++t) wgmma_m64n64k16_ss<0>(dpt, da_v + 2 * t, db_do + 2 * t, t > 0);
        if constexpr (kTail) wgmma_m64n64k16_rs(dpt, v_t, smem_desc_tail(base + L::do_tail(qc)), 1);
        wgmma_commit();
        if (kbi == 0) {
          // While the first products run: D = rowsum(dO * O) of the chunk's
          // 64 queries, two threads per query, into this warpgroup's copy.
          const int i = tid % 128, q = i / 2, half = i & 1;
          mbar_wait(&o_ready[qc], 0);
          const uint32_t slot = base + L::kO + (qc % H::kOSlots) * H::kOSlot;
          const uint32_t o_row = slot + q * 128, do_row = base + L::kDO + (qc * kChunk + q) * 128;
          float acc = 0.f;
#pragma unroll
          for (int u = 4 * half; u < 4 * half + 4; ++u) {
            const uint32_t at = (u ^ (q & 7)) << 4;
            acc += dot8_shared(o_row + at, do_row + at);
          }
          if constexpr (kTail)
            if (half == 1) acc += dot8_shared(slot + kBoxBytes + q * 16, base + L::do_tail(qc) + q * 16);
          acc += __shfl_xor_sync(0xffffffffu, acc, 1);
          if (half == 0) s_delta[qc * kChunk + q] = acc;
          warpgroup_barrier(2 + wg);
          // The second warpgroup done with this O chunk brings the next one into its slot.
          if (wg_lead) {
            __threadfence_block();
            if ((atomicAdd(d_done, 1u) & 1u) != 0 && qc + H::kOSlots < kChunks) load_o(qc + H::kOSlots);
          }
        }
        wgmma_wait<0>();
        fence_accumulators(st);
        fence_accumulators(dpt);
      }
      // P^T = 2^(s log2e S^T - lse[q] log2e) and dS^T = P^T (dP^T - D[q]); column q of the chunk.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = qc * kChunk + 8 * j + 2 * (lane & 3) + e;
          const float l2 = s_lse[q] * kLog2e, delta = s_delta[q];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int i = 4 * j + 2 * hh + e;
            const float p = exp2_approx(fmaf(st[i], scale_log2, -l2));
            st[i] = p;
            dpt[i] = p * (dpt[i] - delta);
          }
        }
      }
      // dV += P^T dO over the chunk's 64 queries (B: dO's rows, MN-major); P^T
      // goes into bf16 fragments first, so that S^T's registers are free.
      const int first = qc > 0 ? 1 : 0;
      {
        uint32_t ap[4][4];
#pragma unroll
        for (int t = 0; t < kChunk / 16; ++t) a_fragment(st, t, ap[t]);
        wgmma_rows_mn<kChunk / 16, kTail>(dv[kbi], dv_t[kbi], ap, base + L::kDO + qc * kChunk * 128,
                                          base + L::do_tail(qc), first);
        // dS^T as bf16 fragments, stored transposed into the chunk's buffer
        // ([query][key], keys in panels of 64) while dV's product runs:
        // fragment t holds the 8 x 8 matrices (queries 16t + 8 (i / 2), keys
        // 16 warp + 8 (i % 2)) for i = 0 .. 3.
        uint32_t ads[4][4];
#pragma unroll
        for (int t = 0; t < kChunk / 16; ++t) a_fragment(dpt, t, ads[t]);
        {
          const int i = lane / 8, row = lane & 7;
#pragma unroll
          for (int t = 0; t < kChunk / 16; ++t) {
            const int q_local = 16 * t + 8 * (i >> 1) + row;
            stmatrix_x4_trans(ds_buf + kb * (kChunk * 128) + q_local * 128 + (((2 * warp + (i & 1)) ^ row) << 4),
                              ads[t]);
          }
        }
        // dK += dS^T Q (B: Q's rows, MN-major).
        wgmma_rows_mn<kChunk / 16, kTail>(dk[kbi], dk_t[kbi], ads, base + L::kQ + qc * kChunk * 128,
                                          base + L::q_tail(qc), first);
        wgmma_wait<0>();
        fence_accumulators(dv[kbi]);
        fence_accumulators(dk[kbi]);
        if constexpr (kTail) {
          fence_accumulators(dv_t[kbi]);
          fence_accumulators(dk_t[kbi]);
        }
      }
    }
    // The chunk's dS is complete once both warpgroups are here; the async
    // proxy (wgmma) reads what stmatrix wrote. A dQ box staged two chunks
    // ago in this chunk's other buffer must have been read by its TMA store
    // before anyone writes dS there after this barrier.
    fence_async_shared();
    if (wg_lead) tma_store_wait_read<0>();
    cta_barrier();
    if (wg == (qc & 1)) {  // dQ of the chunk = s dS K: [64 queries][D], K over 256 keys
      float dq[32], dq_t[4];
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < kT / 16; ++t) {
        const uint64_t da = smem_desc(smem + L::kDS + (qc & 1) * kDsBytes + (t / 4) * (kChunk * 128)) + 2 * (t % 4);
        wgmma_m64n64k16_ss<1>(dq, da, smem_desc_mn(base + L::kK + 16 * t * 128), t > 0);
        if constexpr (kTail) wgmma_m64n8k16_ss_tb(dq_t, da, smem_desc_tail(base + L::k_tail(t / 4) + (t % 4) * 16 * 16), t > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dq);
      if constexpr (kTail) fence_accumulators(dq_t);
      // Every warp's part of the product is done before the box overwrites dS's first panels.
      warpgroup_barrier(2 + wg);
      stage_box(ds_buf, dq, r_lo, lane, scale);
      if constexpr (kTail) stage_tail(ds_buf + kBoxBytes, dq_t, r_lo, lane, scale);
      fence_async_shared();
      warpgroup_barrier(2 + wg);
      if (wg_lead) {
        unsigned char* box = smem + L::kDS + (qc & 1) * kDsBytes;
        tma_store_2d(&maps.dqkv, box, col_q, row0 + qc * kChunk);
        if constexpr (kTail) tma_store_2d(&maps.dqkv_t, box + kBoxBytes, col_q + 64, row0 + qc * kChunk);
      }
    }
  }
  // dK (scaled) and dV of this warpgroup's keys, staged where its rows of Q
  // and dO were (no product reads them any more), then stored by TMA.
#pragma unroll
  for (int kbi = 0; kbi < 2; ++kbi) {
    const int kb = 2 * wg + kbi;
    stage_box(base + L::kQ + kb * kBoxBytes, dk[kbi], r_lo, lane, scale);
    stage_box(base + L::kDO + kb * kBoxBytes, dv[kbi], r_lo, lane, 1.f);
    if constexpr (kTail) {
      stage_tail(base + L::q_tail(kb), dk_t[kbi], r_lo, lane, scale);
      stage_tail(base + L::do_tail(kb), dv_t[kbi], r_lo, lane, 1.f);
    }
  }
  fence_async_shared();
  warpgroup_barrier(2 + wg);
  if (wg_lead) {
#pragma unroll
    for (int kbi = 0; kbi < 2; ++kbi) {
      const int kb = 2 * wg + kbi, row = row0 + kb * kKeyBlock;
      tma_store_2d(&maps.dqkv, smem + L::kQ + kb * kBoxBytes, col_k, row);
      tma_store_2d(&maps.dqkv, smem + L::kDO + kb * kBoxBytes, col_v, row);
      if constexpr (kTail) {
        tma_store_2d(&maps.dqkv_t, smem + L::q_tail(kb), col_k + 64, row);
        tma_store_2d(&maps.dqkv_t, smem + L::do_tail(kb), col_v + 64, row);
      }
    }
    tma_store_wait_read<0>();  // shared memory must outlive the reads
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

template <int D>
void launch(const bf16* qkv, const bf16* o, const bf16* d_o, const float* lse, bf16* dqkv, int batch, int heads,
            float scale, int device, cudaStream_t stream) {
  constexpr const char* kWho = "attention_head_bwd_sm90";
  const int64_t rows = int64_t(batch) * kT, qkv_cols = int64_t(3) * heads * D, o_cols = int64_t(heads) * D;
  Maps maps;
  maps.qkv = bf16_tensor_map(qkv, rows, qkv_cols, 64, kWho);
  maps.o = bf16_tensor_map(o, rows, o_cols, 64, kWho);
  maps.d_o = bf16_tensor_map(d_o, rows, o_cols, 64, kWho);
  maps.dqkv = bf16_tensor_map(dqkv, rows, qkv_cols, 64, kWho);
  if constexpr (Head<D>::kTail) {
    maps.qkv_t = bf16_tensor_map(qkv, rows, qkv_cols, 64, kWho, 8);
    maps.o_t = bf16_tensor_map(o, rows, o_cols, 64, kWho, 8);
    maps.d_o_t = bf16_tensor_map(d_o, rows, o_cols, 64, kWho, 8);
    maps.dqkv_t = bf16_tensor_map(dqkv, rows, qkv_cols, 64, kWho, 8);
  } else {
    maps.qkv_t = maps.qkv;
    maps.o_t = maps.o;
    maps.d_o_t = maps.d_o;
    maps.dqkv_t = maps.dqkv;
  }
  static std::atomic<uint64_t> attribute_set_on{0};
  allow_dynamic_smem(reinterpret_cast<const void*>(attention_head_bwd_kernel<D>), int(Smem<D>::kTotal), device,
                     attribute_set_on);
  attention_head_bwd_kernel<D><<<batch * heads, kThreads, Smem<D>::kTotal, stream>>>(maps, lse, heads, scale);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace

void attention_head_bwd_sm90(const bf16* qkv, const bf16* o, const bf16* d_o, const float* lse, bf16* dqkv, int batch,
                             int heads, int head_dim, float scale, cudaStream_t stream) {
  if (batch < 1 || heads < 1 || int64_t(batch) * heads > INT32_MAX)
    throw std::invalid_argument("attention_head_bwd_sm90: needs batch >= 1 and heads >= 1");
  if (!head_bwd_dim_supported(head_dim))
    throw std::invalid_argument("attention_head_bwd_sm90: head dim must be 64 or 72, not " + std::to_string(head_dim));
  check_tma_pointers("attention_head_bwd_sm90", {qkv, o, d_o, lse, dqkv});
  const int device = sm90_device("attention_head_bwd_sm90");
  if (head_dim == 64)
    launch<64>(qkv, o, d_o, lse, dqkv, batch, heads, scale, device, stream);
  else
    launch<72>(qkv, o, d_o, lse, dqkv, batch, heads, scale, device, stream);
}

}  // namespace perftrain::kernels
