// How fast an H200 takes the writes of fc1's epilogue with no product
// around them: the upper bound for our fc1 product (kernels/
// gemm_bias_gelu_sm90), which writes two bf16 [65536, 3072] outputs (805 MB at
// DiT-B/2 b256) at about 1.55 TB/s however its epilogue is arranged.
// Torch-free. The same bytes are written
//   memset    by cudaMemsetAsync (the driver's own rate)
//   stream    by 16-byte stores, each warp 512 contiguous bytes, grid-stride
//   tiles     by one persistent CTA per SM walking 128 x 256 tiles along N
//             in fc1's order, each warp writing whole 512-byte tile rows of
//             both outputs
//   tiles+A   the same while each CTA also reads its tile's 128 x 768 rows
//             of A, as the product's main loop streams them
// into memory from cudaMalloc and from cuMemCreate with compression off and,
// where the GPU offers it, on (the L2's compression unit sees every sector
// fc1 writes); then, on cudaMalloc memory, the tile pattern on a quarter and
// a half of the SMs (a limit per SM, or of the GPU?) and fc1's rhythm
// without the product (rhythm_tiles: spin for the main loop's time, then
// write the tile; CTAs started in waves or not). The values differ
// everywhere, so that no compressor finds runs. GB/s of bytes written: the
// median of 7 windows of 20 launches after 5 warm-up launches, CUDA events.
// Build: cmake --build build --target write_bandwidth_check (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=write_bandwidth_check (~20 s).
#include <cuda.h>  // CUmemAllocationProp and friends (the entry points come through the runtime)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check_util.h"

constexpr int kRows = 65536, kCols = 3072, kDepth = 768;  // DiT-B/2 b256's fc1: m, n, k
constexpr size_t kOutputBytes = size_t(kRows) * kCols * 2, kABytes = size_t(kRows) * kDepth * 2;

// A value that depends on where it goes (a 64-bit mix).
__device__ __forceinline__ uint32_t mix(uint64_t i) {
  i ^= i >> 33;
  i *= 0xff51afd7ed558ccdull;
  i ^= i >> 33;
  return uint32_t(i);
}

__global__ void stream_writes(uint4* out, size_t units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < units; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t v = mix(i);
    out[i] = make_uint4(v, ~v, v * 3u, v ^ 0x55555555u);
  }
}

// fc1's epilogue pattern (kernels/gemm_bias_gelu_sm90): tile t of
// (m / 128) x (n / 256) at n0 = 256 (t % tiles_n), m0 = 128 (t / tiles_n);
// 8 warps, warp w writing rows w, w + 8, ... of the tile in both outputs.
__global__ void tile_writes(uint4* out0, uint4* out1, const uint4* a, int m, int n, int k) {
  const int tiles_n = n / 256, tiles = (m / 128) * tiles_n;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int a_units = k / 8;  // 16-byte units in a row of A
  uint32_t acc = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int n0 = (tile % tiles_n) * 256, m0 = (tile / tiles_n) * 128;
    if (a != nullptr)
      for (int u = threadIdx.x; u < 128 * a_units; u += blockDim.x) {
        const uint4 v = __ldg(a + size_t(m0 + u / a_units) * a_units + u % a_units);
        acc ^= v.x ^ v.w;
      }
    for (int r = warp; r < 128; r += 8) {
      const size_t at = (size_t(m0 + r) * n + n0) / 8 + lane;
      const uint32_t v = mix(at);
      out0[at] = make_uint4(v, ~v, v * 3u, v ^ 0x55555555u);
      out1[at] = make_uint4(~v, v, v * 5u, v ^ 0x33333333u);
    }
  }
  if (acc == 0x9e3779b9u) out0[0] = make_uint4(acc, 0, 0, 0);  // the reads stay
}

