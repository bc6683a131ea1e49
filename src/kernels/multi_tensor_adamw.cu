// Multi-tensor AdamW + EMA (see the header for the three launches). Each block
// walks the chunks blockIdx.x, blockIdx.x + gridDim.x, ... so a fixed grid
// gives a fixed reduction order. The table is a __grid_constant__ parameter:
// indexed in place in the parameter bank, never copied to local memory.
#include "kernels/multi_tensor_adamw.h"

#include <cstdint>

#include "kernels/chunk_table.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_info.h"

namespace perftrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;

struct Chunk {
  int tensor;
  int64_t start;  // first element
  int len;        // elements
};

__device__ __forceinline__ Chunk chunk_at(const AdamWTable& table, int c) {
  Chunk k;
  k.tensor = detail::tensor_of_chunk(table, c);
  const int first = k.tensor == 0 ? 0 : table.chunk_end[k.tensor - 1];
  k.start = static_cast<int64_t>(c - first) * kAdamWChunk;
  const int64_t left = table.t[k.tensor].n - k.start;
  k.len = left < kAdamWChunk ? static_cast<int>(left) : kAdamWChunk;
  return k;
}

__device__ __forceinline__ bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0;
}

// Deterministic block sum (fixed shuffle tree, then warp 0 over the warps).
__device__ double block_sum(double x) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  x = 0;
  if (warp == 0) {
    x = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  }
  return x;  // valid in thread 0
}

__global__ void __launch_bounds__(kThreads)
sum_squares_kernel(const __grid_constant__ AdamWTable table, double* __restrict__ partials) {
  // fp32 within a chunk (at most 256 terms a thread), fp64 across chunks.
  double acc = 0;
  for (int c = blockIdx.x; c < table.chunks; c += gridDim.x) {
    const Chunk k = chunk_at(table, c);
    const float* g = table.t[k.tensor].g;
    if (g == nullptr) continue;  // the same for the whole block
    g += k.start;
    float s = 0.f;
    int tail = 0;
    if (aligned16(g)) {
      const float4* g4 = reinterpret_cast<const float4*>(g);
      const int nv = k.len >> 2;
      for (int i = threadIdx.x; i < nv; i += kThreads) {
        const float4 x = __ldg(g4 + i);
        s = fmaf(x.x, x.x, s);
        s = fmaf(x.y, x.y, s);
        s = fmaf(x.z, x.z, s);
        s = fmaf(x.w, x.w, s);
      }
      tail = nv << 2;
    }
    for (int i = tail + threadIdx.x; i < k.len; i += kThreads) {
      const float x = __ldg(g + i);
      s = fmaf(x, x, s);
    }
    acc += s;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads)
prepare_kernel(const double* __restrict__ partials, int count, AdamWScalars* __restrict__ s, AdamWHyper h) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  const double sumsq = block_sum(acc);
  if (threadIdx.x != 0) return;

  const float scale = s->loss_scale;
  const double norm = count >= 0 ? sqrt(sumsq) / static_cast<double>(scale) : nan("");
  s->grad_norm = static_cast<float>(norm);
  const bool found_inf = !isfinite(static_cast<float>(norm));
  bool skip = false;
  if (h.dynamic_loss_scale) {  // as at::_amp_update_scale_ with backoff 0.5, growth 2
    if (found_inf) {
      s->loss_scale = scale * 0.5f;
      s->good_steps = 0.f;
      s->skipped += 1.f;
      skip = true;
    } else {
      float good = s->good_steps + 1.f;
      if (good >= static_cast<float>(h.growth_interval)) {
        const float grown = scale * 2.f;
        if (isfinite(grown)) s->loss_scale = grown;
        good = 0.f;
      }
      s->good_steps = good;
    }
  } else if (h.skip_nonfinite && found_inf) {
    s->skipped += 1.f;
    skip = true;
  }
  s->skip = skip ? 1.f : 0.f;
  // The schedule follows every step taken, skipped or not (as a PyTorch
  // scheduler stepped each iteration), so it depends on the global step only.
  const double schedule_step = static_cast<double>(s->schedule_step) + 1.0;
  s->schedule_step = static_cast<float>(schedule_step);
  const double lr = lr_at(h.lr_schedule, schedule_step);
  s->lr = static_cast<float>(lr);
  if (skip) return;  // step and the derived scalars stay as they were

  const double step = static_cast<double>(s->step) + 1.0;
  s->step = static_cast<float>(step);
  // NaN-propagating min, as clamp_max in train::clip_grad_norm_.
  double clip = 1.0;
  if (h.grad_clip > 0) {
    const float q = static_cast<float>(h.grad_clip) / (static_cast<float>(norm) + 1e-6f);
    clip = q < 1.f || isnan(q) ? q : 1.f;
  }
  const double d = ema_decay_at(h.ema, step - 1.0);
  s->coef = static_cast<float>(clip / static_cast<double>(scale));
  s->step_size = static_cast<float>(lr / (1.0 - pow(h.beta1, step)));
  s->bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(h.beta2, step)));
  s->lr_wd = static_cast<float>(lr * h.weight_decay);
  s->ema_weight = static_cast<float>(1.0 - d);
}

