#include "kernels/gemm_bias_gelu_sm90.h"

#include <cuda.h>  // CUtensorMap and its enums (the encoder comes through the runtime)

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"

namespace perftrain::kernels {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBN = 256, kBK = 64;  // CTA tile; 64 bf16 of K = one 128-byte swizzled row
constexpr int kThreads = 384;                   // warpgroup 0 (producer + store warps), two consumer warpgroups
constexpr int kConsumerWarps = 8, kConsumerThreads = 256;
constexpr int kStoreThreads = 96;  // warps 1-3: the epilogue's second half
constexpr uint32_t kATileBytes = kBM * kBK * 2, kWTileBytes = kBN * kBK * 2;
// The consumers hand each finished tile over in shared memory: 8 chunks of
// 64 rows x 64 columns (bf16, 128-byte swizzle, as the TMA stores read
// them), chunk 4 h + jc holding rows 64 h.. and columns 64 jc.. of the tile.
constexpr int kChunkCols = 64, kTileChunks = 8;
constexpr uint32_t kChunkBytes = 64 * kChunkCols * 2, kTileBytes = kTileChunks * kChunkBytes;

// Shared memory: the ring of Stages (A and W tiles), the handed-over tile,
// the store warps' column sums (DGELU's bias gradient), then the barriers
// (full and empty per stage; dumped and drained for the tile); 1024 bytes
// of slack to align the start.
template <int Stages>
struct SmemLayout {
  static constexpr uint32_t kRing = Stages * (kATileBytes + kWTileBytes);
  static constexpr uint32_t kScratch = (kStoreThreads / 32) * kBN * sizeof(float);
  static constexpr size_t kTotal = kRing + kTileBytes + kScratch + (2 * Stages + 2) * sizeof(uint64_t) + 1024;
  static_assert(kTotal <= 227 * 1024, "more shared memory than an H100/H200 block may have");
};

// ---- the sm_90a instructions, one helper each ----

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

// A barrier for the store warps alone (id 1; 0 is __syncthreads).
__device__ __forceinline__ void store_warps_barrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kStoreThreads) : "memory");
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
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

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous products.
__device__ __forceinline__ void fence_accumulators(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 256 per warpgroup, fp32) = A (64 x 16) B^T (16 x 256) + (scale_d ? d : 0).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The tanh form, as cuBLASLt's GELU epilogue and ATen's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanh_approx(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// GELU's derivative in the same tanh form, as cuBLASLt's DGELU epilogue.
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const float t = tanh_approx(k0 * (x + k1 * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k0 * (1.f + 3.f * k1 * x * x);
}

__device__ __forceinline__ float2 bias_pair(const float* b) { return __ldg(reinterpret_cast<const float2*>(b)); }
__device__ __forceinline__ float2 bias_pair(const bf16* b) {
  return __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(b)));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float v0, float v1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// What the store warps need to finish a tile: the handed-over buffer, the
// tile's place, and which of the 96 they are. Thread ht owns the 16-byte
// unit jj = ht % 8 (8 columns) of rows r0 = ht / 8, r0 + 12, ... of each
// chunk: a warp's 32 lanes read 4 whole rows of the buffer (4 shared-memory
// wavefronts, the least for 512 bytes) and write 4 whole 128-byte row
// segments of an output, and a thread's columns stay fixed (DGELU keeps their
// sums in registers).
constexpr int kRowGroups = kStoreThreads / 8;                             // 12
constexpr int kRowsPerThread = (64 + kRowGroups - 1) / kRowGroups;       // 6 (the last one for some)
struct TileContext {
  uint32_t buf;  // the tile buffer (shared-memory address)
  int m0, n0;    // the tile's first row and column
  int64_t n;     // the outputs' row length
  int ht;        // 0..95
  __device__ __forceinline__ int jj() const { return ht % 8; }
  __device__ __forceinline__ int row(int i) const { return ht / 8 + kRowGroups * i; }  // in a chunk: < 64?
  // The thread's unit of row r of chunk c: in the buffer (16-byte unit jj of
  // row r sits at unit jj ^ (r % 8), TMA's 128-byte swizzle), and its offset
  // in an [m, n] output.
  __device__ __forceinline__ uint32_t in_buf(int c, int r) const {
    return buf + c * kChunkBytes + r * 128 + ((jj() ^ (r & 7)) << 4);
  }
  __device__ __forceinline__ int64_t in_out(int c, int r) const {
    return int64_t(m0 + 64 * (c / 4) + r) * n + n0 + kChunkCols * (c % 4) + 8 * jj();
  }
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// The epilogues come in two halves. The consumers' (hand_over) turns the
// accumulators into one bf16 matrix in the tile buffer: in the layout of
// wgmma m64nNk16 a consumer thread holds rows `row` and row + 8 (h = 0, 1),
// columns col + 8j and the next (j = 0..31) in d[4j + 2h] and d[4j + 2h + 1];
// per 64-column chunk jc, load() fetches what the chunk's values need first.
// The store warps' (finish) reads the buffer, computes, and writes the
// outputs with 16-byte stores while the consumers run the next tile's
// products: the epilogue's arithmetic and stores no longer hold the tensor
// cores (they took 31-47% of fc1's time when the consumers did it all,
// docs/PERFORMANCE.md). finish() returns once it has read the whole buffer.

// fc1. Hand-over: pre = acc + b. Finish: pre written as it is, and
// act = gelu_tanh(pre) from the bf16 pre (as PyTorch's autocast computes
// gelu from the rounded linear output).
template <typename TB>
struct BiasGeluEpilogue {
  static constexpr int kStages = 3;
  const TB* bias;
  bf16* pre;
  bf16* act;
  struct Chunk {
    float2 b[8];
  };
  __device__ __forceinline__ Chunk load(int col, int jc) const {
    Chunk c;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) c.b[jj] = bias_pair(bias + col + 8 * (8 * jc + jj));
    return c;
  }
  __device__ __forceinline__ uint32_t hand_over(const Chunk& c, int jj, float v0, float v1) const {
    return pack_bf16x2(v0 + c.b[jj].x, v1 + c.b[jj].y);
  }

  static __device__ __forceinline__ uint32_t gelu_pair(uint32_t w) {
#if PERFTRAIN_GEMM_SM90_PROBE == 2  // timing probe: the epilogue's traffic without GELU's arithmetic
    return pack_bf16x2(0.5f * bf16_lo(w), 0.5f * bf16_hi(w));
#else
    return pack_bf16x2(gelu_tanh(bf16_lo(w)), gelu_tanh(bf16_hi(w)));
#endif
  }

  __device__ __forceinline__ void finish(const TileContext& t, float*) const {
#pragma unroll 2
    for (int c = 0; c < kTileChunks; ++c) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = t.row(i);
        if (r < 64) {
          const uint4 v = ld_shared_v4(t.in_buf(c, r));
          const int64_t at = t.in_out(c, r);
          *reinterpret_cast<uint4*>(pre + at) = v;
          *reinterpret_cast<uint4*>(act + at) =
              make_uint4(gelu_pair(v.x), gelu_pair(v.y), gelu_pair(v.z), gelu_pair(v.w));
        }
      }
    }
  }
};

