// The backward of softmax attention for DiT's short sequences, one CTA per
// (sample, head), Hopper (sm_90a) wgmma. Non-causal, no dropout, T = 256
// tokens, head dim 64 (DiT-S/2 and B/2 at 256 px) or 72 (DiT-XL/2: columns
// 64-71 as a tail panel, see Head in the .cu).
//
// Why: at 256 tokens cuDNN's flash backward adds two side passes (dot(dO, O)
// and the fp32 dQ accumulator's conversion). A CTA that holds a whole head
// (Q, K, V, dO: 128 KB) owns every row of dQ, dK and dV, so it needs no fp32
// accumulator, no atomics and no extra passes, and writes dq, dk, dv straight
// into the packed [B, T, 3, H, d] gradient of qkv (one product for the qkv
// input gradient, no pack copy): about half cuDNN's time per DiT layer on
// the H200.
//
// Math (s = softmax scale, lse the forward's log-sum-exp of s * S per query):
//   S = Q K^T, P = exp(s S - lse), dP = dO V^T, D = rowsum(dO * O),
//   dS = P * (dP - D), dV = P^T dO, dK = s dS^T Q, dQ = s dS K.
// How: warpgroup c owns keys [128c, 128c + 128) as two 64-key blocks and
// keeps their dV and dK in registers; query chunks of 64 go by in turn, each
// with its own barrier (chunk 0 brings K and V too, so the products start
// after 80 KB). Per key block S^T = K Q^T and dP^T = V dO^T (wgmma, both
// operands K-major in shared memory; D of the chunk is taken from O and dO
// meanwhile), P^T and dS^T in registers, dV += P^T dO and dK += dS^T Q (A
// from registers, B = dO, Q transposed), dS^T stored transposed (stmatrix)
// into a [64 queries][256 keys] buffer; then one warpgroup takes the chunk's
// dQ = dS K (B = K transposed) while the other starts the next chunk. dQ,
// dK and dV leave through shared memory by TMA stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

constexpr int kHeadBwdTokens = 256;

// The head dims the kernel is built for: 64 (DiT-S, B) and 72 (DiT-XL).
constexpr bool head_bwd_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 72; }

// qkv [B, T, 3, H, d] bf16 (the packed projection), o and d_o [B, T, H, d]
// bf16, lse [B, H, T] fp32 (natural log, of the scaled scores), dqkv
// [B, T, 3, H, d] bf16. T must be 256, d 64 or 72. Throws
// std::invalid_argument for other shapes, misaligned pointers or a GPU other
// than sm_90.
void attention_head_bwd_sm90(const __nv_bfloat16* qkv, const __nv_bfloat16* o, const __nv_bfloat16* d_o,
                             const float* lse, __nv_bfloat16* dqkv, int batch, int heads, int head_dim, float scale,
                             cudaStream_t stream);

}  // namespace perftrain::kernels
