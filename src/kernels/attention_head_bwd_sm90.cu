#include "kernels/attention_head_bwd_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "kernels/cuda_check.h"
#include "kernels/sm90.cuh"
#include "kernels/tensor_map.h"

namespace perftrain::kernels {
namespace {

using namespace sm90;  // the instruction helpers (kernels/sm90.cuh)
using bf16 = __nv_bfloat16;

constexpr int kT = kHeadBwdTokens, kD = kHeadBwdDim;
constexpr int kChunk = 64;                     // queries per chunk
constexpr int kChunks = kT / kChunk;
constexpr int kKeyBlock = 64;                  // keys per wgmma M
constexpr int kThreads = 256;                  // two warpgroups
constexpr uint32_t kMatBytes = kT * kD * 2;    // one [256][64] bf16 operand, 128-byte rows: 32 KB
constexpr uint32_t kBoxBytes = 64 * kD * 2;    // one TMA box, 64 rows: 8 KB
constexpr uint32_t kDsBytes = kChunk * kT * 2; // dS of a chunk, [64 queries][256 keys] as 4 panels of 64 keys

// Shared memory: Q, K, V, dO (TMA, 128-byte swizzle), two dS buffers (a
// chunk's dQ is staged for its TMA store in its first panel once dQ's
// product has read it), two slots for O's chunks (for D), lse per query, D
// per query for each warpgroup, mbarriers per chunk (Q, dO, and with chunk 0
// K, V, lse) and per O chunk; 1024 bytes to align the start.
struct Smem {
  static constexpr uint32_t kQ = 0, kK = kMatBytes, kV = 2 * kMatBytes, kDO = 3 * kMatBytes;
  static constexpr uint32_t kDS = 4 * kMatBytes;               // 2 x kDsBytes
  static constexpr uint32_t kO = kDS + 2 * kDsBytes;           // 2 x kBoxBytes
  static constexpr uint32_t kLse = kO + 2 * kBoxBytes;         // float[256]
  static constexpr uint32_t kDelta = kLse + kT * 4;            // float[2][256]
  static constexpr uint32_t kBar = kDelta + 2 * kT * 4;        // uint64_t[kChunks] chunks, then [kChunks] O
  static constexpr size_t kTotal = kBar + 16 * kChunks + 1024;
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// wgmma's descriptor of a B operand stored MN-major (row = K index, 64
// contiguous N values = one 128-byte swizzled row), N = 64: one swizzle atom
// across N, 8-row groups 1024 bytes apart along K (SBO). LBO would step to
// a second atom across N; there is none, so it only has to be a legal value.
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1024 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// d (64 x 64) = A B^T (+ d), both from shared memory, A K-major; B K-major
// too, or MN-major (transposed) with TransB = 1.
template <int TransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

// d (64 x 64) = A B (+ d), A (64 x 16) from registers in the accumulator
// layout's k16 fragment, B from shared memory MN-major (transposed).
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                      int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x on the special-function unit; flushing denormal results to zero costs
// nothing here (a probability below 2^-126 is zero in bf16 anyway).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four 8 x 8 bf16 matrices of mma fragments stored transposed: lane L gives
// the address of row L % 8 of matrix L / 8 of the result.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// A 256-thread barrier of the CTA's two warpgroups (id 1; 0 is __syncthreads,
// 2 and 3 are the warpgroups' own).
__device__ __forceinline__ void cta_barrier() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// The k16 fragment t (queries 16t .. 16t + 15 of a chunk) of a 64 x 64
// accumulator, as wgmma's register A operand: the accumulator holds columns
// 8j + 2(lane % 4) + {0, 1} of rows lane / 4 (+ 8) in d[4j .. 4j + 3], which
// is the A layout of columns 16t .. 16t + 15 for j = 2t, 2t + 1.
__device__ __forceinline__ void a_fragment(const float (&d)[32], int t, uint32_t (&a)[4]) {
  a[0] = pack_bf16x2(d[8 * t + 0], d[8 * t + 1]);
  a[1] = pack_bf16x2(d[8 * t + 2], d[8 * t + 3]);
  a[2] = pack_bf16x2(d[8 * t + 4], d[8 * t + 5]);
  a[3] = pack_bf16x2(d[8 * t + 6], d[8 * t + 7]);
}

// Byte offset of element (row, col) in a K-major 128-byte-swizzled [rows][64]
// bf16 panel: 16-byte unit u of row r sits at unit u ^ (r % 8).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  return row * 128 + ((((col * 2) >> 4) ^ (row & 7)) << 4) + ((col * 2) & 15);
}

// A warp's 16 rows of a 64 x 64 accumulator, times `scale`, as bf16 into a
// swizzled [64][64] box at `box` (shared address) for a TMA store: row
// r_lo (+ 8), columns 8j + 2 (lane % 4) + {0, 1}; the eight rows of a store
// land in eight different 16-byte units, so it is free of bank conflicts.
__device__ __forceinline__ void stage_box(uint32_t box, const float (&d)[32], int r_lo, int lane, float scale) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      st_shared_u32(box + swizzled_offset(r_lo + 8 * hh, 8 * j + 2 * (lane & 3)),
                    pack_bf16x2(scale * d[4 * j + 2 * hh], scale * d[4 * j + 2 * hh + 1]));
}

// 1D bulk copy of `bytes` (a multiple of 16) from global into shared memory;
// the barrier counts them.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_head_bwd_kernel(const __grid_constant__ CUtensorMap tma_qkv, const __grid_constant__ CUtensorMap tma_o,
                              const __grid_constant__ CUtensorMap tma_do, const __grid_constant__ CUtensorMap tma_dqkv,
                              const float* __restrict__ lse, int heads, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Offsetting smem_raw itself (not an integer) keeps the compiler's shared-space loads and stores.
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t base = smem_u32(smem);
  const float* s_lse = reinterpret_cast<const float*>(smem + Smem::kLse);
  uint64_t* chunk_ready = reinterpret_cast<uint64_t*>(smem + Smem::kBar);
  uint64_t* o_ready = chunk_ready + kChunks;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int row0 = b * kT;  // the sample's first token
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  float* s_delta = reinterpret_cast<float*>(smem + Smem::kDelta) + wg * kT;  // this warpgroup's D