// fc2's input gradient through GELU. Hand-over: the product dy w2 (rounded
// to bf16). Finish: dpre = product * gelu_tanh'(pre), pre read from global
// memory two chunks ahead; with bias_grad_partials, the tile's column sums
// of dpre (fp32, before rounding) go to its row: partials[m0 / 128, n0 ..
// n0 + 255].
struct DGeluEpilogue {
  static constexpr int kStages = 3;
  const bf16* pre;
  bf16* dpre;
  float* bias_grad_partials;  // [m / 128, n] or null
  struct Chunk {};
  __device__ __forceinline__ Chunk load(int, int) const { return {}; }
  __device__ __forceinline__ uint32_t hand_over(const Chunk&, int, float v0, float v1) const {
    return pack_bf16x2(v0, v1);
  }

  static __device__ __forceinline__ uint32_t dgelu_pair(uint32_t prod, uint32_t p, float& s0, float& s1) {
    const float v0 = bf16_lo(prod) * gelu_tanh_grad(bf16_lo(p)), v1 = bf16_hi(prod) * gelu_tanh_grad(bf16_hi(p));
    s0 += v0;
    s1 += v1;
    return pack_bf16x2(v0, v1);
  }

  __device__ __forceinline__ void load_pre(const TileContext& t, int c, uint4 (&p)[kRowsPerThread]) const {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
      if (t.row(i) < 64) p[i] = __ldg(reinterpret_cast<const uint4*>(pre + t.in_out(c, t.row(i))));
  }

