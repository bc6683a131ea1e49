#include "kernels/attention_tiled_fwd_sm90.h"

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

constexpr int kChunk = 64;                       // queries per warpgroup
constexpr int kBlock = 2 * kChunk;               // queries per CTA
constexpr int kTile = 128;                       // keys per K, V tile
constexpr int kThreads = 256;                    // two warpgroups
constexpr uint32_t kPanel = kTile * 128;         // a tile's 64 columns of a panel: 16 KB
constexpr uint32_t kTailPanel = kTile * 16;      // a tile's columns 64-71: 2 KB

using Bias = KeyBias;

// Q (per panel, two chunks of 64 rows, 128-byte swizzle), two stages of
// K, V (each K's panels, V's, then K's tail and V's tail: the tail step of
// S over K reads 8 rows past K's tail for its last rows, which are V's
// tail, loaded with it), Q's tail, each stage's key bias (room for 128 fp32
// keys), then the barriers (Q's, each stage's); 1024 bytes to align the
// start.
template <int D>
struct TiledSmem {
  static constexpr int kP = TiledHead<D>::kPanels;
  static constexpr bool kTail = TiledHead<D>::kTail;
  static constexpr uint32_t kQPanel = kBlock * 128;  // one panel of Q: 16 KB
  static constexpr uint32_t kQBytes = kP * kQPanel + (kTail ? kBlock * 16 : 0);
  static constexpr uint32_t kStageBytes = 2 * kP * kPanel + (kTail ? 2 * kTailPanel : 0);  // 32, 36, 64, 64 KB
  static constexpr uint32_t kQ = 0, kStage = kP * kQPanel;
  static constexpr uint32_t kK = 0, kV = kP * kPanel, kKt = 2 * kP * kPanel, kVt = kKt + kTailPanel;  // in a stage
  static constexpr uint32_t kQt = kStage + 2 * kStageBytes;
  static constexpr uint32_t kBiasSlot = kTile * 4, kBias = kQt + (kTail ? kBlock * 16 : 0);
  static constexpr uint32_t kBar = kBias + 2 * kBiasSlot;
  static constexpr size_t kTotal = kBar + 5 * 8 + 1024;
  static_assert(kKt + kTailPanel == kVt, "V's tail follows K's: the tail step of S reads 8 rows past K's tail");
  static_assert(kStage % 1024 == 0 && kStageBytes % 1024 == 0, "swizzled panels need 1024-byte alignment");
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// The tensor maps of one call, 3-D (columns, tokens, samples): boxes of 64
// rows for Q and O, 128 for K and V; the tails' boxes of 8 columns at 72
// and 96 (the main maps stand in for them at 64 and 128); the key bias's
// 2-D (keys, samples) in boxes of 128 keys (q's map stands in without one).
struct TiledMaps {
  CUtensorMap q, k, v, out, q_t, k_t, v_t, out_t, bias;
};

// The per-call scalars beside the maps.
struct TiledArgs {
  float* lse;
  int tokens, heads;
  float scale;
};

// One tile's softmax step for a warpgroup's 64 queries: s (the scores S of
// rows r_lo, r_lo + 8) becomes P = 2^(x - m_new) with x = s S log2 e + add;
// m (the running maxima, log2 domain) moves to m_new, the thread's partial
// row sums and O are scaled by 2^(m - m_new) and the sums take P's.
template <int P, bool TAIL>
__device__ __forceinline__ void online_softmax_step(float (&s)[64], const float (&add)[32], float scale_log2,
                                                    float (&m)[2], float (&sum)[2], float (&o)[P][32],
                                                    float (&o_t)[4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[4 * j + e] = fmaf(s[4 * j + e], scale_log2, add[2 * j + (e & 1)]);
  float alpha[2], m_use[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = m[hh];
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with no finite score yet (every key so far biased to -inf) keeps
    // 0 as its reference: its weights stay 0 and nothing turns NaN.
    m_use[hh] = mx == -INFINITY ? 0.f : mx;
    alpha[hh] = exp2_approx(m[hh] - m_use[hh]);
    m[hh] = mx;
    sum[hh] *= alpha[hh];
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2_approx(s[4 * j + e] - m_use[e / 2]);
      s[4 * j + e] = p;
      sum[e / 2] += p;
    }
#pragma unroll
  for (int p = 0; p < P; ++p) scale_rows<TAIL>(o[p], o_t, alpha);  // o_t (72 only) scaled once: P = 1 there
}

// The kernel's one loop, its prologue and epilogue: a hundred-odd lines
// that share the barrier phases and the warpgroup's registers.
template <int D, Bias B>
__global__ void __launch_bounds__(kThreads, 1)
    attention_tiled_fwd_kernel(const __grid_constant__ TiledMaps maps, const TiledArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = TiledSmem<D>;
  constexpr bool kTail = L::kTail;
  constexpr int kP = L::kP;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  uint64_t* q_ready = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* kv_ready = q_ready + 1;  // one per stage: its K, V have landed
  uint64_t* kv_free = q_ready + 3;   // one per stage: every warp computing is done with it
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid & 31;
  const bool wg_lead = tid % 128 == 0;
  const int r_lo = warp * 16 + lane / 4;  // accumulator rows r_lo and r_lo + 8 (queries within the chunk)
  const int T = args.tokens, h = blockIdx.y, b = blockIdx.z;
  const int q_block = blockIdx.x * kBlock, q0 = q_block + wg * kChunk;
  const bool active = q0 < T;  // a warpgroup past the last query idles through the loop
  const int chunks = q_block + kChunk < T ? 2 : 1, tiles = (T + kTile - 1) / kTile;

  if (tid == 0) {
    mbar_init(&kv_free[0], 4 * chunks);  // lane 0 of each warp of the warpgroups with queries
    mbar_init(&kv_free[1], 4 * chunks);
    init_barriers<3>(q_ready);  // Q's and each stage's landing, and the fence for all five
  }
  __syncthreads();
  auto load_tile = [&](int tile, int stage) {
    unsigned char* at = smem + L::kStage + stage * L::kStageBytes;
    uint64_t* bar = &kv_ready[stage];
    mbar_arrive_expect_tx(bar, L::kStageBytes + kTile * kStagedBiasKeyBytes<B>);
    tma_load_head<D>(at + L::kK, kPanel, at + L::kKt, &maps.k, &maps.k_t, bar, h * D, tile * kTile, b);
    tma_load_head<D>(at + L::kV, kPanel, at + L::kVt, &maps.v, &maps.v_t, bar, h * D, tile * kTile, b);
    if constexpr (B != Bias::kNone)
      tma_load_2d(smem + L::kBias + stage * L::kBiasSlot, &maps.bias, bar, tile * kTile, b);
  };
  if (tid == 0) {
    mbar_arrive_expect_tx(q_ready, chunks * (L::kQBytes / 2));
    for (int c = 0; c < chunks; ++c)
      tma_load_head<D>(smem + L::kQ + c * kChunk * 128, L::kQPanel, smem + L::kQt + c * kChunk * 16, &maps.q,
                       &maps.q_t, q_ready, h * D, q_block + c * kChunk, b);
    load_tile(0, 0);
  }

  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  const float scale_log2 = args.scale * kLog2e;
  unsigned char* q_chunk = smem + L::kQ + wg * kChunk * 128;
  const uint32_t qt_chunk = kTail ? smem_u32(smem + L::kQt + wg * kChunk * 16) : 0;  // no tail panel at 64
  uint32_t q_t[4] = {0, 0, 0, 0};  // the tail of this thread's Q rows, columns 72-79 zero
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f}, o[kP][32], o_t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int p = 0; p < kP; ++p)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[p][i] = 0.f;
  if (active) {
    mbar_wait(q_ready, 0);
    if constexpr (kTail) {
      q_t[0] = ld_shared_u32(qt_chunk + r_lo * 16 + 4 * (lane & 3));
      q_t[1] = ld_shared_u32(qt_chunk + (r_lo + 8) * 16 + 4 * (lane & 3));
    }
  }
#pragma unroll 1
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    // The next tile into the other stage once both warpgroups are done with
    // the tile before this one there: they drift apart by up to a tile, so
    // that one's softmax can run beside the other's products.
    if (tid == 0 && tile + 1 < tiles) {
      if (tile >= 1) mbar_wait(&kv_free[stage ^ 1], ((tile - 1) >> 1) & 1);
      load_tile(tile + 1, stage ^ 1);
    }
    if (active) {
      unsigned char* st = smem + L::kStage + stage * L::kStageBytes;
      const uint32_t st_u32 = smem_u32(st);
      mbar_wait(&kv_ready[stage], (tile >> 1) & 1);
      // S = Q K^T: row r_lo (+ 8) holds keys 8j + 2 (lane % 4) + {0, 1} in s[4j], s[4j + 1] (s[4j + 2], s[4j + 3]).
      float s[64];
      const uint64_t da = smem_desc(q_chunk), db = smem_desc(st + L::kK);
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < 4; ++t) wgmma_m64n128k16(s, da + 2 * t, db + 2 * t, t > 0);
      if constexpr (kP > 1) {
        const uint64_t da1 = smem_desc(q_chunk + L::kQPanel), db1 = smem_desc(st + L::kK + kPanel);
#pragma unroll
        for (int t = 0; t < TiledHead<D>::kSteps1; ++t) wgmma_m64n128k16(s, da1 + 2 * t, db1 + 2 * t, 1);
      }
      if constexpr (kTail) wgmma_m64n128k16_rs(s, q_t, smem_desc_tail(st_u32 + L::kKt), 1);
      wgmma_commit();
      float add[32];  // the staged bias read while the product runs
      staged_key_terms<B, 16>(add, smem_u32(smem + L::kBias + stage * L::kBiasSlot), lane, T - tile * kTile);
      wgmma_wait<0>();
      fence_accumulators(s);
      online_softmax_step<kP, kTail>(s, add, scale_log2, m, sum, o, o_t);
      // O += P V over the tile's 128 keys: P as 8 bf16 k16 fragments, V's rows MN-major.
      uint32_t ap[8][4];
#pragma unroll
      for (int t = 0; t < 8; ++t) a_fragment(s, t, ap[t]);
      wgmma_rows_mn<8, kTail>(o[0], o_t, ap, st_u32 + L::kV, st_u32 + L::kVt, 1);
      if constexpr (kP > 1) wgmma_rows_mn<8, false>(o[kP - 1], o_t, ap, st_u32 + L::kV + kPanel, 0, 1);
      wgmma_wait<0>();
#pragma unroll
      for (int p = 0; p < kP; ++p) fence_accumulators(o[p]);
      if constexpr (kTail) fence_accumulators(o_t);
      if (lane == 0) mbar_arrive(&kv_free[stage]);  // this warp's products have read the stage
    }
  }
  if (!active) return;

  // lse = (m + log2 l) ln 2 per query; O / l.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 1);
    sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 2);
  }
  if ((lane & 3) == 0)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = q0 + r_lo + 8 * hh;
      if (row < T) args.lse[(int64_t(b) * args.heads + h) * T + row] = (m[hh] + __log2f(sum[hh])) * kLn2;
    }
  const float inv[2] = {1.f / sum[0], 1.f / sum[1]};