  if (tid == 0) {
#pragma unroll
    for (int c = 0; c < 2 * kChunks; ++c) mbar_init(&chunk_ready[c], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // O's chunk c goes to slot c % 2: chunks 0 and 1 now, 2 and 3 once both
  // warpgroups have their D of chunks 0 and 1.
  auto load_o = [&](int c) {
    mbar_arrive_expect_tx(&o_ready[c], kBoxBytes);
    tma_load_2d(smem + Smem::kO + (c & 1) * kBoxBytes, &tma_o, &o_ready[c], h * kD, row0 + c * kChunk);
  };
  if (tid == 0) {  // chunk 0 brings K, V and lse with its Q and dO: the first products wait for 81 KB, not 160
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      mbar_arrive_expect_tx(&chunk_ready[c], (c == 0 ? 2 * kMatBytes + kT * 4 : 0) + 2 * kBoxBytes);
      tma_load_2d(smem + Smem::kQ + c * kBoxBytes, &tma_qkv, &chunk_ready[c], h * kD, row0 + c * kChunk);
      tma_load_2d(smem + Smem::kDO + c * kBoxBytes, &tma_do, &chunk_ready[c], h * kD, row0 + c * kChunk);
      if (c == 0) {
        for (int r = 0; r < kT; r += 64) {
          tma_load_2d(smem + Smem::kK + r * 128, &tma_qkv, &chunk_ready[0], (heads + h) * kD, row0 + r);
          tma_load_2d(smem + Smem::kV + r * 128, &tma_qkv, &chunk_ready[0], (2 * heads + h) * kD, row0 + r);
        }
        bulk_load(smem + Smem::kLse, lse + (int64_t(b) * heads + h) * kT, kT * 4, &chunk_ready[0]);
        load_o(0);
      }
      if (c == 1) load_o(1);
    }
  }

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = scale * kLog2e;
  // This warpgroup's key blocks 2 wg, 2 wg + 1, and their gradients.
  float dv[2][32], dk[2][32];
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (keys within the block)

  for (int qc = 0; qc < kChunks; ++qc) {
    const uint32_t ds_buf = base + Smem::kDS + (qc & 1) * kDsBytes;
    mbar_wait(&chunk_ready[qc], 0);
#pragma unroll
    for (int kbi = 0; kbi < 2; ++kbi) {
      const int kb = 2 * wg + kbi;
      float st[32], dpt[32];  // S^T and dP^T: [64 keys][64 queries of the chunk]
      {
        const uint64_t da_k = smem_desc(smem + Smem::kK + kb * kKeyBlock * 128);
        const uint64_t da_v = smem_desc(smem + Smem::kV + kb * kKeyBlock * 128);
        const uint64_t db_q = smem_desc(smem + Smem::kQ + qc * kChunk * 128);
        const uint64_t db_do = smem_desc(smem + Smem::kDO + qc * kChunk * 128);
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < kD / 16; ++t) wgmma_m64n64k16_ss<0>(st, da_k + 2 * t, db_q + 2 * t, t > 0);
#pragma unroll
        for (int t = 0; t < kD / 16; ++t) wgmma_m64n64k16_ss<0>(dpt, da_v + 2 * t, db_do + 2 * t, t > 0);
        wgmma_commit();
        if (kbi == 0) {
          // While the first products run: D = rowsum(dO * O) of the chunk's
          // 64 queries, two threads per query, into this warpgroup's copy.
          const int i = tid % 128, q = i / 2, half = i & 1;
          mbar_wait(&o_ready[qc], 0);
          const uint32_t o_row = base + Smem::kO + (qc & 1) * kBoxBytes + q * 128;
          const uint32_t do_row = base + Smem::kDO + (qc * kChunk + q) * 128;
          float acc = 0.f;
#pragma unroll
          for (int u = 4 * half; u < 4 * half + 4; ++u) {
            const uint32_t at = (u ^ (q & 7)) << 4;
            uint4 ov, dv4;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(ov.x), "=r"(ov.y), "=r"(ov.z), "=r"(ov.w)
                         : "r"(o_row + at));
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(dv4.x), "=r"(dv4.y), "=r"(dv4.z), "=r"(dv4.w)
                         : "r"(do_row + at));
            const __nv_bfloat162* op = reinterpret_cast<const __nv_bfloat162*>(&ov);
            const __nv_bfloat162* dp = reinterpret_cast<const __nv_bfloat162*>(&dv4);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float2 of = __bfloat1622float2(op[k]), df = __bfloat1622float2(dp[k]);
              acc = fmaf(of.x, df.x, acc);
              acc = fmaf(of.y, df.y, acc);
            }
          }
          acc += __shfl_xor_sync(0xffffffffu, acc, 1);
          if (half == 0) s_delta[qc * kChunk + q] = acc;
          warpgroup_barrier(2 + wg);
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
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < kChunk / 16; ++t)
          wgmma_m64n64k16_rs_tb(dv[kbi], ap[t], smem_desc_mn(base + Smem::kDO + (qc * kChunk + 16 * t) * 128),
                                first | (t > 0));
        wgmma_commit();
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
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < kChunk / 16; ++t)
          wgmma_m64n64k16_rs_tb(dk[kbi], ads[t], smem_desc_mn(base + Smem::kQ + (qc * kChunk + 16 * t) * 128),
                                first | (t > 0));
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(dv[kbi]);
        fence_accumulators(dk[kbi]);
      }
    }
    // The chunk's dS is complete once both warpgroups are here; the async
    // proxy (wgmma) reads what stmatrix wrote. A dQ box staged two chunks
    // ago in this chunk's other buffer must have been read by its TMA store
    // before anyone writes dS there after this barrier.
    fence_async_shared();
    if (wg_lead) tma_store_wait_read<0>();
    cta_barrier();
    // Both warpgroups have their D of this chunk: its O slot takes chunk qc + 2.
    if (tid == 0 && qc + 2 < kChunks) load_o(qc + 2);
    if (wg == (qc & 1)) {  // dQ of the chunk = s dS K: [64 queries][64 d], K over 256 keys
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < kT / 16; ++t) {
        const uint64_t da = smem_desc(smem + Smem::kDS + (qc & 1) * kDsBytes + (t / 4) * (kChunk * 128)) + 2 * (t % 4);
        wgmma_m64n64k16_ss<1>(dq, da, smem_desc_mn(base + Smem::kK + 16 * t * 128), t > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dq);
      // Every warp's part of the product is done before the box overwrites dS's first panel.
      warpgroup_barrier(2 + wg);
      stage_box(ds_buf, dq, r_lo, lane, scale);
      fence_async_shared();
      warpgroup_barrier(2 + wg);
      if (wg_lead) tma_store_2d(&tma_dqkv, smem + Smem::kDS + (qc & 1) * kDsBytes, h * kD, row0 + qc * kChunk);
    }
  }
  // dK (scaled) and dV of this warpgroup's keys, staged where its rows of Q
  // and dO were (no product reads them any more), then stored by TMA.