  __device__ __forceinline__ void finish(const TileContext& t, float* scratch) const {
    float sums[4][8] = {};
    uint4 p[3][kRowsPerThread];  // pre for chunks c, c + 1, c + 2
    load_pre(t, 0, p[0]);
    load_pre(t, 1, p[1]);
#pragma unroll
    for (int c = 0; c < kTileChunks; ++c) {
      if (c + 2 < kTileChunks) load_pre(t, c + 2, p[(c + 2) % 3]);
      float(&s)[8] = sums[c % 4];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = t.row(i);
        if (r < 64) {
          const uint4 a = ld_shared_v4(t.in_buf(c, r)), q = p[c % 3][i];
          *reinterpret_cast<uint4*>(dpre + t.in_out(c, r)) =
              make_uint4(dgelu_pair(a.x, q.x, s[0], s[1]), dgelu_pair(a.y, q.y, s[2], s[3]),
                         dgelu_pair(a.z, q.z, s[4], s[5]), dgelu_pair(a.w, q.w, s[6], s[7]));
        }
      }
    }
    if (bias_grad_partials == nullptr) return;
    // The 12 threads of a column unit: 4 lanes of each store warp (lane,
    // lane ^ 8, ^ 16, ^ 24), then the 3 warps through shared memory, in a
    // fixed order.
    const int lane = t.ht % 32, w = t.ht / 32;
#pragma unroll
    for (int jc = 0; jc < 4; ++jc) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float v = sums[jc][e];
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 8) scratch[w * kBN + kChunkCols * jc + 8 * t.jj() + e] = v;
      }
    }
    store_warps_barrier();
    float* row = bias_grad_partials + int64_t(t.m0 / kBM) * t.n + t.n0;
    for (int col = t.ht; col < kBN; col += kStoreThreads)
      row[col] = scratch[col] + scratch[kBN + col] + scratch[2 * kBN + col];
    store_warps_barrier();  // the scratch is free for the next tile
  }
};