#pragma unroll
  for (int p = 0; p < kP; ++p) scale_rows<kTail>(o[p], o_t, inv);
  // Staged where the warpgroup's Q was (every warp of it is past the last
  // product that read it), then stored by TMA; rows past T are not written.
  warpgroup_barrier(2 + wg);
  stage_head<D>(smem_u32(q_chunk), L::kQPanel, qt_chunk, o, o_t, r_lo, lane, 1.f);
  fence_async_shared();
  warpgroup_barrier(2 + wg);
  if (wg_lead) {
    tma_store_head<D>(&maps.out, &maps.out_t, q_chunk, L::kQPanel, smem + L::kQt + wg * kChunk * 16, h * D, q0, b);
    tma_store_wait_read<0>();  // the boxes are read before the CTA's shared memory goes
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

TiledMaps make_maps(AttentionOperand q, AttentionOperand k, AttentionOperand v, const AttentionKeyBias& bias,
                    bf16* out, int batch, int tokens, int heads, int head_dim) {
  constexpr const char* kWho = "attention_tiled_fwd_sm90";
  const int64_t cols = int64_t(heads) * head_dim;
  TiledMaps maps;
  maps.q = bf16_tensor_map_3d(q.data, batch, tokens, cols, q.row_stride, kChunk, kWho);
  maps.k = bf16_tensor_map_3d(k.data, batch, tokens, cols, k.row_stride, kTile, kWho);
  maps.v = bf16_tensor_map_3d(v.data, batch, tokens, cols, v.row_stride, kTile, kWho);
  maps.out = bf16_tensor_map_3d(out, batch, tokens, cols, cols, kChunk, kWho);
  if (head_dim % 64 != 0) {
    maps.q_t = bf16_tensor_map_3d(q.data, batch, tokens, cols, q.row_stride, kChunk, kWho, 8);
    maps.k_t = bf16_tensor_map_3d(k.data, batch, tokens, cols, k.row_stride, kTile, kWho, 8);
    maps.v_t = bf16_tensor_map_3d(v.data, batch, tokens, cols, v.row_stride, kTile, kWho, 8);
    maps.out_t = bf16_tensor_map_3d(out, batch, tokens, cols, cols, kChunk, kWho, 8);
  } else {
    maps.q_t = maps.q;
    maps.k_t = maps.k;
    maps.v_t = maps.v;
    maps.out_t = maps.out;
  }
  maps.bias = bias.data != nullptr ? row_tensor_map(bias.data, batch, tokens, bias.sample_stride, bias.fp32 ? 4 : 2,
                                                    kTile, kWho)
                                   : maps.q;
  return maps;
}

template <int D, Bias B>
void launch(const TiledMaps& maps, const TiledArgs& args, int batch, int device, cudaStream_t stream) {
  static std::atomic<uint64_t> attribute_set_on{0};
  const auto kernel = attention_tiled_fwd_kernel<D, B>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(TiledSmem<D>::kTotal), device, attribute_set_on);
  const dim3 grid((args.tokens + kBlock - 1) / kBlock, args.heads, batch);
  kernel<<<grid, kThreads, TiledSmem<D>::kTotal, stream>>>(maps, args);
  PERFTRAIN_LAUNCH_CHECK();
}

