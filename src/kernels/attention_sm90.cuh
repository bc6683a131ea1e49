// The device pieces the attention kernels share (the whole-head backward
// kernels/attention_head_bwd_sm90 and forward kernels/attention_head_fwd_sm90,
// the tiled forward kernels/attention_tiled_fwd_sm90, whose own primitives
// close the file):
// the head-dim layout (64 columns in a swizzled panel, at 72 a tail), wgmma
// descriptors and products of 64-row tiles, register fragments, and the
// staging of accumulators for TMA stores. Device code only; a kernel file
// includes it and says `using namespace attention_sm90;` in its own
// anonymous namespace.
#pragma once

#include <cuda_bf16.h>

#include <cmath>  // INFINITY
#include <cstdint>

#include "kernels/sm90.cuh"

namespace perftrain::kernels::attention_sm90 {

using namespace sm90;

constexpr int kHeadTokens = 256;               // T: the whole head in one CTA
constexpr uint32_t kBoxBytes = 64 * 64 * 2;    // one TMA box of 64 rows x 64 columns: 8 KB

// Head dim D = 64 or 72. Columns 0-63 of each operand sit in a 128-byte-
// swizzled panel (TMA boxes of 64 x 64); at D = 72 columns 64-71 sit in a
// second, unswizzled "tail" panel of 16-byte rows (boxes of 8 x 64), which
// the products use as one more k16 step (S, dP: the tail of K and V from
// registers with columns 72-79 zero) or as an N = 8 product (dV, dK, dQ).
template <int D>
struct Head {
  static_assert(D == 64 || D == 72, "head dim 64 or 72");
  static constexpr bool kTail = D > 64;
  static constexpr uint32_t kTailMat = kTail ? kHeadTokens * 16 : 0;   // one operand's tail panel: 4 KB
  static constexpr uint32_t kTailBox = 64 * 16;               // one TMA box of it: 1 KB
  static constexpr int kOSlots = kTail ? 1 : 2;               // the backward's O chunks in flight (for D)
  static constexpr uint32_t kOSlot = kBoxBytes + (kTail ? kTailBox : 0);
};

// wgmma's descriptor of an unswizzled operand of 16-byte rows (a tail
// panel): 8 x 8 core matrices of 128 contiguous bytes, the next 8 rows 128
// bytes on. LBO and SBO both 128: one steps to the next 8 rows and the other
// to the second 8 columns of a k16 step, which in a tail panel are the next
// 8 rows too. For dV, dK, dQ (N = 8, MN-major) that is the product's own
// K step; for the tail step of S and dP (K-major) it reads 8 rows past
// the block for its last rows, which the zero columns 72-79 of the A
// fragment multiply away: the kernels' layouts put finite, loaded rows there.
__device__ __forceinline__ uint64_t smem_desc_tail(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(128 >> 4) << 32);
}

// wgmma's descriptor of a B operand stored MN-major (row = K index, 64
// contiguous N values = one 128-byte swizzled row), N = 64: one swizzle atom
// across N, 8-row groups 1024 bytes apart along K (SBO). LBO would step to
// a second atom across N; there is none, so it only has to be a legal value.
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1024 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// B K-major (the S and dP products' tail step).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
  wgmma_m64n64k16_rs_layout<0>(d, a, desc_b, scale_d);
}

// B MN-major (transposed): d (64 x 64) = A B (+ d).
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                      int scale_d) {
  wgmma_m64n64k16_rs_layout<1>(d, a, desc_b, scale_d);
}

// acc (+)= A B over STEPS k16 steps: A the register fragments a[t], B's rows
// 16t .. 16t + 15 MN-major in shared memory, the first 64 columns in a
// swizzled panel at `panel` (128-byte rows) and, with TAIL, columns 64-71 in
// a tail panel at `tail` (16-byte rows) into acc_t. accumulate = 0: the
// first step overwrites. Issued and committed as one group; the caller waits.
template <int STEPS, bool TAIL>
__device__ __forceinline__ void wgmma_rows_mn(float (&acc)[32], float (&acc_t)[4], const uint32_t (&a)[STEPS][4],
                                              uint32_t panel, uint32_t tail, int accumulate) {
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < STEPS; ++t)
    wgmma_m64n64k16_rs_tb(acc, a[t], smem_desc_mn(panel + 16 * t * 128), accumulate | (t > 0));
  if constexpr (TAIL)