// out = epilogue(A W^T), 128 x 256 tiles (see the header).
// Persistent: each CTA takes tiles blockIdx.x, + gridDim.x, ... (consecutive
// tiles run along N, so the CTAs at work share A's rows; W fits in L2). The
// ring's stage and phase run on across tiles, so the producer loads the next
// tile's first stages while the consumers hand this one over, and the store
// warps finish it during the next tile's products.
template <typename Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_w,
                     const Epilogue epilogue, int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = Epilogue::kStages;
  using Layout = SmemLayout<kStages>;
  extern __shared__ unsigned char smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes: tiles start on a multiple.
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* sa = reinterpret_cast<bf16*>(smem);
  bf16* sw = reinterpret_cast<bf16*>(smem + kStages * kATileBytes);
  unsigned char* tile_buf = smem + Layout::kRing;
  float* scratch = reinterpret_cast<float*>(tile_buf + kTileBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(tile_buf + kTileBytes + Layout::kScratch);
  uint64_t* empty = full + kStages;
  uint64_t* dumped = empty + kStages;  // the consumers have handed the tile over
  uint64_t* drained = dumped + 1;      // the store warps are done with the buffer
  const int wg = threadIdx.x / 128;
  const int tiles_n = n / kBN, tiles = (m / kBM) * tiles_n;
  const int kblocks = k / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive, plus the TMA bytes
      mbar_init(&empty[s], kConsumerWarps);  // one arrive per consumer warp
    }
    mbar_init(dumped, kConsumerThreads);
    mbar_init(drained, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    if (threadIdx.x == 0) {  // the producer: one thread issues every copy
      int it = 0;            // k-steps issued, over all tiles
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = (tile % tiles_n) * kBN, m0 = (tile / tiles_n) * kBM;
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
          mbar_arrive_expect_tx(&full[s], kATileBytes + kWTileBytes);
          tma_load_2d(sa + s * kBM * kBK, &tma_a, &full[s], kb * kBK, m0);
          tma_load_2d(sw + s * kBN * kBK, &tma_w, &full[s], kb * kBK, n0);
        }
      }
    } else if (threadIdx.x >= 32) {  // the store warps
#if PERFTRAIN_GEMM_SM90_PROBE == 1
      return;
#endif
      TileContext t{smem_u32(tile_buf), 0, 0, n, int(threadIdx.x) - 32};
      int done = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++done) {
        t.n0 = (tile % tiles_n) * kBN;
        t.m0 = (tile / tiles_n) * kBM;
        mbar_wait(dumped, done & 1);
#if PERFTRAIN_GEMM_SM90_PROBE != 3  // timing probe 3: the hand-over alone
        epilogue.finish(t, scratch);
#endif
        store_warps_barrier();  // all 96 have read the buffer
        if (t.ht == 0) mbar_arrive(drained);
      }
    }
    return;
  }

  const int c = wg - 1;  // this warpgroup's 64 rows of each tile
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x & 31;
  // Not cleared: each tile's first product takes scale_d = 0 (d = A B^T).
  // Clearing them would put non-wgmma writes of the accumulators in the
  // pipeline, and ptxas then serialises the products (its warning C7515).
  float d[128];
  int it = 0;  // k-steps consumed, over all tiles
  int done = 0;
  const uint32_t my_chunks = smem_u32(tile_buf) + 4 * c * kChunkBytes;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++done) {
    const int n0 = (tile % tiles_n) * kBN;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint64_t da = smem_desc(sa + s * kBM * kBK + c * 64 * kBK);
      const uint64_t dw = smem_desc(sw + s * kBN * kBK);
      fence_accumulators(d);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        wgmma_m64n256k16(d, da + 2 * kk, dw + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
      wgmma_commit();
      if (kb > 0) {  // the previous step's products are done: its stage may be refilled
        wgmma_wait<1>();
        fence_accumulators(d);
        if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
    }
    const int col = n0 + 2 * (lane & 3);
    typename Epilogue::Chunk next = epilogue.load(col, 0);  // while the last products run
    wgmma_wait<0>();
    fence_accumulators(d);
    if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);  // the tile's last stage
#if PERFTRAIN_GEMM_SM90_PROBE == 1  // timing probe (tools/gpu_run.sh MODE=gemm-check PROBES=1): no epilogue
    if (d[0] == 1234.5f) st_shared_u32(my_chunks, 1);  // the products' results stay live
    continue;
#endif
    // The hand-over: each thread writes its pairs into the buffer's chunks,
    // 16-byte unit jj of row r at unit jj ^ (r % 8), as TMA's 128-byte
    // swizzle reads it back (the 32 lanes of a warp then hit 32 different
    // banks), once the store warps are done with the last tile.
    mbar_wait(drained, (done & 1) ^ 1);
#pragma unroll
    for (int jc = 0; jc < kBN / kChunkCols; ++jc) {
      const typename Epilogue::Chunk loaded = next;
      if (jc + 1 < kBN / kChunkCols) next = epilogue.load(col, jc + 1);
      const uint32_t buf = my_chunks + jc * kChunkBytes;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * 16 + lane / 4 + 8 * h;  // row within the warpgroup's 64
          const int q = 4 * (8 * jc + jj) + 2 * h;
          st_shared_u32(buf + r * 128 + ((jj ^ (r & 7)) << 4) + 4 * (lane & 3),
                        epilogue.hand_over(loaded, jj, d[q], d[q + 1]));
        }
      }
    }
    mbar_arrive(dumped);
  }
#else
  __trap();  // built for an architecture without wgmma: the host refuses to launch first
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link to libcuda).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    PERFTRAIN_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("gemm_bias_gelu_sm90: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A [rows, cols] bf16 row-major matrix in boxes of box_rows x 64 columns
// (128 bytes: the swizzle's row), for loads into the ring.
CUtensorMap tensor_map(const bf16* base, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};  // innermost first
  const cuuint64_t strides[1] = {cuuint64_t(cols) * sizeof(bf16)};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims,
                                    strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("gemm_bias_gelu_sm90: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) +
                             ")");
  return map;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k) {
  // The tile index is an int: (m / 128) * (n / 256) must fit.
  return m > 0 && n > 0 && k > 0 && m % kBM == 0 && n % kBN == 0 && k % kBK == 0 && m <= INT32_MAX &&
         n <= INT32_MAX && k <= INT32_MAX && (m / kBM) * (n / kBN) <= INT32_MAX;
}

