// The backward of softmax attention at any length, with an optional additive
// key bias, Hopper (sm_90a) wgmma: the partner of
// kernels/attention_tiled_fwd_sm90 (its out and lse), deterministic.
// Non-causal, no dropout, T >= 64 tokens, head dim 64, 72, 96 or 128.
//
// Maths (s = softmax scale, b_j the key bias, lse_i the forward's
// log-sum-exp of s S + b):
//   P = exp(s S + b - lse), D_i = rowsum(dO_i * O_i), dP = dO V^T,
//   dS = P * (dP - D), dV = P^T dO, dK = s dS^T Q, dQ = s dS K.
//
// Why: cuDNN's backward ran every shape beyond 256 tokens, and with a key
// mask it is most of the 25 ms of masked attention in an SS-B/2 step; the
// whole-head backward (kernels/attention_head_bwd_sm90) takes 256 tokens only.
//
// How: three launches, none with atomics, each sum in a fixed order, so that
// reruns give the same bits:
//  1. D per query (a few threads per row of O and dO, a fixed shuffle tree).
//  2. dK, dV: a CTA per (key block of 128, head, sample); warpgroup c keeps
//     dK, dV of keys 64c .. 64c + 63 in registers while the query chunks of
//     64 stream by (Q, dO, their lse and D; TMA, double-buffered): S^T = K Q^T
//     and dP^T = V dO^T (m64n64, both operands K-major), P^T and dS^T in
//     registers, dV += P^T dO and dK += dS^T Q (A from registers, B MN-major).
//  3. dQ: a CTA per (query block of 128, head, sample); warpgroup c keeps dQ
//     of queries 64c .. 64c + 63 while K, V stream by in tiles of 64 keys:
//     S and dP again (the bias and the key count as in the forward), dS,
//     dQ += dS K (B = K MN-major).
// In launches 2 and 3 a stage is refilled once every computing warp has
// arrived on its "free" mbarrier (no CTA-wide barrier per step), so the two
// warpgroups may drift a step apart and overlap one's exponentials with the
// other's products.
// Recomputing S and dP in launch 3 costs two of the backward's five
// products, and saves an fp32 dQ accumulator and its turn-taking.
// Launch shapes: 1: four threads a row of [B, T, H, d], 256 a block; 2 and
// 3: grid (ceil(T / 128), H, B) of 256 threads, one CTA per SM.
// Head dims 96 and 128 take two 64-column panels as the forward does
// (attention_sm90.cuh's TiledHead; at 96 the products whose N is the head
// dim compute the second panel whole and store its first 32 columns).
// Budget (ptxas, sm_90a, no spills at any d; 255 registers a thread at most):
//   d        launch 2: shared            fp32 state a thread     regs   launch 3: shared (+ bias)   regs
//   64       32 + 2 x 17 KB =  66 KB     dK, dV 64, S, dP 64     176    32 + 2 x 16 =  64.5 KB      132
//   72       36 + 2 x 19 KB =  74 KB     dK, dV 72, S, dP 64     194    36 + 2 x 19 =  74.5 KB      147
//   96, 128  64 + 2 x 33 KB = 130 KB     dK, dV 128, S, dP 64    240    64 + 2 x 32 = 128.5 KB     164
// (with a key bias each launch takes 2-8 registers more; launch 3 reads the
// bias of a key tile as the forward does, staged by TMA beside the stage.)
// At d = 128 launch 2 keeps the 128-key block and the split by keys: 64
// keys a warpgroup is wgmma's smallest M, so a smaller block would be one
// warpgroup a CTA, each Q and dO chunk loaded for half the keys; splitting
// dK from dV between the warpgroups would make both compute S^T (P is in
// both gradients), five products per chunk where four do. dK, dV (128) and
// S^T, dP^T (64) live at the peak fit in 240 registers without a spill.
// dQ, dK, dV are written through 3-D tensor maps (rows past T not stored)
// wherever the caller's operands say (the packed gradient [B, T, 3D] as the
// common case).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/attention_tiled_fwd_sm90.h"

namespace perftrain::kernels {

// A gradient operand: element (b, t, h, c) at data[(b T + t) row_stride + h d + c].
struct AttentionGradOperand {
  __nv_bfloat16* data = nullptr;
  int64_t row_stride = 0;
};

// q, k, v and bias as the forward took them; out and d_out [B, T, H, d] bf16
// (contiguous), lse [B, H, T] fp32 (the forward's), delta a workspace of
// B H T floats (D, written here); dq, dk, dv written. Throws
// std::invalid_argument as the forward does.
void attention_tiled_bwd_sm90(AttentionOperand q, AttentionOperand k, AttentionOperand v,
                              const AttentionKeyBias& bias, const __nv_bfloat16* out, const __nv_bfloat16* d_out,
                              const float* lse, float* delta, AttentionGradOperand dq, AttentionGradOperand dk,
                              AttentionGradOperand dv, int batch, int tokens, int heads, int head_dim, float scale,
                              cudaStream_t stream);

}  // namespace perftrain::kernels
