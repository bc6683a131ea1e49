#include "kernels/attention_head_fwd_sm90.h"

#include <cuda.h>  // CUtensorMap

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/attention_head_bwd_sm90.h"
#include "kernels/attention_sm90.cuh"
#include "kernels/cuda_check.h"
#include "kernels/sm90.cuh"
#include "kernels/tensor_map.h"

namespace perftrain::kernels {
namespace {

using namespace attention_sm90;  // the shared pieces (kernels/attention_sm90.cuh), sm90 with them
using bf16 = __nv_bfloat16;

constexpr int kT = kHeadTokens;
constexpr int kChunk = 64;                   // queries per chunk
constexpr int kThreads = 256;                // two warpgroups, two chunks each
constexpr uint32_t kMatBytes = kT * 64 * 2;  // one operand's first 64 columns: 32 KB

// One head's buffer: Q, K, V (first 64 columns, 128-byte swizzle), then the
// tails (Q's, K's, V's). The tail step of S over K reads 8 rows past K's
// tail for its last rows: V's tail, loaded with it. Two buffers, then one
// mbarrier each; 1024 bytes to align the start.
template <int D>
struct FwdSmem {
  using H = Head<D>;
  static constexpr uint32_t kQ = 0, kK = kMatBytes, kV = 2 * kMatBytes;
  static constexpr uint32_t kQt = 3 * kMatBytes, kKt = kQt + H::kTailMat, kVt = kKt + H::kTailMat;
  static constexpr uint32_t kBuf = 3 * kMatBytes + 3 * H::kTailMat;  // 96 KB; 108 KB at 72
  static constexpr uint32_t kBar = 2 * kBuf;
  static constexpr size_t kTotal = kBar + 16 + 1024;
  static_assert(kBuf % 1024 == 0, "each buffer's swizzled panels need 1024-byte alignment");
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// The tensor maps of one call (the tails' boxes of 8 columns at 72; the
// same maps stand in for them at 64).
struct FwdMaps {
  CUtensorMap qkv, out, qkv_t, out_t;
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_head_fwd_kernel(const __grid_constant__ FwdMaps maps, float* __restrict__ lse, int heads,
                              int total_heads, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using H = Head<D>;
  using L = FwdSmem<D>;
  constexpr bool kTail = H::kTail;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  uint64_t* head_ready = reinterpret_cast<uint64_t*>(smem + L::kBar);
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (queries within the chunk)

  if (tid == 0) {
    mbar_init(&head_ready[0], 1);
    mbar_init(&head_ready[1], 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  auto load_head = [&](int head, int buf) {
    const int b = head / heads, h = head % heads, row0 = b * kT;
    unsigned char* at = smem + buf * L::kBuf;
    uint64_t* bar = &head_ready[buf];
    mbar_arrive_expect_tx(bar, L::kBuf);
    for (int r = 0; r < kT; r += 64) {
      tma_load_2d(at + L::kQ + r * 128, &maps.qkv, bar, h * D, row0 + r);
      tma_load_2d(at + L::kK + r * 128, &maps.qkv, bar, (heads + h) * D, row0 + r);
      tma_load_2d(at + L::kV + r * 128, &maps.qkv, bar, (2 * heads + h) * D, row0 + r);
      if constexpr (kTail) {
        tma_load_2d(at + L::kQt + r * 16, &maps.qkv_t, bar, h * D + 64, row0 + r);
        tma_load_2d(at + L::kKt + r * 16, &maps.qkv_t, bar, (heads + h) * D + 64, row0 + r);
        tma_load_2d(at + L::kVt + r * 16, &maps.qkv_t, bar, (2 * heads + h) * D + 64, row0 + r);
      }
    }
  };
  if (tid == 0) load_head(blockIdx.x, 0);

  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  const float scale_log2 = scale * kLog2e;
  int i = 0;
  for (int head = blockIdx.x; head < total_heads; head += gridDim.x, ++i) {
    const int buf = i & 1;
    // The next head into the other buffer, free since the barrier that ended the head before this one.
    if (tid == 0 && head + int(gridDim.x) < total_heads) load_head(head + gridDim.x, buf ^ 1);
    mbar_wait(&head_ready[buf], (i >> 1) & 1);
    const int b = head / heads, h = head % heads, row0 = b * kT;
    unsigned char* hb = smem + buf * L::kBuf;
    const uint32_t hbase = smem_u32(hb);
#pragma unroll 1
    for (int cc = 0; cc < 2; ++cc) {
      const int qc = wg + 2 * cc;
      // S = Q K^T for the chunk's 64 queries and all 256 keys: row r_lo (+ 8)
      // holds columns 8j + 2 (lane % 4) + {0, 1} in s[4j], s[4j + 1] (s[4j + 2], s[4j + 3]).
      float s[128];
      {
        uint32_t q_t[4] = {0, 0, 0, 0};  // the tail of this thread's Q rows, columns 72-79 zero
        if constexpr (kTail) {
          const uint32_t at = hbase + L::kQt + (qc * kChunk + r_lo) * 16 + 4 * (lane & 3);
          q_t[0] = ld_shared_u32(at);
          q_t[1] = ld_shared_u32(at + 8 * 16);
        }
        const uint64_t da = smem_desc(hb + L::kQ + qc * kChunk * 128), db = smem_desc(hb + L::kK);
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < 4; ++t) wgmma_m64n256k16_ss(s, da + 2 * t, db + 2 * t, t > 0);
        if constexpr (kTail) wgmma_m64n256k16_rs(s, q_t, smem_desc_tail(hbase + L::kKt), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(s);
      }
      // The rows' maximum and sum of 2^(s log2e (S - max)), across the quad that shares a row.
      float m2[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = s[2 * hh];
#pragma unroll
        for (int j = 0; j < 32; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        m2[hh] = mx * scale_log2;
      }
#pragma unroll
      for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hh = e / 2;
          const float p = exp2_approx(fmaf(s[4 * j + e], scale_log2, -m2[hh]));
          s[4 * j + e] = p;
          sum[hh] += p;
        }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 1);
        sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 2);
      }
      // O = P V over the 256 keys: P as 16 bf16 k16 fragments, V's rows MN-major.
      float o[32], o_t[4];
      {
        uint32_t ap[16][4];
#pragma unroll
        for (int t = 0; t < 16; ++t) a_fragment(s, t, ap[t]);
        wgmma_rows_mn<16, kTail>(o, o_t, ap, hbase + L::kV, hbase + L::kVt, 0);
        wgmma_wait<0>();
        fence_accumulators(o);
        if constexpr (kTail) fence_accumulators(o_t);
      }
      // lse = ln(sum of exp(s S)) = (max s log2e + log2(sum)) ln 2; O / sum.
      const float inv[2] = {1.f / sum[0], 1.f / sum[1]};
      if ((lane & 3) == 0)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          lse[(int64_t(b) * heads + h) * kT + qc * kChunk + r_lo + 8 * hh] = (m2[hh] + __log2f(sum[hh])) * kLn2;
      scale_rows<true>(o, o_t, inv);
      // Staged where the chunk's Q was (every warp of the warpgroup is past
      // the product that read it), then stored by TMA.
      warpgroup_barrier(2 + wg);
      stage_box(hbase + L::kQ + qc * kChunk * 128, o, r_lo, lane, 1.f);
      if constexpr (kTail) stage_tail(hbase + L::kQt + qc * kChunk * 16, o_t, r_lo, lane, 1.f);
      fence_async_shared();
      warpgroup_barrier(2 + wg);
      if (wg_lead) {
        tma_store_2d(&maps.out, hb + L::kQ + qc * kChunk * 128, h * D, row0 + qc * kChunk);
        if constexpr (kTail) tma_store_2d(&maps.out_t, hb + L::kQt + qc * kChunk * 16, h * D + 64, row0 + qc * kChunk);
      }
    }
    // This buffer takes the head after next once its O boxes have been read
    // and both warpgroups are done with it.
    if (wg_lead) tma_store_wait_read<0>();
    __syncthreads();
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

template <int D>
void launch(const bf16* qkv, bf16* out, float* lse, int batch, int heads, float scale, int device,
            cudaStream_t stream) {
  constexpr const char* kWho = "attention_head_fwd_sm90";
  const int64_t rows = int64_t(batch) * kT, qkv_cols = int64_t(3) * heads * D, out_cols = int64_t(heads) * D;
  FwdMaps maps;
  maps.qkv = bf16_tensor_map(qkv, rows, qkv_cols, 64, kWho);
  maps.out = bf16_tensor_map(out, rows, out_cols, 64, kWho);
  if constexpr (Head<D>::kTail) {
    maps.qkv_t = bf16_tensor_map(qkv, rows, qkv_cols, 64, kWho, 8);
    maps.out_t = bf16_tensor_map(out, rows, out_cols, 64, kWho, 8);
  } else {
    maps.qkv_t = maps.qkv;
    maps.out_t = maps.out;
  }
  static std::atomic<uint64_t> attribute_set_on{0};
  allow_dynamic_smem(reinterpret_cast<const void*>(attention_head_fwd_kernel<D>), int(FwdSmem<D>::kTotal), device,
                     attribute_set_on);
  int sms = 0;
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int total = batch * heads;
  attention_head_fwd_kernel<D><<<std::min(total, std::max(sms, 1)), kThreads, FwdSmem<D>::kTotal, stream>>>(
      maps, lse, heads, total, scale);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace

void attention_head_fwd_sm90(const bf16* qkv, bf16* out, float* lse, int batch, int heads, int head_dim, float scale,
                             cudaStream_t stream) {
  if (batch < 1 || heads < 1 || int64_t(batch) * heads > INT32_MAX)
    throw std::invalid_argument("attention_head_fwd_sm90: needs batch >= 1 and heads >= 1");
  if (!head_bwd_dim_supported(head_dim))
    throw std::invalid_argument("attention_head_fwd_sm90: head dim must be 64 or 72, not " + std::to_string(head_dim));
  check_tma_pointers("attention_head_fwd_sm90", {qkv, out, lse});
  const int device = sm90_device("attention_head_fwd_sm90");
  if (head_dim == 64)
    launch<64>(qkv, out, lse, batch, heads, scale, device, stream);
  else
    launch<72>(qkv, out, lse, batch, heads, scale, device, stream);
}

}  // namespace perftrain::kernels