#pragma unroll
  for (int kbi = 0; kbi < 2; ++kbi) {
    const int kb = 2 * wg + kbi;
    stage_box(base + Smem::kQ + kb * kBoxBytes, dk[kbi], r_lo, lane, scale);
    stage_box(base + Smem::kDO + kb * kBoxBytes, dv[kbi], r_lo, lane, 1.f);
  }
  fence_async_shared();
  warpgroup_barrier(2 + wg);
  if (wg_lead) {
#pragma unroll
    for (int kbi = 0; kbi < 2; ++kbi) {
      const int kb = 2 * wg + kbi;
      tma_store_2d(&tma_dqkv, smem + Smem::kQ + kb * kBoxBytes, (heads + h) * kD, row0 + kb * kKeyBlock);
      tma_store_2d(&tma_dqkv, smem + Smem::kDO + kb * kBoxBytes, (2 * heads + h) * kD, row0 + kb * kKeyBlock);
    }
    tma_store_wait_read<0>();  // shared memory must outlive the reads
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

// [rows, cols] bf16 row-major in boxes of 64 rows x 64 columns, 128-byte swizzle.
CUtensorMap tensor_map(const bf16* base, int64_t rows, int64_t cols) {
  return bf16_tensor_map(base, rows, cols, 64, "attention_head_bwd_sm90");
}

}  // namespace