// fc1's rhythm with no product: per tile, spin `work_ns` (the main loop's
// time), then write the tile as tile_writes does. CTA b first waits
// (b % 4) * stagger_ns, so that with a stagger the bursts of writes of
// different SMs fall at different times.
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void rhythm_tiles(uint4* out0, uint4* out1, int m, int n, int work_ns, int stagger_ns) {
  const int tiles_n = n / 256, tiles = (m / 128) * tiles_n;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (const uint64_t until = global_ns() + uint64_t(blockIdx.x % 4) * stagger_ns; global_ns() < until;) {
  }
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int n0 = (tile % tiles_n) * 256, m0 = (tile / tiles_n) * 128;
    __syncthreads();
    for (const uint64_t until = global_ns() + work_ns; global_ns() < until;) {
    }
    for (int r = warp; r < 128; r += 8) {
      const size_t at = (size_t(m0 + r) * n + n0) / 8 + lane;
      const uint32_t v = mix(at);
      out0[at] = make_uint4(v, ~v, v * 3u, v ^ 0x55555555u);
      out1[at] = make_uint4(~v, v, v * 5u, v ^ 0x33333333u);
    }
  }
}

// GB/s of `bytes` written per launch, from check_util.h's median launch
// time; NaN on a CUDA error (printed there), so that no rate is made up.
template <typename Launch>
double gbps(size_t bytes, Launch launch) {
  double ms = 0;
  if (median_launch_ms(launch, &ms) != 0) return std::nan("");
  return bytes / (ms * 1e-3) * 1e-9;
}

template <typename F>
F driver_entry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(p);
}

// One buffer of device memory: from cudaMalloc (compression < 0) or from
// cuMemCreate with CU_MEM_ALLOCATION_COMP_NONE (0) or _GENERIC (1).
struct Buffer {
  void* ptr = nullptr;
  size_t size = 0;
  int compression = -1;
  CUmemGenericAllocationHandle handle = 0;
};

bool allocate(Buffer& b, size_t bytes, int compression, int device) {
  b.compression = compression;
  if (compression < 0) {
    b.size = bytes;
    return cudaMalloc(&b.ptr, bytes) == cudaSuccess;
  }
  using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  static const auto granularity = driver_entry<Granularity>("cuMemGetAllocationGranularity");
  static const auto create = driver_entry<Create>("cuMemCreate");
  static const auto reserve = driver_entry<Reserve>("cuMemAddressReserve");
  static const auto map = driver_entry<Map>("cuMemMap");
  static const auto set_access = driver_entry<SetAccess>("cuMemSetAccess");
  if (!granularity || !create || !reserve || !map || !set_access) return false;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.allocFlags.compressionType = compression == 1 ? CU_MEM_ALLOCATION_COMP_GENERIC : CU_MEM_ALLOCATION_COMP_NONE;
  size_t g = 0;
  if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || g == 0) return false;
  b.size = (bytes + g - 1) / g * g;
  CUdeviceptr va = 0;
  if (create(&b.handle, b.size, &prop, 0) != CUDA_SUCCESS) return false;
  if (reserve(&va, b.size, g, 0, 0) != CUDA_SUCCESS || map(va, b.size, 0, b.handle, 0) != CUDA_SUCCESS) return false;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (set_access(va, b.size, &access, 1) != CUDA_SUCCESS) return false;
  b.ptr = reinterpret_cast<void*>(va);
  return true;
}

void release(Buffer& b) {
  if (b.ptr == nullptr) return;
  if (b.compression < 0) {
    cudaFree(b.ptr);
  } else {
    using Unmap = CUresult (*)(CUdeviceptr, size_t);
    using Free = CUresult (*)(CUdeviceptr, size_t);
    using Release = CUresult (*)(CUmemGenericAllocationHandle);
    static const auto unmap = driver_entry<Unmap>("cuMemUnmap");
    static const auto address_free = driver_entry<Free>("cuMemAddressFree");
    static const auto handle_release = driver_entry<Release>("cuMemRelease");
    const auto va = reinterpret_cast<CUdeviceptr>(b.ptr);
    if (unmap) unmap(va, b.size);
    if (address_free) address_free(va, b.size);
    if (handle_release) handle_release(b.handle);
  }
  b = Buffer{};
}

