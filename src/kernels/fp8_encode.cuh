// What every kernel that writes fp8 shares (the rule is kernels/fp8_cast.h's):
// the saturating encoding of v * scale, the bits of |v| that an amax takes
// (the non-negative floats order as their bits, every NaN above Inf), and a
// warp's share of the atomic max on *amax.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/fp8_cast.h"

namespace perftrain::kernels::detail {

// saturate(v * scale) in F, rounded to nearest even (cuda_fp8.h's __NV_SATFINITE conversion).
template <Fp8Format F>
__device__ __forceinline__ uint8_t fp8_encode(float v, float scale) {
  constexpr __nv_fp8_interpretation_t kind = F == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind));
}

// The bits of |v|: ordered as the values, NaN above Inf.
__device__ __forceinline__ unsigned int fp8_abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The warp's max of `bits` (all 32 lanes call it) into *amax: lane 0's atomicMax,
// skipped where *amax already holds at least as much (a max only grows within a
// step, so a skipped atomic changes nothing; it spares the one address the
// atomics of many warps a row kernel has).
__device__ __forceinline__ void fp8_warp_amax(unsigned int bits, float* amax) {
  bits = __reduce_max_sync(0xffffffffu, bits);
  if ((threadIdx.x & 31) == 0) {
    auto* target = reinterpret_cast<unsigned int*>(amax);
    if (bits > *reinterpret_cast<volatile unsigned int*>(target)) atomicMax(target, bits);
  }
}

}  // namespace perftrain::kernels::detail
