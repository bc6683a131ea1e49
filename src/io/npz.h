// NumPy's array files: .npy (one array: a magic, a Python-dict header, the raw
// little-endian bytes) and .npz (a zip of .npy entries, as np.savez and
// np.savez_compressed write them). Evaluation reads pytorch-fid's and ADM's
// reference statistics (`mu`, `sigma`) and reference features from them, and
// `perftrain sample --npz` writes the uint8 sample batch (`arr_0`, [N, H, W, 3])
// that ADM's evaluation suite reads.
// Reading: stored or deflated entries, zip64; dtypes u1, i4, i8, f4, f8 (and
// b1), C or Fortran order; anything else is a RuntimeError naming the file
// and entry. Writing: stored (uncompressed) entries, zip64 where an entry or
// the archive passes 4 GiB, each entry's CRC32 patched in after its bytes, so
// an entry is streamed batch by batch and never held whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::io {

// Every array of an .npz, by name without ".npy", as owned CPU tensors.
std::map<std::string, at::Tensor> read_npz(const std::string& path);
// The one array of an .npy file.
at::Tensor read_npy(const std::string& path);
// An .npz's arrays, or an .npy file's array under the name "arr_0" (by the
// file's first bytes, not its name).
std::map<std::string, at::Tensor> read_arrays(const std::string& path);

// The header of an .npy holding `shape` of `dtype` (padded so that the data
// start on a 64-byte boundary, as NumPy writes it).
std::string npy_header(at::ScalarType dtype, const std::vector<int64_t>& shape);

// Writes an .npz into an open file, one entry at a time:
//   NpzWriter w(f, path);
//   w.begin("arr_0", at::kByte, {n, h, w, 3});  w.append(...) ...;  w.end();
//   w.finish();
// The bytes appended to an entry must add up to its shape exactly (end()
// throws otherwise). `path` only names the file in errors.
class NpzWriter {
 public:
  NpzWriter(std::FILE* f, std::string path);
  void begin(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& shape);
  void append(const void* data, size_t bytes);
  // A contiguous CPU tensor of the entry's dtype.
  void append(const at::Tensor& t);
  void end();
  void finish();

 private:
  struct Entry {
    std::string name;
    uint64_t offset = 0, size = 0;
    uint32_t crc = 0;
  };
  void write(const void* data, size_t bytes);
  std::FILE* f_;
  std::string path_;
  std::vector<Entry> entries_;
  uint64_t pos_ = 0, expected_ = 0, written_ = 0;
  bool open_ = false;
};

// Writes named CPU tensors as an .npz, atomically.
void write_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& arrays);

}  // namespace perftrain::io