int main() {
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  using GetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  const auto get_attribute = driver_entry<GetAttribute>("cuDeviceGetAttribute");
  int compressible = 0;
  if (get_attribute) get_attribute(&compressible, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, device);
  std::printf("write-check: 2 x %zu MB written (fc1's pre and act at DiT-B/2 b256), A %zu MB; generic compression "
              "%s\n",
              kOutputBytes >> 20, kABytes >> 20, compressible ? "supported" : "not supported");
  const char* names[] = {"cudaMalloc", "cuMemCreate, compression off", "cuMemCreate, compression on"};
  for (int compression = -1; compression <= 1; ++compression) {
    if (compression == 1 && !compressible) continue;
    Buffer out0, out1, a;
    if (!allocate(out0, kOutputBytes, compression, device) || !allocate(out1, kOutputBytes, compression, device) ||
        !allocate(a, kABytes, compression, device)) {
      std::printf("%s: allocation failed\n", names[compression + 1]);
      release(out0), release(out1), release(a);
      continue;
    }
    CHECK(cudaMemset(a.ptr, 0x3c, kABytes));
    auto* o0 = static_cast<uint4*>(out0.ptr);
    auto* o1 = static_cast<uint4*>(out1.ptr);
    const auto* ap = static_cast<const uint4*>(a.ptr);
    const double memset_rate = gbps(2 * kOutputBytes, [&] {
      CHECK(cudaMemsetAsync(out0.ptr, 0x5a, kOutputBytes));
      CHECK(cudaMemsetAsync(out1.ptr, 0xa5, kOutputBytes));
      return 0;
    });
    const double stream_rate = gbps(2 * kOutputBytes, [&] {
      stream_writes<<<4 * sms, 512>>>(o0, kOutputBytes / 16);
      stream_writes<<<4 * sms, 512>>>(o1, kOutputBytes / 16);
    });
    const double tile_rate =
        gbps(2 * kOutputBytes, [&] { tile_writes<<<sms, 256>>>(o0, o1, nullptr, kRows, kCols, kDepth); });
    const double tile_a_rate =
        gbps(2 * kOutputBytes, [&] { tile_writes<<<sms, 256>>>(o0, o1, ap, kRows, kCols, kDepth); });
    std::printf("%s: memset %.0f GB/s, stream %.0f, tiles %.0f, tiles+A %.0f (A read beside it at %.0f)\n",
                names[compression + 1], memset_rate, stream_rate, tile_rate, tile_a_rate,
                tile_a_rate * double(kRows / 128 * (kCols / 256)) * 128 * kDepth * 2 / (2 * kOutputBytes));
    if (compression < 0) {
      // Is the rate a limit of each SM or of the whole GPU? The tile pattern on fewer SMs.
      for (int ctas : {sms / 4, sms / 2}) {
        const double rate =
            gbps(2 * kOutputBytes, [&] { tile_writes<<<ctas, 256>>>(o0, o1, nullptr, kRows, kCols, kDepth); });
        std::printf("  tiles on %d SMs: %.0f GB/s (%.1f per SM)\n", ctas, rate, rate / ctas);
      }
      // fc1's rhythm: ms per launch against the main loop's time alone (work only).
      const int tiles = kRows / 128 * (kCols / 256), per_cta = (tiles + sms - 1) / sms;
      for (int work_ns : {0, 7700})
        for (int stagger_ns : {0, 1000, 2000}) {
          const double rate = gbps(2 * kOutputBytes, [&] { rhythm_tiles<<<sms, 256>>>(o0, o1, kRows, kCols, work_ns, stagger_ns); });
          std::printf("  rhythm work %d ns/tile, stagger %d ns: %.3f ms a launch (work alone %.3f ms)\n", work_ns,
                      stagger_ns, 2 * kOutputBytes / (rate * 1e9) * 1e3, per_cta * work_ns * 1e-6);
        }
    }
    release(out0), release(out1), release(a);
  }
  return 0;
}
