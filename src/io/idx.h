// The idx format of MNIST and Fashion-MNIST: magic bytes 00 00 08 <ndim>
// (08 = unsigned byte elements), ndim big-endian int32 sizes, then the bytes.
// Files may be gzip-compressed (recognised by their 1f 8b magic) or raw.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::io {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// The most data bytes read_idx takes (4 GiB; Fashion-MNIST's training images
// are 47 MB).
constexpr uint64_t kIdxMaxBytes = uint64_t(1) << 32;

// Throws perftrain::RuntimeError naming the file and what is wrong: missing,
// unreadable or corrupt gzip stream, bad magic, an element type other than
// unsigned byte, dimensions above kIdxMaxBytes, truncated (bytes expected and
// found), trailing bytes. Byte offsets are into the decompressed stream. The
// header is read first and nothing beyond the size it announces is
// decompressed: a gzip bomb fails after one byte too many, not after
// inflating all of it.
IdxArray read_idx(const std::string& path);

}  // namespace perftrain::io
