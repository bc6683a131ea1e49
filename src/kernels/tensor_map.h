// The host side our TMA kernels share: the driver's tensor-map encoder
// reached through the runtime (no link to libcuda), for the layouts they use
// (2-D, and 3-D with a sample dimension), a kernel's dynamic shared-memory
// limit set once per device, and the checks of their arguments and of the
// GPU (sm_90).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <atomic>
#include <cstdint>
#include <initializer_list>

namespace perftrain::kernels {

// A [rows, cols] bf16 row-major matrix in boxes of box_rows x box_cols,
// for TMA loads and stores: 64 columns (128 bytes) take the 128-byte
// swizzle, narrower boxes (a multiple of 8 columns) none. Throws
// std::runtime_error naming `who` when the driver refuses.
CUtensorMap bf16_tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows, const char* who,
                            int box_cols = 64);

// A [samples, rows, cols] bf16 tensor whose rows are row_stride elements
// apart (row_stride >= cols, a multiple of 8) and samples rows x row_stride
// apart, in boxes of box_rows x box_cols x 1: a box never crosses into the
// next sample (rows past `rows` load as zeros and are not stored). Swizzle
// and errors as bf16_tensor_map's.
CUtensorMap bf16_tensor_map_3d(const void* base, int64_t samples, int64_t rows, int64_t cols, int64_t row_stride,
                               int box_rows, const char* who, int box_cols = 64);

// A [samples, cols] matrix of 2- or 4-byte elements (bf16 or fp32: TMA
// copies bytes) whose rows are row_stride elements apart, in boxes of
// box_cols x 1 with no swizzle: one sample's run of columns, such as a
// tiled attention kernel's key bias for one key tile (columns past `cols`
// load as zeros). box_cols * element_bytes a multiple of 16, at most 256
// columns; with more than one sample, row_stride * element_bytes a multiple
// of 16 (one sample's row stride is never used). Errors as bf16_tensor_map's.
CUtensorMap row_tensor_map(const void* base, int64_t samples, int64_t cols, int64_t row_stride, int element_bytes,
                           int box_cols, const char* who);

// Sets `kernel`'s dynamic shared-memory limit to `bytes` on `device` unless
// `set_on` (the caller's static mask, bit d for device d) says it is set:
// the attribute belongs to the function on one device, so a second GPU in
// the process needs its own call.
void allow_dynamic_smem(const void* kernel, int bytes, int device, std::atomic<uint64_t>& set_on);

// Every pointer given and 16-byte aligned (TMA's rule for a global address);
// std::invalid_argument naming `who` otherwise.
void check_tma_pointers(const char* who, std::initializer_list<const void*> pointers);

// The current device, after checking that it is an sm_90 GPU (the wgmma and
// TMA kernels' only target); std::invalid_argument naming `who` otherwise.
int sm90_device(const char* who);

}  // namespace perftrain::kernels