template <int D>
void launch_for_bias(const TiledMaps& maps, const TiledArgs& args, const AttentionKeyBias& bias, int batch,
                     int device, cudaStream_t stream) {
  if (bias.data == nullptr)
    launch<D, Bias::kNone>(maps, args, batch, device, stream);
  else if (bias.fp32)
    launch<D, Bias::kF32>(maps, args, batch, device, stream);
  else
    launch<D, Bias::kBf16>(maps, args, batch, device, stream);
}

}  // namespace

void attention_tiled_fwd_sm90(AttentionOperand q, AttentionOperand k, AttentionOperand v,
                              const AttentionKeyBias& bias, bf16* out, float* lse, int batch, int tokens, int heads,
                              int head_dim, float scale, cudaStream_t stream) {
  constexpr const char* kWho = "attention_tiled_fwd_sm90";
  if (batch < 1 || heads < 1 || batch > 65535 || heads > 65535)
    throw std::invalid_argument(std::string(kWho) + ": needs 1 <= batch, heads <= 65535");
  if (tokens < kTiledAttentionMinTokens)
    throw std::invalid_argument(std::string(kWho) + ": needs at least 64 tokens, not " + std::to_string(tokens));
  if (!tiled_attention_dim_supported(head_dim))
    throw std::invalid_argument(std::string(kWho) + ": head dim must be 64, 72, 96 or 128, not " +
                                std::to_string(head_dim));
  if (bias.data != nullptr && bias.sample_stride < tokens)
    throw std::invalid_argument(std::string(kWho) + ": the key bias's sample stride is below the token count");
  check_tma_pointers(kWho, {q.data, k.data, v.data, out, lse});
  if (bias.data != nullptr) check_tma_pointers(kWho, {bias.data});
  const int device = sm90_device(kWho);
  const TiledMaps maps = make_maps(q, k, v, bias, out, batch, tokens, heads, head_dim);
  const TiledArgs args{lse, tokens, heads, scale};
  switch (head_dim) {
    case 64: launch_for_bias<64>(maps, args, bias, batch, device, stream); break;
    case 72: launch_for_bias<72>(maps, args, bias, batch, device, stream); break;
    case 96: launch_for_bias<96>(maps, args, bias, batch, device, stream); break;
    default: launch_for_bias<128>(maps, args, bias, batch, device, stream); break;
  }
}

}  // namespace perftrain::kernels