// Constant for the optimizer's life; 1 - beta from double (1 - 0.999f would be 1e-5 off).
struct BetaConstants {
  float b1, one_minus_b1, b2, one_minus_b2, eps;
};

struct UpdateCoefficients {
  BetaConstants c;
  float coef, lr_wd, step_size, bc2_sqrt, ema_weight;
};

// at::lerp's formula, so the EMA matches _foreach_lerp_.
__device__ __forceinline__ float lerp(float self, float end, float w) {
  return w < 0.5f ? self + w * (end - self) : end - (end - self) * (1.f - w);
}

// The AdamW element update in the order of ATen's fused kernel.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v,
                                              const UpdateCoefficients& k) {
  g *= k.coef;
  p -= k.lr_wd * p;  // decoupled weight decay: p * (1 - lr * wd)
  m = k.c.b1 * m + k.c.one_minus_b1 * g;
  v = k.c.b2 * v + k.c.one_minus_b2 * g * g;
  const float denom = sqrtf(v) / k.bc2_sqrt + k.c.eps;
  p -= k.step_size * m / denom;
}

template <bool kEma>
__device__ __forceinline__ void update_chunk(float* __restrict__ p, const float* __restrict__ g,
                                             float* __restrict__ m, float* __restrict__ v,
                                             float* __restrict__ e, __nv_bfloat16* __restrict__ sh, int len,
                                             const UpdateCoefficients& k) {
  int tail = 0;
  if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!kEma || aligned16(e)) &&
      (sh == nullptr || reinterpret_cast<uintptr_t>(sh) % 8 == 0)) {
    const int nv = len >> 2;
    for (int i = threadIdx.x; i < nv; i += kThreads) {
      float4 p4 = reinterpret_cast<const float4*>(p)[i];
      const float4 g4 = __ldg(reinterpret_cast<const float4*>(g) + i);
      float4 m4 = reinterpret_cast<const float4*>(m)[i];
      float4 v4 = reinterpret_cast<const float4*>(v)[i];
      adamw_element(p4.x, g4.x, m4.x, v4.x, k);
      adamw_element(p4.y, g4.y, m4.y, v4.y, k);
      adamw_element(p4.z, g4.z, m4.z, v4.z, k);
      adamw_element(p4.w, g4.w, m4.w, v4.w, k);
      reinterpret_cast<float4*>(p)[i] = p4;
      if (sh != nullptr) {  // round to nearest even, as p.to(bfloat16)
        reinterpret_cast<__nv_bfloat162*>(sh)[2 * i] = __floats2bfloat162_rn(p4.x, p4.y);
        reinterpret_cast<__nv_bfloat162*>(sh)[2 * i + 1] = __floats2bfloat162_rn(p4.z, p4.w);
      }
      reinterpret_cast<float4*>(m)[i] = m4;
      reinterpret_cast<float4*>(v)[i] = v4;
      if (kEma) {
        float4 e4 = reinterpret_cast<const float4*>(e)[i];
        e4.x = lerp(e4.x, p4.x, k.ema_weight);
        e4.y = lerp(e4.y, p4.y, k.ema_weight);
        e4.z = lerp(e4.z, p4.z, k.ema_weight);
        e4.w = lerp(e4.w, p4.w, k.ema_weight);
        reinterpret_cast<float4*>(e)[i] = e4;
      }
    }
    tail = nv << 2;
  }
  for (int i = tail + threadIdx.x; i < len; i += kThreads) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, __ldg(g + i), mi, vi, k);
    p[i] = pi, m[i] = mi, v[i] = vi;
    if (sh != nullptr) sh[i] = __float2bfloat16_rn(pi);
    if (kEma) e[i] = lerp(e[i], pi, k.ema_weight);
  }
}