void attention_head_bwd_sm90(const bf16* qkv, const bf16* o, const bf16* d_o, const float* lse, bf16* dqkv, int batch,
                             int heads, float scale, cudaStream_t stream) {
  if (batch < 1 || heads < 1 || int64_t(batch) * heads > INT32_MAX)
    throw std::invalid_argument("attention_head_bwd_sm90: needs batch >= 1 and heads >= 1");
  for (const void* p : {static_cast<const void*>(qkv), static_cast<const void*>(o), static_cast<const void*>(d_o),
                        static_cast<const void*>(lse), static_cast<const void*>(dqkv)})
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw std::invalid_argument("attention_head_bwd_sm90: every pointer must be given and 16-byte aligned");
  int device = 0, major = 0, minor = 0;
  PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) throw std::invalid_argument("attention_head_bwd_sm90: needs an sm_90 GPU");
  const int64_t rows = int64_t(batch) * kT;
  const CUtensorMap map_qkv = tensor_map(qkv, rows, int64_t(3) * heads * kD);
  const CUtensorMap map_do = tensor_map(d_o, rows, int64_t(heads) * kD);
  const CUtensorMap map_o = tensor_map(o, rows, int64_t(heads) * kD);
  const CUtensorMap map_dqkv = tensor_map(dqkv, rows, int64_t(3) * heads * kD);
  static std::atomic<uint64_t> attribute_set_on{0};
  allow_dynamic_smem(reinterpret_cast<const void*>(attention_head_bwd_kernel), int(Smem::kTotal), device,
                     attribute_set_on);
  attention_head_bwd_kernel<<<batch * heads, kThreads, Smem::kTotal, stream>>>(map_qkv, map_o, map_do, map_dqkv, lse, heads,
                                                                               scale);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
