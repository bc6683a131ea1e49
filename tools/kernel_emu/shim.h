// Host emulation of the CUDA environment the row kernels use (README.md): each CUDA
// thread of a block is a fiber (emu.cpp), the block's fibers run one at a time and
// switch at __syncthreads and at each warp shuffle, which are real barriers (a divergent
// __syncthreads or a full-mask shuffle some lanes miss aborts with a message). Blocks run
// one after another, so `__shared__` (static here) is each block's own while it runs.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <functional>

namespace emu {
struct Tls { uint3 tid, bid; dim3 bdim, gdim; int lin; };
extern thread_local Tls tls;
void sync_block();
float shfl_xor(float v, int o);
void run_grid(dim3 grid, dim3 block, const std::function<void()>& body);
}  // namespace emu

#define threadIdx (emu::tls.tid)
#define blockIdx (emu::tls.bid)
#define blockDim (emu::tls.bdim)
#define gridDim (emu::tls.gdim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
inline void __syncthreads() { emu::sync_block(); }
inline float __shfl_xor_sync(unsigned, float v, int o) { return emu::shfl_xor(v, o); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Fibers switch only at barriers, so a plain read-modify-write is atomic here.
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned old = *p; *p = old + v; return old; }
inline unsigned atomicMax(unsigned* p, unsigned v) { const unsigned old = *p; *p = old > v ? old : v; return old; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, sizeof u); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// A warp's max: five butterfly shuffles (the bits travel through the float slots unchanged).
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned w = __float_as_uint(emu::shfl_xor(__uint_as_float(v), o));
    v = v > w ? v : w;
  }
  return v;
}
using std::isfinite;
using std::min;
using std::max;
namespace emu {
template <typename K, typename... A>
void launch(K k, dim3 grid, dim3 block, A... args) {
  run_grid(grid, block, [&] { k(args...); });
}
}  // namespace emu