__global__ void __launch_bounds__(kThreads)
update_kernel(const __grid_constant__ AdamWTable table, const AdamWScalars* __restrict__ s, BetaConstants c) {
  if (s->skip != 0.f) return;
  UpdateCoefficients k;
  k.c = c;
  k.coef = s->coef;
  k.lr_wd = s->lr_wd;
  k.step_size = s->step_size;
  k.bc2_sqrt = s->bc2_sqrt;
  k.ema_weight = s->ema_weight;
  for (int c = blockIdx.x; c < table.chunks; c += gridDim.x) {
    const Chunk ch = chunk_at(table, c);
    const AdamWTensor& t = table.t[ch.tensor];
    float* p = t.p + ch.start;
    float* e = t.ema != nullptr ? t.ema + ch.start : nullptr;
    if (t.g == nullptr) {  // no gradient: the parameter stands still, its EMA follows it
      if (e != nullptr)
        for (int i = threadIdx.x; i < ch.len; i += kThreads) e[i] = lerp(e[i], p[i], k.ema_weight);
      continue;
    }
    const float* g = t.g + ch.start;
    float* m = t.m + ch.start;
    float* v = t.v + ch.start;
    __nv_bfloat16* sh = t.shadow != nullptr ? t.shadow + ch.start : nullptr;
    UpdateCoefficients kt = k;
    if (t.decay == 0) kt.lr_wd = 0.f;  // the tensor's group takes no weight decay
    if (e != nullptr) update_chunk<true>(p, g, m, v, e, sh, ch.len, kt);
    else update_chunk<false>(p, g, m, v, nullptr, sh, ch.len, kt);
  }
}

}  // namespace

int adamw_grid(int chunks) {
  const int cap = kBlocksPerSm * multiprocessor_count();
  return chunks < cap ? (chunks > 0 ? chunks : 1) : cap;
}

void adamw_sum_squares(const AdamWTable& table, double* partials, int grid, cudaStream_t stream) {
  if (table.chunks == 0) return;
  sum_squares_kernel<<<grid, kThreads, 0, stream>>>(table, partials);
  PERFTRAIN_LAUNCH_CHECK();
}

void adamw_prepare(const double* partials, int count, AdamWScalars* scalars, const AdamWHyper& hyper,
                   cudaStream_t stream) {
  prepare_kernel<<<1, kThreads, 0, stream>>>(partials, count, scalars, hyper);
  PERFTRAIN_LAUNCH_CHECK();
}

void adamw_update(const AdamWTable& table, const AdamWScalars* scalars, const AdamWHyper& hyper, int grid,
                  cudaStream_t stream) {
  if (table.chunks == 0) return;
  const BetaConstants c{static_cast<float>(hyper.beta1), static_cast<float>(1.0 - hyper.beta1),
                        static_cast<float>(hyper.beta2), static_cast<float>(1.0 - hyper.beta2),
                        static_cast<float>(hyper.eps)};
  update_kernel<<<grid, kThreads, 0, stream>>>(table, scalars, c);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
