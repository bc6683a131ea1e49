#include "kernels/route_tokens.h"

#include <initializer_list>

#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 128;

// Four floats of an fp32 row at element c (c % 4 == 0; VEC: one 16-byte access).
template <bool VEC>
__device__ __forceinline__ float4 load4(const float* p, int c) {
  if (VEC) return *reinterpret_cast<const float4*>(p + c);
  return make_float4(p[c], p[c + 1], p[c + 2], p[c + 3]);
}
template <bool VEC>
__device__ __forceinline__ void store4(float* p, int c, float4 v) {
  if (VEC) {
    *reinterpret_cast<float4*>(p + c) = v;
  } else {
    p[c] = v.x, p[c + 1] = v.y, p[c + 2] = v.z, p[c + 3] = v.w;
  }
}

// Element e of a float4 (e < 4).
__device__ __forceinline__ float& lane(float4& v, int e) { return (&v.x)[e]; }

__global__ void slots_clear(int32_t* slot_of, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) slot_of[i] = -1;
}

__global__ void slots_set(const int64_t* idx, int32_t* slot_of, int tokens, int kept, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int b = i / kept, j = i % kept;
  slot_of[int64_t(b) * tokens + idx[i]] = j;
}

// f(c, width) over the row's elements: 4-wide steps, then the scalar tail.
template <typename F>
__device__ __forceinline__ void for_row(int cols, F&& f) {
  const int vec_cols = cols & ~3;
  for (int c = threadIdx.x * 4; c < vec_cols; c += blockDim.x * 4) f(c, 4);
  for (int c = vec_cols + threadIdx.x; c < cols; c += blockDim.x) f(c, 1);
}

// Block r = b * kept + j copies row idx[b, j] of sample b.
template <bool VEC>
__global__ void gather_rows(const float* u, const int64_t* idx, float* g, int tokens, int kept, int cols) {
  const int64_t r = blockIdx.x;
  const float* src = u + (r / kept * tokens + idx[r]) * cols;
  float* dst = g + r * cols;
  for_row(cols, [&](int c, int w) {
    if (w == 4) store4<VEC>(dst, c, load4<VEC>(src, c));
    else dst[c] = src[c];
  });
}

// Block r = b * tokens + t writes out row r.
template <bool VEC, typename TY>
__global__ void combine_rows(const float* u, const int32_t* slot_of, const float* g, const TY* y, const float* gate,
                             float* out, int tokens, int kept, int cols) {
  const int64_t r = blockIdx.x;
  const float* src = u + r * cols;
  float* dst = out + r * cols;
  const int slot = slot_of[r];
  if (slot < 0) {
    for_row(cols, [&](int c, int w) {
      if (w == 4) store4<VEC>(dst, c, load4<VEC>(src, c));
      else dst[c] = src[c];
    });
    return;
  }
  const int64_t k = r / tokens * kept + slot;
  const float gk = gate[k];
  const float* gr = g + k * cols;
  const TY* yr = y + k * cols;
  for_row(cols, [&](int c, int w) {
    if (w == 4) {
      float4 v = load4<VEC>(src, c);
      const float4 gv = load4<VEC>(gr, c);
      float4 gvv = gv;
      for (int e = 0; e < 4; ++e) lane(v, e) += gk * (to_float(yr[c + e]) - lane(gvv, e));
      store4<VEC>(dst, c, v);
    } else {
      dst[c] = src[c] + gk * (to_float(yr[c]) - gr[c]);
    }
  });
}

// The block's sum of v (blockDim.x == kThreads), valid in thread 0.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x == 0)
    for (int i = 0; i < kThreads / 32; ++i) s += warp_sums[i];
  return s;
}

// Block r = b * kept + j: kept row j of sample b.
template <bool VEC, typename TY>
__global__ void combine_backward_rows(const float* dout, const int64_t* idx, const float* g, const TY* y,
                                      const float* gate, TY* dy, float* dg, float* dgate, int tokens, int kept,
                                      int cols) {
  const int64_t r = blockIdx.x;
  const float* d = dout + (r / kept * tokens + idx[r]) * cols;
  const float* gr = g + r * cols;
  const TY* yr = y + r * cols;
  TY* dyr = dy + r * cols;
  float* dgr = dg + r * cols;
  const float gk = gate[r];
  float acc = 0.f;
  for_row(cols, [&](int c, int w) {
    if (w == 4) {
      float4 dv = load4<VEC>(d, c);
      float4 gv = load4<VEC>(gr, c);
      float4 out;
      for (int e = 0; e < 4; ++e) {
        const float de = lane(dv, e);
        acc += de * (to_float(yr[c + e]) - lane(gv, e));
        dyr[c + e] = from_float<TY>(gk * de);
        lane(out, e) = -gk * de;
      }
      store4<VEC>(dgr, c, out);
    } else {
      acc += d[c] * (to_float(yr[c]) - gr[c]);
      dyr[c] = from_float<TY>(gk * d[c]);
      dgr[c] = -gk * d[c];
    }
  });
  const float s = block_sum(acc);
  if (threadIdx.x == 0) dgate[r] = s;
}