namespace {

template <typename Epilogue>
void launch_gemm_sm90(const char* what, const bf16* a, const bf16* w, const Epilogue& epilogue,
                      std::initializer_list<const void*> matrices, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream) {
  if (!gemm_bias_gelu_sm90_supported(m, n, k))
    throw std::invalid_argument(std::string(what) + ": unsupported shape m=" + std::to_string(m) + " n=" +
                                std::to_string(n) + " k=" + std::to_string(k) + " (needs m % 128, n % 256, k % 64 == 0)");
  bool aligned = aligned16(a) && aligned16(w);
  for (const void* p : matrices) aligned = aligned && p != nullptr && aligned16(p);
  if (!aligned) throw std::invalid_argument(std::string(what) + ": a, w and the [m, n] matrices must be 16-byte aligned");
  int device = 0, major = 0, minor = 0, sms = 0;
  PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) throw std::invalid_argument(std::string(what) + ": needs an sm_90 GPU");
  const CUtensorMap map_a = tensor_map(a, m, k, kBM), map_w = tensor_map(w, n, k, kBN);
  // The attribute belongs to the function on one device: set it once per
  // device (bit d of the mask), so that a second GPU in the process gets it too.
  static std::atomic<uint64_t> attribute_set_on{0};
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || (attribute_set_on.load(std::memory_order_acquire) & bit) == 0) {
    PERFTRAIN_CUDA_CHECK(cudaFuncSetAttribute(gemm_sm90_kernel<Epilogue>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              int(SmemLayout<Epilogue::kStages>::kTotal)));
    attribute_set_on.fetch_or(bit, std::memory_order_release);
  }
  // One CTA per SM (the ring takes most of its shared memory), each looping over tiles.
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (m / kBM) * (n / kBN);
  const unsigned grid = unsigned(std::min<int64_t>(tiles, std::max(sms, 1)));
  gemm_sm90_kernel<Epilogue><<<grid, kThreads, SmemLayout<Epilogue::kStages>::kTotal, stream>>>(
      map_a, map_w, epilogue, int(m), int(n), int(k));
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace

template <typename TB>
void gemm_bias_gelu_sm90(const bf16* a, const bf16* w, const TB* bias, bf16* pre, bf16* act, int64_t m, int64_t n,
                         int64_t k, cudaStream_t stream) {
  static_assert(std::is_same_v<TB, float> || std::is_same_v<TB, bf16>, "bias: float or bf16");
  if (bias == nullptr || reinterpret_cast<uintptr_t>(bias) % (2 * sizeof(TB)) != 0)
    throw std::invalid_argument("gemm_bias_gelu_sm90: bias must be given, aligned to two elements");
  launch_gemm_sm90("gemm_bias_gelu_sm90", a, w, BiasGeluEpilogue<TB>{bias, pre, act}, {pre, act}, m, n, k, stream);
}

void gemm_dgelu_sm90(const bf16* a, const bf16* w, const bf16* pre, bf16* dpre, float* bias_grad_partials,
                     int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (bias_grad_partials != nullptr && reinterpret_cast<uintptr_t>(bias_grad_partials) % 4 != 0)
    throw std::invalid_argument("gemm_dgelu_sm90: bias_grad_partials must be float-aligned");
  launch_gemm_sm90("gemm_dgelu_sm90", a, w, DGeluEpilogue{pre, dpre, bias_grad_partials}, {pre, dpre}, m, n, k,
                   stream);
}

template void gemm_bias_gelu_sm90<float>(const bf16*, const bf16*, const float*, bf16*, bf16*, int64_t, int64_t,
                                         int64_t, cudaStream_t);
template void gemm_bias_gelu_sm90<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, int64_t, int64_t,
                                        int64_t, cudaStream_t);

}  // namespace perftrain::kernels
