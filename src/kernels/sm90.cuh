// The sm_90a (Hopper) instructions our hand-written kernels share, one small
// helper each: shared-memory addresses, mbarriers, TMA copies in and out,
// proxy fences and named barriers, wgmma's fences, products and its K-major
// shared-memory descriptor, stmatrix, the approximate math. Device code only;
// a kernel file includes it and says `using namespace sm90;` in its own
// anonymous namespace. Every inline asm of the kernels lives here: the CPU
// emulator (tools/kernel_emu) swaps this header for host versions of these
// helpers, so a new instruction is a new helper here and its host version in
// tools/kernel_emu/sm90_emu.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Spins until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// A box of the tensor map at (c0 = column, c1 = row) into shared memory; the
// barrier counts its bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// A 64 x 64 box from shared memory into the tensor map at (c0, c1); the
// bulk group lets the issuing thread wait until the box has been read.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// A box of a 3-D tensor map (c0 = column, c1 = token, c2 = sample) into
// shared memory; the barrier counts its bytes, rows past the map's token
// count included (TMA fills them with zeros).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// A box from shared memory into a 3-D tensor map at (c0, c1, c2); rows past
// the map's token count are not written. One bulk group per call.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's bulk stores still read shared memory.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Makes this thread's shared-memory writes visible to the TMA (async proxy).
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// This thread's warpgroup, threadIdx.x / 128, broadcast from lane 0: the compiler then knows it is the same
// in every lane and keeps it, and what derives from it (stage offsets, descriptors), in uniform registers.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0); }

// A barrier for the 128 threads of one consumer warpgroup (ids 1, 2; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// wgmma's shared-memory operand: K-major rows of 128 bytes in the 128-byte
// swizzle TMA wrote them in, 8-row groups 1024 bytes apart (SBO); the
// leading offset is unused for this layout. Bits: start address >> 4 in
// 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, layout 1 (128-byte swizzle)
// in 62-63. Adding 2 to it moves 32 bytes, 16 elements of K, along the row.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// wgmma's shared-memory B operand stored MN-major (row = K index, 64
// contiguous N values in one 128-byte swizzled row, as TMA writes a 64 x 64
// box of a row-major [K, N] matrix), N spanning 64-column atoms `atom_bytes`
// apart (LBO), 8-row groups along K 1024 bytes apart (SBO), 128-byte swizzle.
// Adding 128 to it moves 16 rows of K (2048 bytes).
__device__ __forceinline__ uint64_t smem_desc_mn_atoms(const void* p, uint32_t atom_bytes) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((atom_bytes >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous products.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulators as asm operands of a wgmma wrapper whose accumulator
// array is named d, 16 at a time (d[i] ... d[i + 15]).
#define PERFTRAIN_SM90_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define PERFTRAIN_SM90_ACC16(i) \
  PERFTRAIN_SM90_ACC4(i), PERFTRAIN_SM90_ACC4(i + 4), PERFTRAIN_SM90_ACC4(i + 8), PERFTRAIN_SM90_ACC4(i + 12)

// d (64 x 64) = A B^T (+ d), both from shared memory, A K-major; B K-major
// too, or MN-major (transposed) with TransB = 1.
template <int TransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

// d (64 x 64) = A B^T (+ d), A (64 x 16) from registers in the accumulator
// layout's k16 fragment, B from shared memory K-major (TransB = 0), or
// MN-major (TransB = 1: d = A B). The two forms by name below.
template <int TransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs_layout(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                          int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

// d (64 x 8) = A B (+ d), A from registers, B MN-major (the tails of dV, dK).
__device__ __forceinline__ void wgmma_m64n8k16_rs_tb(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b,
                                                     int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// d (64 x 8) = A B (+ d), A K-major and B MN-major in shared memory (dQ's tail).
__device__ __forceinline__ void wgmma_m64n8k16_ss_tb(float (&d)[4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// The 128 accumulators of an m64n256 product as asm operands.
#define PERFTRAIN_ATTN_ACC128                                                                                   \
  PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16), PERFTRAIN_SM90_ACC16(32), PERFTRAIN_SM90_ACC16(48),        \
      PERFTRAIN_SM90_ACC16(64), PERFTRAIN_SM90_ACC16(80), PERFTRAIN_SM90_ACC16(96), PERFTRAIN_SM90_ACC16(112)
#define PERFTRAIN_ATTN_REGS128                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "  \
  "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "  \
  "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "  \
  "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// d (64 x 256) = A B^T (+ d), both K-major in shared memory (the forward's S = Q K^T).
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " PERFTRAIN_ATTN_REGS128
               ", %128, %129, p, 1, 1, 0, 0;\n}\n"
               : PERFTRAIN_ATTN_ACC128
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d (64 x 256) = A B^T (+ d), A from registers, B K-major (the forward's tail step of S).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                    int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " PERFTRAIN_ATTN_REGS128
               ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
               : PERFTRAIN_ATTN_ACC128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// 2^x on the special-function unit; flushing denormal results to zero costs
// nothing here (a probability below 2^-126 is zero in bf16 anyway).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four 8 x 8 bf16 matrices of mma fragments stored transposed: lane L gives
// the address of row L % 8 of matrix L / 8 of the result.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// A 256-thread barrier of the CTA's two warpgroups (id 1; 0 is __syncthreads,
// 2 and 3 are the warpgroups' own).
__device__ __forceinline__ void cta_barrier() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// Makes thread 0's mbarrier inits visible before the block's first barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// 1D bulk copy of `bytes` (a multiple of 16) from global into shared memory;
// the barrier counts them.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// 8 bytes of shared memory at an 8-byte-aligned address.
__device__ __forceinline__ uint2 ld_shared_v2_u32(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// 16 bytes of shared memory at a 16-byte-aligned address.
__device__ __forceinline__ uint4 ld_shared_v4_u32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// A warpgroup's register budget: a producer gives registers up (dec), the
// consumers take them (inc).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The 64 accumulators of an m64n128 product as asm operands.
#define PERFTRAIN_SM90_ACC64 \
  PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16), PERFTRAIN_SM90_ACC16(32), PERFTRAIN_SM90_ACC16(48)
#define PERFTRAIN_SM90_REGS64                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x 128 per call, fp32) = A (64 x 16) B^T (16 x 128) + (scale_d ? d : 0),
// both in shared memory, A K-major; B K-major too (the tiled attention
// forward's S = Q K^T over a 128-key tile, fc1's product), or MN-major
// (transposed, smem_desc_mn_atoms) with TransB = 1: d = A B (fc2's backward
// product through GELU, gemm_dgelu_sm90).
template <int TransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PERFTRAIN_SM90_REGS64
               ", %64, %65, p, 1, 1, 0, %67;\n}\n"
               : PERFTRAIN_SM90_ACC64
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

// The same with A from registers, B K-major (the tiled forward's tail step of S at head dim 72).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                    int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PERFTRAIN_SM90_REGS64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
               : PERFTRAIN_SM90_ACC64
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace perftrain::kernels::sm90