// Block r = b * tokens + t writes du row r.
template <bool VEC>
__global__ void select_backward_rows(const float* dthrough, const float* ds, const float* wt, const int32_t* slot_of,
                                     const float* dg, float* du, int tokens, int kept, int cols) {
  const int64_t r = blockIdx.x;
  const float s = ds[r];
  const int slot = slot_of[r];
  const float* dgr = slot < 0 ? nullptr : dg + (r / tokens * kept + slot) * cols;
  const float* dt = dthrough == nullptr ? nullptr : dthrough + r * cols;
  float* dst = du + r * cols;
  for_row(cols, [&](int c, int w) {
    if (w == 4) {
      float4 v = load4<VEC>(wt, c);
      for (int e = 0; e < 4; ++e) lane(v, e) *= s;
      if (dt != nullptr) {
        float4 a = load4<VEC>(dt, c);
        for (int e = 0; e < 4; ++e) lane(v, e) += lane(a, e);
      }
      if (dgr != nullptr) {
        float4 a = load4<VEC>(dgr, c);
        for (int e = 0; e < 4; ++e) lane(v, e) += lane(a, e);
      }
      store4<VEC>(dst, c, v);
    } else {
      dst[c] = s * wt[c] + (dt != nullptr ? dt[c] : 0.f) + (dgr != nullptr ? dgr[c] : 0.f);
    }
  });
}

// 16-byte accesses when every row of every pointer starts 16-byte aligned.
bool vec_ok(int cols, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return cols % 4 == 0;
}

int blocks_of(int n) { return (n + 255) / 256; }

}  // namespace

void route_slots(const int64_t* idx, int32_t* slot_of, int batch, int tokens, int kept, cudaStream_t stream) {
  const int n = batch * tokens, m = batch * kept;
  slots_clear<<<blocks_of(n), 256, 0, stream>>>(slot_of, n);
  PERFTRAIN_LAUNCH_CHECK();
  slots_set<<<blocks_of(m), 256, 0, stream>>>(idx, slot_of, tokens, kept, m);
  PERFTRAIN_LAUNCH_CHECK();
}

void route_gather_rows(const float* u, const int64_t* idx, float* g, int batch, int tokens, int kept, int cols,
                       cudaStream_t stream) {
  if (vec_ok(cols, {u, g})) gather_rows<true><<<batch * kept, kThreads, 0, stream>>>(u, idx, g, tokens, kept, cols);
  else gather_rows<false><<<batch * kept, kThreads, 0, stream>>>(u, idx, g, tokens, kept, cols);
  PERFTRAIN_LAUNCH_CHECK();
}

template <typename TY>
void route_combine_forward(const float* u, const int32_t* slot_of, const float* g, const TY* y, const float* gate,
                           float* out, int batch, int tokens, int kept, int cols, cudaStream_t stream) {
  if (vec_ok(cols, {u, g, out}))
    combine_rows<true, TY><<<batch * tokens, kThreads, 0, stream>>>(u, slot_of, g, y, gate, out, tokens, kept, cols);
  else
    combine_rows<false, TY><<<batch * tokens, kThreads, 0, stream>>>(u, slot_of, g, y, gate, out, tokens, kept, cols);
  PERFTRAIN_LAUNCH_CHECK();
}

template <typename TY>
void route_combine_backward(const float* dout, const int64_t* idx, const float* g, const TY* y, const float* gate,
                            TY* dy, float* dg, float* dgate, int batch, int tokens, int kept, int cols,
                            cudaStream_t stream) {
  if (vec_ok(cols, {dout, g, dg}))
    combine_backward_rows<true, TY>
        <<<batch * kept, kThreads, 0, stream>>>(dout, idx, g, y, gate, dy, dg, dgate, tokens, kept, cols);
  else
    combine_backward_rows<false, TY>
        <<<batch * kept, kThreads, 0, stream>>>(dout, idx, g, y, gate, dy, dg, dgate, tokens, kept, cols);
  PERFTRAIN_LAUNCH_CHECK();
}

void route_select_backward(const float* dthrough, const float* ds, const float* w, const int32_t* slot_of,
                           const float* dg, float* du, int batch, int tokens, int kept, int cols, cudaStream_t stream) {
  if (vec_ok(cols, {dthrough, w, dg, du}))
    select_backward_rows<true><<<batch * tokens, kThreads, 0, stream>>>(dthrough, ds, w, slot_of, dg, du, tokens, kept,
                                                                        cols);
  else
    select_backward_rows<false><<<batch * tokens, kThreads, 0, stream>>>(dthrough, ds, w, slot_of, dg, du, tokens,
                                                                         kept, cols);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_ROUTE_INSTANTIATE(TY)                                                                            \
  template void route_combine_forward<TY>(const float*, const int32_t*, const float*, const TY*, const float*,     \
                                          float*, int, int, int, int, cudaStream_t);                               \
  template void route_combine_backward<TY>(const float*, const int64_t*, const float*, const TY*, const float*,    \
                                           TY*, float*, float*, int, int, int, int, cudaStream_t);
PERFTRAIN_ROUTE_INSTANTIATE(float)
PERFTRAIN_ROUTE_INSTANTIATE(__nv_bfloat16)
PERFTRAIN_ROUTE_INSTANTIATE(__half)
#undef PERFTRAIN_ROUTE_INSTANTIATE

}  // namespace perftrain::kernels
