// CRC32C (Castagnoli), the checksum of checkpoint tensors and of TensorBoard's
// TFRecord framing. The SSE4.2 instruction where the CPU has it (about 8 bytes
// a cycle), slice-by-8 tables otherwise; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace perftrain::base {

// Extends a CRC32C over n more bytes: crc32c_extend(crc32c(a), b) == crc32c(a ++ b).
// The CRC of zero bytes is 0; crc32c("123456789") == 0xE3069283.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// TFRecord's masked CRC: the CRC rotated right by 15 bits plus a constant, so
// that a CRC stored inside checksummed data does not checksum to itself.
inline uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Whether crc32c_extend uses the hardware instruction on this machine.
bool crc32c_hardware();
// The table path alone (what crc32c_extend uses without SSE4.2), for tests.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

}  // namespace perftrain::base
