// Token routing of a routed loop (models::LoopedDiT, docs/design.md): the
// router's top-k tokens of each sample go through the loop's group, their
// gated change returns to the residual stream. Two autograd ops whose
// backward together is ONE streaming pass over [B, T, D]:
//   route_select   s = u w^T + b (fp32, the router), index = top-k of s per
//                  sample, ascending; kept = u[b, index[b, j], :]
//   route_combine  out = u + scatter(index, gate * (y - kept))
// route_combine's gradient for u is its incoming gradient itself (no pass),
// returned to route_select through `through`; route_select's backward then
// writes du = d_through + ds w + scatter(index, d_kept) in one pass
// (kernels/route_tokens.h). CUDA: the kernels; CPU: the same split in ATen.
// Capture-safe: static shapes, no host sync.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace perftrain::ops {

struct RouteSelection {
  at::Tensor scores;   // [B, T] fp32 router logits
  at::Tensor index;    // [B, k] int64: each sample's top-k tokens, ascending (no gradient)
  at::Tensor kept;     // [B, k, D] fp32: u's rows at index
  at::Tensor through;  // u (an alias) to pass to route_combine: its gradient returns through route_select
};

// u [B, T, D] fp32; weight [1, D] fp32, bias [1] fp32 or undefined (the
// router, nn::Linear(D, 1)); 1 <= k <= T.
RouteSelection route_select(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias, int64_t k);

// out [B, T, D] fp32 = u + scatter(index, gate * (y - kept)): u [B, T, D]
// fp32 (route_select's `through`), kept [B, k, D] fp32, y [B, k, D] fp32,
// bf16 or fp16, gate [B, k] fp32, index [B, k] int64 distinct per sample.
at::Tensor route_combine(const at::Tensor& u, const at::Tensor& kept, const at::Tensor& y, const at::Tensor& gate,
                         const at::Tensor& index);

// The same maths in plain ATen (autograd through it; through = u itself).
RouteSelection route_select_reference(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias,
                                      int64_t k);
at::Tensor route_combine_reference(const at::Tensor& u, const at::Tensor& kept, const at::Tensor& y,
                                   const at::Tensor& gate, const at::Tensor& index);

}  // namespace perftrain::ops
