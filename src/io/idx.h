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

// Throws perftrain::RuntimeError naming the file and what is wrong: missing,
// unreadable or corrupt gzip stream, bad magic, an element type other than
// unsigned byte, truncated (bytes expected and found), trailing bytes. Byte
// offsets are into the decompressed stream.
IdxArray read_idx(const std::string& path);

}  // namespace perftrain::io
