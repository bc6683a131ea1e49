// The forward of softmax attention at any length, with an optional additive
// key bias (a key mask), Hopper (sm_90a) wgmma: the tiled partner of
// kernels/attention_head_fwd_sm90 (which takes 256 tokens only).
// Non-causal, no dropout, T >= 64 tokens (any count, not only multiples of
// 64), head dim 64, 72, 96 or 128.
//
// Maths (s = softmax scale, b_j the key bias of key j, 0 without one):
//   x_ij = s q_i . k_j + b_j,  m_i = max_j x_ij,  l_i = sum_j exp(x_ij - m_i),
//   out_i = sum_j exp(x_ij - m_i) v_j / l_i,  lse_i = m_i + ln l_i,
// computed in the log2 domain (x log2 e, exp2 on the special-function unit)
// one 128-key tile at a time: the running maximum m and sum l per query, and
// O rescaled by 2^(m_old - m_new) before each tile's P V is added (online
// softmax). Keys past T get weight 0; a masked key's bias (-65504, as
// attention_key_bias writes it) makes its weight underflow to 0 once the
// query has one attended key.
//
// Why: beyond 256 tokens a query's row of scores does not fit in registers
// (the whole-head kernel's trick), and cuDNN's fused attention, which ran
// every such shape, pads head dim 72 to 128 and, with a key mask, reads the
// [B, 1, 1, T] bias through a general broadcast path: 25 ms of SS-B/2's
// 108 ms step was its masked attention.
//
// How: a CTA of 256 threads per (query block of 128, head, sample); warpgroup
// c takes the block's queries 64c .. 64c + 63 (a warpgroup whose queries all
// lie past T idles through the loop). Q is loaded once, K and V stream by in
// tiles of 128 keys, double-buffered: thread 0 issues tile j + 1 into the
// other buffer once every computing warp has said (an mbarrier) it is done
// with tile j - 1 there, so the two warpgroups may drift up to a tile apart
// and one's softmax run beside the other's products. Per tile and warpgroup: S = Q K^T (m64n128, both
// operands K-major, 128-byte swizzle, d / 16 k16 steps over the head dim's
// 64-column panels; at head dim 72 one more k16 step of Q's tail from
// registers against K's tail panel), bias and the key-count
// mask added, running max and sum across the quad that shares a row, O
// scaled, P as bf16 register fragments, O += P V (V's rows MN-major, one
// m64n64 product per panel). At the end O / l is staged where the
// warpgroup's Q was and stored by TMA; lse per query. 3-D tensor maps
// (columns, tokens, samples) keep a tile inside its sample: rows past T load
// as zeros and are not stored.
// Head dims 96 and 128 take two panels (attention_sm90.cuh's TiledHead): at
// 96 the second is loaded whole and S reads only its first 32 columns, O's
// product computes all 64 (a third more P V work than needed, no second
// tail layout) and only columns 64-95 are stored, as four 8-column boxes.
// A key bias reaches the CTA as the K and V tiles do: thread 0 has TMA copy
// the tile's 128 keys of it (2-D map: keys, samples) into a slot beside the
// stage, on the stage's barrier, and each thread reads its 32 keys there in
// 16 shared loads while S's product runs (attention_sm90.cuh's
// staged_key_terms). The key count past T is masked in the last tile only.
// Budget per CTA (launch: grid (ceil(T / 128), H, B), 256 threads, one CTA
// per SM by registers; ptxas, sm_90a, no spills at any d):
//   d        shared memory (Q + 2 stages of K, V, bias)   fp32 state a thread   registers (fp32 bias)
//   64       16 KB + 2 x 32.5 KB =  81 KB                 S 64, O 32, P 32      159 (167)
//   72       18 KB + 2 x 36.5 KB =  91 KB                 S 64, O 36, P 32      167 (168)
//   96, 128  32 KB + 2 x 64.5 KB = 161 KB                 S 64, O 64, P 32      190 (196)
// (of 227 KB and 255 registers a thread at 256 threads).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// One of q, k, v: element (b, t, h, c) at data[(b T + t) row_stride + h d + c]
// (samples contiguous, heads side by side in a row): the packed projection
// [B, T, 3D] gives q = qkv, k = qkv + D, v = qkv + 2D, row_stride 3D. data
// 16-byte aligned and row_stride a multiple of 8 (TMA's rules).
struct AttentionOperand {
  const __nv_bfloat16* data = nullptr;
  int64_t row_stride = 0;
};

// The additive key bias: undefined (data null), or key j of sample b at
// data[b sample_stride + j], fp32 or bf16 (attention_key_bias's [B, 1, 1, T]
// in qkv's dtype, its rows padded: sample_stride >= T). TMA reads it: data
// 16-byte aligned and, with more than one sample, sample_stride a multiple
// of 16 bytes (attention_key_bias pads its rows to 8 elements).
struct AttentionKeyBias {
  const void* data = nullptr;
  int64_t sample_stride = 0;
  bool fp32 = false;
};

// The head dims the tiled kernels are built for (64: DiT-S, B, SS-B; 72:
// DiT-XL, SS-XL; 96 and 128); the other multiples of 8 are refused (each
// would need its own tail layout).
constexpr bool tiled_attention_dim_supported(int head_dim) {
  return head_dim == 64 || head_dim == 72 || head_dim == 96 || head_dim == 128;
}
// The fewest tokens the tiled kernels take.
constexpr int kTiledAttentionMinTokens = 64;

// out [B, T, H, d] bf16 (token-major, as cuDNN writes it), lse [B, H, T] fp32
// (natural log, of the scaled and biased scores): the formats of
// attention_head_fwd_sm90. Throws std::invalid_argument for head dims other
// than 64, 72, 96 and 128, T < 64, misaligned pointers or strides, or a GPU
// other than sm_90.
void attention_tiled_fwd_sm90(AttentionOperand q, AttentionOperand k, AttentionOperand v,
                              const AttentionKeyBias& bias, __nv_bfloat16* out, float* lse, int batch, int tokens,
                              int heads, int head_dim, float scale, cudaStream_t stream);

}  // namespace perftrain::kernels
