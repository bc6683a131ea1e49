// The storage types the row kernels take, to and from float64, for the checks.
#pragma once
#include "shim.h"

using bf16 = __nv_bfloat16;
using f16 = __half;
static inline double tod(double v) { return v; }
static inline double tod(float v) { return v; }
static inline double tod(bf16 v) { return __bfloat162float(v); }
static inline double tod(f16 v) { return __half2float(v); }
template <typename T> T fromd(double v);
template <> inline float fromd<float>(double v) { return float(v); }
template <> inline bf16 fromd<bf16>(double v) { return __float2bfloat16_rn(float(v)); }
template <> inline f16 fromd<f16>(double v) { return __float2half_rn(float(v)); }
