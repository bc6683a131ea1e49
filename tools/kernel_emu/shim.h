// Host emulation of the CUDA environment the kernels use (README.md): each CUDA
// thread of a block is a fiber (emu.cpp), the block's fibers run one at a time and
// switch at barriers (__syncthreads, bar.sync), at each warp shuffle, at warp- and
// warpgroup-wide instructions and at mbarrier waits (a divergent barrier or a
// full-mask shuffle some lanes miss aborts with a message). Blocks run one after
// another, so `__shared__` (static here) and the dynamic shared memory are each block's
// own while it runs. The sm_90a instructions are sm90_emu.h's (kernels/sm90.cuh swapped).
#pragma once
#include <cstdint>
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

#include <string>

namespace emu {
struct Tls { uint3 tid, bid; dim3 bdim, gdim; int lin; };
extern thread_local Tls tls;
extern int sm_count;                 // the emulated GPU's SMs (the persistent kernels' grid): 2 unless a check sets it
constexpr size_t kSmemOffset = 128;  // the dynamic shared memory's start past a 1024-byte boundary
// The schedule a check may vary (a kernel's results must not depend on it): TMA loads land when
// no fiber can run (late, the default: a read the mbarrier does not order sees NaN) or at issue
// (early: a load into a stage still being read shows); the block's fibers run from the first or
// from the last.
extern bool loads_land_early, fibers_reversed;
[[noreturn]] void fail(const char* what);  // prints the block and thread, aborts
void sync_block();
void barrier(int id, int count);     // bar.sync id, count (__syncthreads: id 0, every thread)
void yield(const std::string& what); // waits until the other fibers have run (`what`: said on a deadlock)
void note_progress();                // a yielding fiber's wait was passed
void atomic_order(const void* p);    // an atomic on p: in the dynamic shared memory, an ordering edge (race.h)
// A warp- (size 32) or warpgroup-wide (128) instruction `tag`: each thread of the group gives
// `arg`; the last to arrive runs op on all of them (in thread order), then all go on.
void collective(int size, const char* tag, void* arg, const std::function<void(void* const* args)>& op);
int thread_index();                  // the calling fiber's linear thread index
int block_threads();
unsigned char* dynamic_smem();
size_t dynamic_smem_bytes();
uintptr_t smem_window_base();        // shared address 0
float shfl_xor(float v, int o);
float shfl_idx(float v, int src);    // lane src's v, to every lane of the warp
void run_grid(dim3 grid, dim3 block, size_t dynamic_bytes, const std::function<void()>& body);
void block_begin(int threads);       // sm90_emu.cpp: a block's mbarriers and queues reset
void thread_exit();                  // sm90_emu.cpp: a thread's asynchronous work must be waited for
bool land_loads();                   // sm90_emu.cpp: the TMA loads in flight land (false: none)
void check_launch(const void* kernel, size_t dynamic_bytes);  // sm90_emu.cpp: the kernel's shared-memory limit
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
inline int __shfl_sync(unsigned, int v, int src) {  // the bits travel through the float slots unchanged
  float f;
  std::memcpy(&f, &v, sizeof f);
  f = emu::shfl_idx(f, src);
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline void __syncwarp(unsigned = 0xffffffffu) { (void)emu::shfl_xor(0.f, 0); }  // the warp's lanes meet
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Fibers switch only at barriers, so a plain read-modify-write is atomic here.
inline unsigned atomicAdd(unsigned* p, unsigned v) { emu::atomic_order(p); const unsigned old = *p; *p = old + v; return old; }
inline unsigned atomicMax(unsigned* p, unsigned v) { emu::atomic_order(p); const unsigned old = *p; *p = old > v ? old : v; return old; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, sizeof u); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// The fast intrinsics as their exact forms (their device error, ~2 ulp, is not emulated).
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
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
inline void __threadfence_block() {}
inline float __log2f(float x) { return std::log2(x); }
#define __CUDA_ARCH_FEAT_SM90_ALL 1  // the kernels' sm_90a paths; sm90_emu.h gives their instructions
namespace emu {
// kernel<<<grid, block, dynamic_bytes, stream>>>(args...), as run.sh rewrites it.
template <typename K, typename... A>
void launch(K k, dim3 grid, dim3 block, size_t dynamic_bytes, A... args) {
  check_launch(reinterpret_cast<const void*>(k), dynamic_bytes);
  run_grid(grid, block, dynamic_bytes, [&] { k(args...); });
}
}  // namespace emu
