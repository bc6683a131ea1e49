// Delayed fp8 scaling (see the header for the rule and the launch).
#include "kernels/fp8_scaling.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"

namespace perftrain::kernels {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    fp8_scaling_update_kernel(const __grid_constant__ Fp8ScalingTable table, float margin_factor) {
  __shared__ float old[kFp8MaxHistory];
  __shared__ float warp_max[kThreads / 32];
  const Fp8ScalingSlot& s = table.slot[blockIdx.x];
  const int h = s.history_len;
  const float a = *s.amax;
  for (int i = threadIdx.x; i < h - 1; i += kThreads) old[i] = s.history[i];
  __syncthreads();
  // Finite entries only; 0 is the floor (amaxes are >= 0).
  float m = (threadIdx.x == 0 && isfinite(a)) ? a : 0.f;
  for (int i = threadIdx.x; i < h - 1; i += kThreads) {
    const float v = old[i];
    s.history[i + 1] = v;
    if (isfinite(v)) m = fmaxf(m, v);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  s.history[0] = a;
  float scale = *s.scale;
  if (!isfinite(a)) {
    s.events[0] += 1.f;
  } else if (a == 0.f) {
    s.events[1] += 1.f;
  } else {
    const float next = __fdiv_rn(s.fp8_max, __fmul_rn(m, margin_factor));
    if (isfinite(next)) {
      scale = next;
    } else {
      s.events[1] += 1.f;
    }
  }
  *s.scale = scale;
  *s.scale_inv = __fdiv_rn(1.f, scale);
  *s.amax = 0.f;
}

}  // namespace

void fp8_scaling_update(const Fp8ScalingTable& table, int margin, cudaStream_t stream) {
  if (table.count < 0 || table.count > kFp8ScalingMaxSlots)
    throw std::invalid_argument("fp8_scaling_update: " + std::to_string(table.count) + " slots (at most " +
                                std::to_string(kFp8ScalingMaxSlots) + ")");
  for (int i = 0; i < table.count; ++i) {
    const Fp8ScalingSlot& s = table.slot[i];
    if (s.history_len < 1 || s.history_len > kFp8MaxHistory)
      throw std::invalid_argument("fp8_scaling_update: history length " + std::to_string(s.history_len) +
                                  " outside [1, " + std::to_string(kFp8MaxHistory) + "]");
    if (!s.amax || !s.history || !s.scale || !s.scale_inv || !s.events)
      throw std::invalid_argument("fp8_scaling_update: slot " + std::to_string(i) + " has a null pointer");
  }
  if (table.count == 0) return;
  const float margin_factor = std::ldexp(1.0f, margin);
  fp8_scaling_update_kernel<<<table.count, kThreads, 0, stream>>>(table, margin_factor);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
