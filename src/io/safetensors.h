// safetensors files (the format of huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the raw little-endian tensor bytes. Reading memory-maps the file, so a
// tensor is a zero-copy view that keeps the mapping alive; writing goes to a
// temporary file that is fsync'ed and renamed, so a crash never leaves a
// half-written file under the final name.
// Integrity: a writer may record the CRC32C of each tensor's bytes in the
// metadata under kChecksumKey, as one string (metadata values are strings, so
// PyTorch's safetensors and facebookresearch/DiT still load the file):
//   "perftrain.crc32c": a JSON object from tensor name to its CRC32C as 8 hex digits
//   "perftrain.crc32c.header": the CRC32C of what the header says: every other
//       metadata key and value, and each tensor's name, dtype and shape (the
//       data offsets are covered by the tensors' CRC32Cs: data moved no
//       longer matches), in a canonical form, so that a tool that rewrites
//       the file keeping its metadata does not break it
// Files from other tools carry neither and load as before; files from before
// the header checksum carry only the first.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::io {

struct Mapping;  // the memory-mapped file

inline constexpr const char* kChecksumKey = "perftrain.crc32c";
inline constexpr const char* kHeaderChecksumKey = "perftrain.crc32c.header";

class SafetensorsFile {
 public:
  // Throws perftrain::RuntimeError naming the file and what is wrong
  // (missing, truncated, bad header JSON, offsets outside the file, ...), and
  // UsageError for a PyTorch pickle or torch.save zip file, with the Python
  // line that converts it.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order
  bool contains(const std::string& name) const;
  // A CPU tensor viewing the mapped bytes (treat as read-only; clone to own).
  // Throws RuntimeError naming the file and tensor when the name is absent.
  at::Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Whether the file records per-tensor CRC32Cs (kChecksumKey).
  bool has_checksums() const { return metadata_.count(kChecksumKey) != 0; }
  // Whether the file records its header's CRC32C (kHeaderChecksumKey).
  bool has_header_checksum() const { return metadata_.count(kHeaderChecksumKey) != 0; }
  // Checks the header against its recorded CRC32C (no tensor data is read);
  // throws RuntimeError naming the file when it differs. Nothing for a file
  // without one.
  void verify_header_checksum() const;
  // The header's checksum, then every tensor's bytes against the record;
  // throws RuntimeError naming the file and the corrupt header or the first
  // corrupt tensor in data order (or a record that does not match the
  // tensors). Returns the number of tensors checked; 0 and no reading of the
  // data for a file without tensor checksums.
  size_t verify_checksums() const;

 private:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // byte offsets into the data section
  };
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  int64_t data_start_ = 0;
  std::vector<std::pair<std::string, Entry>> entries_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// "zip" or "legacy" for a file torch.save wrote (its zip format, whose first
// entry is data.pkl, or its legacy pickle format), else "" (unreadable too).
std::string torch_save_format(const std::string& path);

// The safetensors name of a dtype ("F32", "BF16", ...), or "unsupported
// (<torch name>)", for messages that speak the file format's language.
std::string safetensors_dtype_name(at::ScalarType type);

struct SaveOptions {
  bool checksums = false;  // record each tensor's CRC32C and the header's (kChecksumKey, kHeaderChecksumKey)
};

// Writes tensors (any device; copied to CPU, made contiguous) atomically.
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {}, SaveOptions options = {});

}  // namespace perftrain::io
