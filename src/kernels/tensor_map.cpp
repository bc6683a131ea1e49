#include "kernels/tensor_map.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"

namespace perftrain::kernels {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    PERFTRAIN_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

namespace {

// A map of `rank` dimensions of `type` (dims innermost first, strides in
// bytes for dims 1 ..), boxes of box_cols x box_rows (x 1 beyond).
CUtensorMap encode(CUtensorMapDataType type, const void* base, cuuint32_t rank, const cuuint64_t* dims,
                   const cuuint64_t* strides, int box_rows, int box_cols, CUtensorMapSwizzle swizzle,
                   const char* who) {
  CUtensorMap map;
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const auto call = [&] {
    return encode_tiled()(&map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = call();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A thread whose first CUDA work this is has no current context (the
    // encoder is a driver call; autograd's device thread, when our kernel's
    // backward is the first thing it runs): cudaSetDevice makes the
    // device's primary context current there.
    int device = 0;
    PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    PERFTRAIN_CUDA_CHECK(cudaSetDevice(device));
    r = call();
  }
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string(who) + ": cuTensorMapEncodeTiled failed (CUresult " +
                             std::to_string(int(r)) + ")");
  return map;
}

// A bf16 map, boxes of box_cols x box_rows (x 1 beyond): 64 columns take the 128-byte swizzle.
CUtensorMap encode_bf16(const void* base, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                        int box_rows, int box_cols, const char* who) {
  if (box_cols != 64 && (box_cols % 8 != 0 || box_cols > 64))
    throw std::invalid_argument(std::string(who) + ": a tensor-map box is 64 columns or a multiple of 8 below");
  return encode(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, strides, box_rows, box_cols,
                box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, who);
}

}  // namespace

CUtensorMap bf16_tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows, const char* who,
                            int box_cols) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};  // innermost first
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};             // bytes between rows
  return encode_bf16(base, 2, dims, strides, box_rows, box_cols, who);
}

CUtensorMap bf16_tensor_map_3d(const void* base, int64_t samples, int64_t rows, int64_t cols, int64_t row_stride,
                               int box_rows, const char* who, int box_cols) {
  if (row_stride < cols || row_stride % 8 != 0)
    throw std::invalid_argument(std::string(who) + ": a row stride must be at least the columns and a multiple of 8");
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(samples)};
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * 2, cuuint64_t(rows * row_stride) * 2};
  return encode_bf16(base, 3, dims, strides, box_rows, box_cols, who);
}

CUtensorMap row_tensor_map(const void* base, int64_t samples, int64_t cols, int64_t row_stride, int element_bytes,
                           int box_cols, const char* who) {
  if (element_bytes != 2 && element_bytes != 4)
    throw std::invalid_argument(std::string(who) + ": a row map's elements are 2 or 4 bytes");
  if (box_cols < 1 || box_cols > 256 || (box_cols * element_bytes) % 16 != 0)
    throw std::invalid_argument(std::string(who) +
                                ": a row map's box is at most 256 columns of a multiple of 16 bytes");
  if (samples > 1 && (row_stride < cols || (row_stride * element_bytes) % 16 != 0))
    throw std::invalid_argument(std::string(who) +
                                ": a row stride must be at least the columns and a multiple of 16 bytes");
  const CUtensorMapDataType type =
      element_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(samples)};
  // One sample: the stride is never used, but the driver checks it; the row rounded up to 16 bytes.
  const int64_t stride_bytes = samples > 1 ? row_stride * element_bytes : (cols * element_bytes + 15) / 16 * 16;
  const cuuint64_t strides[1] = {cuuint64_t(stride_bytes)};
  return encode(type, base, 2, dims, strides, 1, box_cols, CU_TENSOR_MAP_SWIZZLE_NONE, who);
}

void allow_dynamic_smem(const void* kernel, int bytes, int device, std::atomic<uint64_t>& set_on) {
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (set_on.load(std::memory_order_acquire) & bit) != 0) return;
  PERFTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set_on.fetch_or(bit, std::memory_order_release);
}

void check_tma_pointers(const char* who, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw std::invalid_argument(std::string(who) + ": every pointer must be given and 16-byte aligned");
}

int sm90_device(const char* who) {
  int device = 0, major = 0, minor = 0;
  PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) throw std::invalid_argument(std::string(who) + ": needs an sm_90 GPU");
  return device;
}

}  // namespace perftrain::kernels
