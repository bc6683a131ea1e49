// The host version of src/kernels/sm90.cuh (run.sh puts it in that header's place): every
// wrapper of an sm_90a instruction with the same name and signature, done by sm90_emu.cpp
// on the emulated block (README.md says what is and is not emulated). Shared addresses are
// offsets into the block's shared window (emu::smem_window_base()).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "race.h"

namespace emu::sm90 {
uint32_t smem_addr(const void* p);
void mbar_init(uint32_t bar, uint32_t count);
void mbar_arrive(uint32_t bar, uint32_t expect_tx_bytes);
void mbar_wait(uint32_t bar, uint32_t parity);
void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, const int* coords, int rank);
void tma_store(const CUtensorMap* map, uint32_t src, const int* coords, int rank);
void bulk_commit();
void bulk_wait_read(int pending);
void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar);
void load_shared(uint32_t addr, void* to, int bytes);
void store_shared(uint32_t addr, const void* from, int bytes);
// One wgmma m64nNk16 bf16 -> f32: A from registers (a, the thread's 4) or shared memory
// (desc_a), B from shared memory. Queued; done at the wgmma_wait that retires its group.
void wgmma(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int trans_a, int trans_b,
           int scale_d);
void wgmma_commit();
void wgmma_wait(int pending);
void stmatrix_x4(uint32_t addr, const uint32_t* r, bool trans);
void ldmatrix_x4(uint32_t addr, uint32_t* r, bool trans);
void fence_proxy_async();
float ex2_approx_ftz(float x);
float tanh_approx(float x);
}  // namespace emu::sm90

// Each wrapper that reaches shared memory or orders it says where it is called from (its
// caller's file and line, for the race detector's message: race.h).
#define EMU_SITE const char *emu_file = __builtin_FILE(), int emu_line = __builtin_LINE()
#define EMU_AT emu::race::set_site(emu_file, emu_line)

namespace perftrain::kernels::sm90 {

inline uint32_t smem_u32(const void* p) { return emu::sm90::smem_addr(p); }
inline void mbar_init(uint64_t* bar, uint32_t count) { emu::sm90::mbar_init(smem_u32(bar), count); }
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes, EMU_SITE) { EMU_AT; emu::sm90::mbar_arrive(smem_u32(bar), bytes); }
inline void mbar_arrive(uint64_t* bar, EMU_SITE) { EMU_AT; emu::sm90::mbar_arrive(smem_u32(bar), 0); }
inline void mbar_wait(uint64_t* bar, uint32_t parity, EMU_SITE) { EMU_AT; emu::sm90::mbar_wait(smem_u32(bar), parity); }
inline void fence_mbarrier_init() {}

inline void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, EMU_SITE) {
  EMU_AT;
  const int c[2] = {c0, c1};
  emu::sm90::tma_load(smem_u32(dst), map, smem_u32(bar), c, 2);
}
inline void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1, EMU_SITE) {
  EMU_AT;
  const int c[2] = {c0, c1};
  emu::sm90::tma_store(map, smem_u32(src), c, 2);
  emu::sm90::bulk_commit();
}
inline void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, EMU_SITE) {
  EMU_AT;
  const int c[3] = {c0, c1, c2};
  emu::sm90::tma_load(smem_u32(dst), map, smem_u32(bar), c, 3);
}
inline void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, EMU_SITE) {
  EMU_AT;
  const int c[3] = {c0, c1, c2};
  emu::sm90::tma_store(map, smem_u32(src), c, 3);
  emu::sm90::bulk_commit();
}
template <int N>
inline void tma_store_wait_read(EMU_SITE) { EMU_AT; emu::sm90::bulk_wait_read(N); }
inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, EMU_SITE) {
  EMU_AT;
  emu::sm90::bulk_load(smem_u32(dst), src, bytes, smem_u32(bar));
}

// The async proxy (TMA stores, wgmma) may read what a thread wrote through st.shared or
// stmatrix only after that thread's fence (sm90_emu.cpp checks it).
inline void fence_async_shared() { emu::sm90::fence_proxy_async(); }
inline int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0); }
inline void warpgroup_barrier(int id, EMU_SITE) { EMU_AT; emu::barrier(id, 128); }
inline void cta_barrier(EMU_SITE) { EMU_AT; emu::barrier(1, 256); }
template <int N>
inline void setmaxnreg_dec() {}
template <int N>
inline void setmaxnreg_inc() {}

inline uint32_t ld_shared_u32(uint32_t addr, EMU_SITE) {
  EMU_AT;
  uint32_t v;
  emu::sm90::load_shared(addr, &v, 4);
  return v;
}
inline void st_shared_u32(uint32_t addr, uint32_t v, EMU_SITE) { EMU_AT; emu::sm90::store_shared(addr, &v, 4); }
inline uint2 ld_shared_v2_u32(uint32_t addr, EMU_SITE) {
  EMU_AT;
  uint2 v;
  emu::sm90::load_shared(addr, &v, 8);
  return v;
}
inline uint4 ld_shared_v4_u32(uint32_t addr, EMU_SITE) {
  EMU_AT;
  uint4 v;
  emu::sm90::load_shared(addr, &v, 16);
  return v;
}

// As kernels/sm90.cuh: K-major, 128-byte swizzle, SBO 1024.
inline uint64_t smem_desc(const void* p) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// As kernels/sm90.cuh: B MN-major, 128-byte swizzle, LBO the atoms' stride along N, SBO 1024.
inline uint64_t smem_desc_mn_atoms(const void* p, uint32_t atom_bytes) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((atom_bytes >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

inline void wgmma_fence() {}
inline void wgmma_commit(EMU_SITE) { EMU_AT; emu::sm90::wgmma_commit(); }
template <int N>
inline void wgmma_wait(EMU_SITE) { EMU_AT; emu::sm90::wgmma_wait(N); }
template <int N>
inline void fence_accumulators(float (&)[N]) {}

template <int TransB>
inline void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(64, d, nullptr, desc_a, desc_b, 0, TransB, scale_d);
}
template <int TransB>
inline void wgmma_m64n64k16_rs_layout(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(64, d, a, 0, desc_b, 0, TransB, scale_d);
}
inline void wgmma_m64n8k16_rs_tb(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(8, d, a, 0, desc_b, 0, 1, scale_d);
}
inline void wgmma_m64n8k16_ss_tb(float (&d)[4], uint64_t desc_a, uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(8, d, nullptr, desc_a, desc_b, 0, 1, scale_d);
}
inline void wgmma_m64n256k16_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(256, d, nullptr, desc_a, desc_b, 0, 0, scale_d);
}
inline void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(256, d, a, 0, desc_b, 0, 0, scale_d);
}
template <int TransB = 0>
inline void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(128, d, nullptr, desc_a, desc_b, 0, TransB, scale_d);
}
inline void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d, EMU_SITE) {
  EMU_AT;
  emu::sm90::wgmma(128, d, a, 0, desc_b, 0, 0, scale_d);
}

inline float exp2_approx(float x) { return emu::sm90::ex2_approx_ftz(x); }
inline float tanh_approx(float x) { return emu::sm90::tanh_approx(x); }
inline void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4], EMU_SITE) { EMU_AT; emu::sm90::stmatrix_x4(addr, r, true); }

}  // namespace perftrain::kernels::sm90
