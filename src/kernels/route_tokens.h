// Token routing of a looped model's routed loop (Mixture-of-Depths style):
// a router keeps k of T tokens per sample, the kept rows go through the
// shared group, their gated change goes back into the residual stream.
// With idx [B, k] int64 (the kept tokens of each sample, distinct) and its
// inverse slot_of [B, T] int32 (slot_of[b, idx[b, j]] = j, -1 elsewhere):
//   slots     slot_of from idx (every entry written)
//   gather    g[b, j, :] = u[b, idx[b, j], :]
//   combine   out[b, t, :] = u[b, t, :] + (j = slot_of[b, t] >= 0 ? gate[b, j] * (y[b, j, :] - g[b, j, :]) : 0)
//   combine backward, per kept row (b, j), t = idx[b, j], d = dout[b, t, :]:
//             dy[b, j, :] = gate[b, j] * d          (y's dtype)
//             dg[b, j, :] = -gate[b, j] * d
//             dgate[b, j] = sum_D d * (y[b, j, :] - g[b, j, :])
//             (du = dout itself needs no kernel)
//   select backward (the router s = u w + b and the gather, with dthrough the
//             gradient of u's pass-through to combine):
//             du[b, t, :] = dthrough[b, t, :] + ds[b, t] * w[:] + (j = slot_of[b, t] >= 0 ? dg[b, j, :] : 0)
// u, g, out, dout, dg, du fp32; y and dy float, __nv_bfloat16 or __half; gate,
// ds, w fp32.
//
// Bytes (D = cols, sy = y's element size), fp32 stream:
//   gather            reads and writes k*D*4 per sample
//   combine           reads T*D*4 + k*D*(4 + sy), writes T*D*4: ONE pass over u
//   combine backward  reads k*D*(4 + 4 + sy), writes k*D*(4 + sy): kept rows only
//   select backward   reads T*D*4 + k*D*4, writes T*D*4: ONE pass, the router's
//                     outer product ds w folded in
// Launch: one block of 128 threads per row (B*k or B*T blocks), each thread
// walking its 4-element vectors (16-byte loads when D % 4 == 0, scalar
// otherwise); the combine backward reduces dgate in the block (warp shuffles,
// then shared memory): deterministic, no atomics. Shape-determined, no host
// sync: captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

void route_slots(const int64_t* idx, int32_t* slot_of, int batch, int tokens, int kept, cudaStream_t stream);

void route_gather_rows(const float* u, const int64_t* idx, float* g, int batch, int tokens, int kept, int cols,
                       cudaStream_t stream);

template <typename TY>
void route_combine_forward(const float* u, const int32_t* slot_of, const float* g, const TY* y, const float* gate,
                           float* out, int batch, int tokens, int kept, int cols, cudaStream_t stream);

template <typename TY>
void route_combine_backward(const float* dout, const int64_t* idx, const float* g, const TY* y, const float* gate,
                            TY* dy, float* dg, float* dgate, int batch, int tokens, int kept, int cols,
                            cudaStream_t stream);

// dthrough may be null (no gradient through the pass-through: zero).
void route_select_backward(const float* dthrough, const float* ds, const float* w, const int32_t* slot_of,
                           const float* dg, float* du, int batch, int tokens, int kept, int cols, cudaStream_t stream);

}  // namespace perftrain::kernels