#pragma unroll
    for (int t = 0; t < STEPS; ++t)
      wgmma_m64n8k16_rs_tb(acc_t, a[t], smem_desc_tail(tail + 16 * t * 16), accumulate | (t > 0));
  wgmma_commit();
}

// The 1024-byte-aligned start of a kernel's dynamic shared memory, for the
// 128-byte-swizzled panels. Offsetting `raw` itself (not an integer) keeps
// the compiler's shared-space loads and stores.
__device__ __forceinline__ unsigned char* align_smem_1024(unsigned char* raw) {
  return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The k16 fragment t (columns 16t .. 16t + 15) of a 64-row accumulator, as
// wgmma's register A operand: the accumulator holds columns
// 8j + 2(lane % 4) + {0, 1} of rows lane / 4 (+ 8) in d[4j .. 4j + 3], which
// is the A layout of columns 16t .. 16t + 15 for j = 2t, 2t + 1.
template <int N>
__device__ __forceinline__ void a_fragment(const float (&d)[N], int t, uint32_t (&a)[4]) {
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

// The same for an N = 8 accumulator (columns 64-71) into a tail box of
// 16-byte rows: row r_lo (+ 8), columns 2 (lane % 4) + {0, 1}.
__device__ __forceinline__ void stage_tail(uint32_t box, const float (&d)[4], int r_lo, int lane, float scale) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    st_shared_u32(box + (r_lo + 8 * hh) * 16 + 4 * (lane & 3), pack_bf16x2(scale * d[2 * hh], scale * d[2 * hh + 1]));
}

}  // namespace perftrain::kernels::attention_sm90

// --- The tiled kernels' primitives (kernels/attention_tiled_fwd_sm90) ---

namespace perftrain::kernels::attention_sm90 {

// How the tiled kernels are given the key bias (kernels::AttentionKeyBias):
// none, fp32 or bf16.
enum class KeyBias { kNone, kF32, kBf16 };

// What a thread adds to its scores of one key tile in the log2 domain, for
// the accumulator columns 8j + 2 (lane % 4) + {0, 1}, j < J, of the tile:
// add[2j + {0, 1}] = the key bias times log2 e, read from the tile's bias
// as the producer staged it (TMA, fp32 or bf16 as B says, at shared address
// `staged`: the tile's keys in order, zeros past T), and -inf for the keys
// at or past `keys_left` (T minus the tile's first key; the branch is taken
// by the whole warp, in the last tile only). A pair of keys is one 8-byte
// (fp32) or 4-byte (bf16) shared load: 16 loads for a 128-key tile, where a
// global load a key cost the masked forward about 0.65 ms a layer at
// SS-B/2 b64.
template <KeyBias B, int J>
__device__ __forceinline__ void staged_key_terms(float (&add)[2 * J], uint32_t staged, int lane, int keys_left) {
  constexpr float kLog2e = 1.4426950408889634f;
  const int c0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    if constexpr (B == KeyBias::kF32) {
      const uint2 w = ld_shared_v2_u32(staged + (8 * j + c0) * 4);
      add[2 * j] = __uint_as_float(w.x) * kLog2e;
      add[2 * j + 1] = __uint_as_float(w.y) * kLog2e;
    } else if constexpr (B == KeyBias::kBf16) {
      const uint32_t w = ld_shared_u32(staged + (8 * j + c0) * 2);
      add[2 * j] = __uint_as_float(w << 16) * kLog2e;
      add[2 * j + 1] = __uint_as_float(w & 0xffff0000u) * kLog2e;
    } else {
      add[2 * j] = add[2 * j + 1] = 0.f;
    }
  }
  if (keys_left < 8 * J)
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * j + c0 + e >= keys_left) add[2 * j + e] = -INFINITY;
}

// The bytes a key of the key bias B takes as TMA stages it (0 without one).
template <KeyBias B>
constexpr uint32_t kStagedBiasKeyBytes = B == KeyBias::kNone ? 0u : B == KeyBias::kF32 ? 4u : 2u;

// Initialises N mbarriers of one arrival each and makes them visible to
// the TMA (one thread).
template <int N>
__device__ __forceinline__ void init_barriers(uint64_t* bars) {
#pragma unroll
  for (int i = 0; i < N; ++i) mbar_init(&bars[i], 1);
  fence_mbarrier_init();
}

