// What the sm_90a checks (sm90_check.cpp, race_check.cpp) share: a 2-D bf16 tensor map made by
// the emulated driver, a 1024-byte-aligned start in the dynamic shared memory, exact values.
#pragma once
#include "check.h"
#include "kernels/sm90.cuh"

namespace s9 = perftrain::kernels::sm90;
using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                            CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline CUtensorMap map_of(bf16* base, int rows, int cols, int box_rows, int box_cols, int swizzle) {
  void* fn = nullptr;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, nullptr);
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)}, strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)}, ones[2] = {1, 1};
  const CUtensorMapSwizzle sw = swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                              : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B : CU_TENSOR_MAP_SWIZZLE_NONE;
  CUtensorMap m;
  if (reinterpret_cast<Encode>(fn)(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, ones,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    printf("FAIL the emulated driver refused a tensor map\n");
    exit(1);
  }
  return m;
}
// The swizzle written out: a 1024-byte-aligned box's byte offset with its 16-byte chunk
// bits XOR the row bits from 7 up.
inline uint32_t swizzled(uint32_t off, int span) { return span ? off ^ (((off >> 7) & (span / 16 - 1)) << 4) : off; }
inline unsigned char* aligned_smem(unsigned char* raw) { return raw + ((1024 - (s9::smem_u32(raw) & 1023)) & 1023); }
inline float value(int r, int c) { return float((r * 7 + c * 3) % 200 + 1); }  // exact in bf16, never 0