// The tiled kernels' head-dim layout. D = 64 or 72: one 128-byte-swizzled
// panel of 64 columns, at 72 Head's 8-column tail. D = 96 or 128: two such
// panels; at 96 the second is loaded whole (a box of 64 columns) but only
// its first 32 are used: the products over the head dim (S, dP) take
// D / 16 k16 steps, so columns 96-127 (the next head's, or zeros past the
// last) never reach a score, and the products whose N is the head dim
// (O, dV, dK, dQ) compute them but they are never stored: the second
// panel's columns 64-95 go out as four 8-column tail boxes.
template <int D>
struct TiledHead {
  static_assert(D == 64 || D == 72 || D == 96 || D == 128, "tiled attention: head dim 64, 72, 96 or 128");
  static constexpr int kPanels = D > 72 ? 2 : 1;
  static constexpr int kSteps1 = D > 72 ? (D - 64) / 16 : 0;  // k16 steps of the second panel
  static constexpr bool kTail = D == 72;
  static constexpr uint32_t kTailBox = 64 * 16;  // an 8-column box of 64 rows: 1 KB
};

// A box of rows of sample b at column col of a 3-D map, for head dim D:
// each panel's 64 columns into `main` + p panel_bytes and, at 72, columns
// 64-71 into `tail` through the tail map.
template <int D>
__device__ __forceinline__ void tma_load_head(unsigned char* main, uint32_t panel_bytes, void* tail,
                                              const CUtensorMap* map, const CUtensorMap* map_t, uint64_t* bar, int col,
                                              int row, int b) {
#pragma unroll
  for (int p = 0; p < TiledHead<D>::kPanels; ++p) tma_load_3d(main + p * panel_bytes, map, bar, col + 64 * p, row, b);
  if constexpr (TiledHead<D>::kTail) tma_load_3d(tail, map_t, bar, col + 64, row, b);
}

// A warpgroup's 64 rows of the head dim's accumulators (panel p in
// acc[p], at 72 the tail in acc_t), times `scale`, staged for
// tma_store_head: panel p swizzled at main + p panel_bytes; at 96 the
// second panel's columns 64-95 as four tail boxes there, at 72 the tail at
// `tail`.
template <int D>
__device__ __forceinline__ void stage_head(uint32_t main, uint32_t panel_bytes, uint32_t tail,
                                           const float (&acc)[TiledHead<D>::kPanels][32], const float (&acc_t)[4],
                                           int r_lo, int lane, float scale) {
  stage_box(main, acc[0], r_lo, lane, scale);
  if constexpr (D == 128) stage_box(main + panel_bytes, acc[TiledHead<D>::kPanels - 1], r_lo, lane, scale);
  if constexpr (D == 96)
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float part[4] = {acc[1][4 * g], acc[1][4 * g + 1], acc[1][4 * g + 2], acc[1][4 * g + 3]};
      stage_tail(main + panel_bytes + g * TiledHead<D>::kTailBox, part, r_lo, lane, scale);
    }
  if constexpr (TiledHead<D>::kTail) stage_tail(tail, acc_t, r_lo, lane, scale);
}

// The boxes stage_head wrote, stored at column col of row `row` of sample b
// (rows past the map's token count not written).
template <int D>
__device__ __forceinline__ void tma_store_head(const CUtensorMap* map, const CUtensorMap* map_t,
                                               const unsigned char* main, uint32_t panel_bytes, const void* tail,
                                               int col, int row, int b) {
  tma_store_3d(map, main, col, row, b);
  if constexpr (D == 128) tma_store_3d(map, main + panel_bytes, col + 64, row, b);
  if constexpr (D == 96)
#pragma unroll
    for (int g = 0; g < 4; ++g)
      tma_store_3d(map_t, main + panel_bytes + g * TiledHead<D>::kTailBox, col + 64 + 8 * g, row, b);
  if constexpr (TiledHead<D>::kTail) tma_store_3d(map_t, tail, col + 64, row, b);
}

// A 64-row accumulator's rows times f (row r_lo: f[0], r_lo + 8: f[1]), and
// with TAIL its N = 8 tail.
template <bool TAIL>
__device__ __forceinline__ void scale_rows(float (&o)[32], float (&o_t)[4], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= f[e / 2];
  if constexpr (TAIL)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_t[e] *= f[e / 2];
}

}  // namespace perftrain::kernels::attention_sm90
