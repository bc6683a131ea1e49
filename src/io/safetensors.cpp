#include "io/safetensors.h"

#include <ATen/Parallel.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/text.h"
#include "io/atomic_file.h"

namespace perftrain::io {

// The whole file, mapped private and copy-on-write: a caller that writes into
// a tensor by mistake changes its own pages, never the file, and does not crash.
struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, size);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};

namespace {

// Bigger headers are certainly corrupt (the reference reader's limit too).
constexpr uint64_t kMaxHeader = 100u << 20;

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

bool dtype_from_name(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

const char* dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += std::string(s.empty() ? "" : " ") + d.name;
  return s;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw RuntimeError(base::printable(path) + ": not a valid safetensors file: " + base::printable(what));
}

// torch.save's two formats: a zip archive ("PK\x03\x04") whose first entry
// is data.pkl (as "<archive>/data.pkl"), and the legacy one, a pickle of
// protocol 2 that opens with its magic number as a LONG1. A safetensors
// header always starts with '{' at byte 8, so a file that has one is never
// taken for either, whatever its header length's bytes.
std::string torch_format_of(const uint8_t* b, size_t size) {
  if (size > 8 && b[8] == '{') return "";
  static const uint8_t kLegacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  if (size >= sizeof kLegacy && std::memcmp(b, kLegacy, sizeof kLegacy) == 0) return "legacy";
  if (size < 30 || b[0] != 'P' || b[1] != 'K' || b[2] != 3 || b[3] != 4) return "";
  const size_t name_len = b[26] | (b[27] << 8);
  if (30 + name_len > size) return "";
  const std::string name(reinterpret_cast<const char*>(b) + 30, name_len);
  const std::string tail = "data.pkl";
  const bool data_pkl = name == tail || (name.size() > tail.size() && name.compare(name.size() - tail.size() - 1,
                                                                                    tail.size() + 1, "/" + tail) == 0);
  return data_pkl ? "zip" : "";
}

// A torch.save file, or another pickle (pickle.dump: protocol 2 and up start
// with 0x80, then the protocol): names what the file is and the Python line
// that converts it.
void reject_torch_pickle(const std::string& path, const uint8_t* b, size_t size) {
  const std::string torch = torch_format_of(b, size);
  const bool pickle = torch.empty() && !(size > 8 && b[8] == '{') && size >= 2 && b[0] == 0x80 && b[1] >= 2 &&
                      b[1] <= 5;
  if (torch.empty() && !pickle) return;
  // The converted file's name: model.pt -> model.safetensors, and beside a
  // misnamed x.safetensors, x.converted.safetensors.
  std::string out = path, suffix = ".safetensors";
  for (const char* ext : {".pt", ".pth", ".bin", ".ckpt", ".pkl", ".safetensors"}) {
    const size_t n = std::strlen(ext);
    if (out.size() > n && out.compare(out.size() - n, n, ext) == 0) {
      out.erase(out.size() - n);
      if (ext == std::string(".safetensors")) suffix = ".converted.safetensors";
      break;
    }
  }
  out += suffix;
  throw UsageError(path + ": a PyTorch " + (torch == "zip" ? "checkpoint (torch.save's zip format)" : "pickle") +
                   ", not safetensors; convert it with: " +
                   (torch == "zip" ? "perftrain convert " + path + " --out " + out + " (a state dict of a DiT), or " : "") +
                   "python -c \"import torch; from safetensors.torch import "
                   "save_file; sd = torch.load('" + path + "', map_location='cpu'); save_file({k: v.contiguous() "
                   "for k, v in sd.items()}, '" + out + "')\" (for a dict of state_dicts take one, e.g. sd['ema'])");
}

std::shared_ptr<Mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw RuntimeError(path + ": cannot open: not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size < 8) {
    ::close(fd);
    corrupt(path, "file is " + std::to_string(m->size) +
                      " bytes, shorter than the 8-byte header length");
  }
  void* addr = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (addr == MAP_FAILED) throw RuntimeError(path + ": cannot mmap: " + std::strerror(err));
  m->addr = addr;
  return m;
}

// Reads a non-negative integer (JSON numbers that are whole and >= 0).
bool as_count(const nlohmann::ordered_json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return *out >= 0;
  }
  return false;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// The CRC32C of each buffer, computed in parallel (checkpoints hold gigabytes).
std::vector<uint32_t> crcs_of(const std::vector<std::pair<const void*, size_t>>& buffers) {
  std::vector<uint32_t> out(buffers.size(), 0);
  at::parallel_for(0, static_cast<int64_t>(buffers.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = base::crc32c(buffers[i].first, buffers[i].second);
  });
  return out;
}

// What the header checksum covers, as canonical text: the metadata (but the
// checksum itself) and each tensor's dtype and shape, keys sorted.
struct HeaderTensor {
  std::string name;
  const char* dtype;
  std::vector<int64_t> shape;
};
uint32_t header_crc(const std::map<std::string, std::string>& metadata, const std::vector<HeaderTensor>& tensors) {
  nlohmann::json meta = nlohmann::json::object(), described = nlohmann::json::object();
  for (const auto& [k, v] : metadata)
    if (k != kHeaderChecksumKey) meta[k] = v;
  for (const auto& t : tensors) described[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}};
  const std::string text = nlohmann::json{{"metadata", meta}, {"tensors", described}}.dump();
  return base::crc32c(text.data(), text.size());
}

}  // namespace

std::string torch_save_format(const std::string& path) {
  uint8_t buf[4096];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  return n > 0 ? torch_format_of(buf, static_cast<size_t>(n)) : "";
}

std::string safetensors_dtype_name(at::ScalarType type) {
  const char* name = dtype_name(type);
  return name != nullptr ? name : "unsupported (" + std::string(c10::toString(type)) + ")";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = map_file(path);
  const uint8_t* base = file.mapping_->bytes();
  const uint64_t size = file.mapping_->size;
  reject_torch_pickle(path, base, size);

  uint64_t header_len = 0;  // little-endian u64 at byte 0
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > kMaxHeader) {
    corrupt(path, "header length " + std::to_string(header_len) +
                      " at byte 0 is larger than the 100 MiB limit");
  }
  if (header_len > size - 8) {
    corrupt(path, "header length " + std::to_string(header_len) + " at byte 0 runs past the end of the " +
                      std::to_string(size) + "-byte file");
  }
  file.data_start_ = static_cast<int64_t>(8 + header_len);
  const int64_t data_size = static_cast<int64_t>(size) - file.data_start_;

  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(base + 8, base + 8 + header_len);
  } catch (const nlohmann::json::parse_error& e) {
    // what() is "[json.exception.parse_error.101] parse error at line 1, ...": keep the words.
    std::string why = e.what();
    why = why.substr(why.find(']') == std::string::npos ? 0 : why.find(']') + 2);
    corrupt(path, "header JSON does not parse near byte " + std::to_string(8 + e.byte - 1) + ": " + why);
  }
  if (!header.is_object()) corrupt(path, "header JSON is not an object");

  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) corrupt(path, "__metadata__ is not an object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) corrupt(path, "__metadata__ value of '" + key + "' is not a string");
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!info.is_object()) corrupt(path, where + "entry is not an object");
    Entry e;
    const auto dtype = info.find("dtype");
    if (dtype == info.end() || !dtype->is_string()) corrupt(path, where + "no dtype string");
    if (!dtype_from_name(dtype->get<std::string>(), &e.dtype)) {
      corrupt(path, where + "unsupported dtype " + dtype->get<std::string>() + " (known: " +
                        known_dtypes() + ")");
    }
    const auto shape = info.find("shape");
    if (shape == info.end() || !shape->is_array()) corrupt(path, where + "no shape array");
    int64_t numel = 1;
    for (const auto& d : *shape) {
      int64_t n = 0;
      if (!as_count(d, &n)) corrupt(path, where + "shape " + shape->dump() + " has a negative or non-integer size");
      if (n != 0 && numel > std::numeric_limits<int64_t>::max() / 16 / n) {
        corrupt(path, where + "shape " + shape->dump() + " is too large");
      }
      numel *= n;
      e.shape.push_back(n);
    }
    const auto offsets = info.find("data_offsets");
    if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
        !as_count((*offsets)[0], &e.begin) || !as_count((*offsets)[1], &e.end)) {
      corrupt(path, where + "data_offsets is not a pair of non-negative integers");
    }
    const int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(e.dtype));
    if (e.end < e.begin || e.end - e.begin != nbytes) {
      corrupt(path, where + "data_offsets " + offsets->dump() + " span " +
                        std::to_string(e.end - e.begin) + " bytes, but " + dtype->get<std::string>() +
                        " " + shape->dump() + " needs " + std::to_string(nbytes));
    }
    if (e.end > data_size) {
      corrupt(path, where + "data_offsets " + offsets->dump() + " end at byte " +
                        std::to_string(file.data_start_ + e.end) + ", past the end of the " +
                        std::to_string(size) + "-byte file");
    }
    file.entries_.emplace_back(name, std::move(e));
  }

  // File order is data order; overlapping tensors mean a corrupt header
  // (empty tensors occupy no bytes, so they overlap nothing).
  std::stable_sort(file.entries_.begin(), file.entries_.end(),
                   [](const auto& a, const auto& b) { return a.second.begin < b.second.begin; });
  const std::pair<std::string, Entry>* last = nullptr;  // the last non-empty tensor
  for (const auto& cur : file.entries_) {
    if (cur.second.end == cur.second.begin) continue;
    if (last != nullptr && cur.second.begin < last->second.end) {
      corrupt(path, "tensors '" + last->first + "' and '" + cur.first + "' overlap at data byte " +
                        std::to_string(cur.second.begin));
    }
    last = &cur;
  }
  return file;
}

void SafetensorsFile::verify_header_checksum() const {
  const auto it = metadata_.find(kHeaderChecksumKey);
  if (it == metadata_.end()) return;
  std::vector<HeaderTensor> tensors;
  for (const auto& [name, e] : entries_) tensors.push_back({name, dtype_name(e.dtype), e.shape});
  const uint32_t got = header_crc(metadata_, tensors);
  uint32_t want = 0;
  if (it->second.size() != 8 || std::sscanf(it->second.c_str(), "%8x", &want) != 1 || got != want)
    throw RuntimeError(path_ + ": the header is corrupt: the CRC32C of its metadata, tensor names, dtypes and shapes "
                       "is " + hex32(got) + " but the file records '" + it->second +
                       "' (the file changed after it was written)");
}

size_t SafetensorsFile::verify_checksums() const {
  verify_header_checksum();
  const auto it = metadata_.find(kChecksumKey);
  if (it == metadata_.end()) return 0;
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::parse_error&) {
    corrupt(path_, std::string("the checksum record (__metadata__ ") + kChecksumKey + ") does not parse");
  }
  if (!record.is_object()) corrupt(path_, std::string("the checksum record (") + kChecksumKey + ") is not an object");
  std::vector<std::pair<const void*, size_t>> buffers;
  std::vector<uint32_t> expected;
  for (const auto& [name, e] : entries_) {
    const auto r = record.find(name);
    uint32_t want = 0;
    if (r == record.end() || !r->is_string() || r->get<std::string>().size() != 8 ||
        std::sscanf(r->get<std::string>().c_str(), "%8x", &want) != 1) {
      throw RuntimeError(path_ + ": tensor '" + name + "' has no valid CRC32C in the checksum record (" +
                         kChecksumKey + "); the file's header is corrupt");
    }
    expected.push_back(want);
    buffers.emplace_back(mapping_->bytes() + data_start_ + e.begin, static_cast<size_t>(e.end - e.begin));
  }
  if (record.size() != entries_.size()) {
    for (const auto& [name, v] : record.items()) {
      if (!contains(name))
        throw RuntimeError(path_ + ": the checksum record names tensor '" + name +
                           "', which the file does not hold; the file's header is corrupt");
    }
  }
  const std::vector<uint32_t> got = crcs_of(buffers);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (got[i] != expected[i])
      throw RuntimeError(path_ + ": tensor '" + entries_[i].first + "' is corrupt: its data's CRC32C is " +
                         hex32(got[i]) + " but the file records " + hex32(expected[i]) +
                         " (the file changed after it was written)");
  }
  return entries_.size();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, e] : entries_) {
    if (n == name) return true;
  }
  return false;
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  for (const auto& [n, e] : entries_) {
    if (n != name) continue;
    uint8_t* ptr = static_cast<uint8_t*>(mapping_->addr) + data_start_ + e.begin;
    auto keep = mapping_;  // the tensor owns a reference to the mapping
    at::Tensor t = at::from_blob(
        ptr, e.shape, [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(e.dtype));
    // Files packed by other writers may place a tensor at an address that is
    // not a multiple of its element size; kernels assume alignment, so copy.
    if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(e.dtype) != 0) t = t.clone();
    return t;
  }
  throw RuntimeError(path_ + ": no tensor named '" + name + "'");
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, SaveOptions options) {
  // Validate and bring everything to contiguous CPU memory before touching disk.
  std::vector<at::Tensor> cpu;
  std::set<std::string> seen;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (options.checksums && (metadata.count(kChecksumKey) || metadata.count(kHeaderChecksumKey)))
    throw UsageError("cannot write " + path + ": metadata keys " + kChecksumKey + "* are reserved for the checksums");
  if (!metadata.empty() || options.checksums) header["__metadata__"] = nlohmann::ordered_json::object();
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second) {
      throw UsageError("cannot write " + path + ": duplicate or reserved tensor name '" + name + "'");
    }
    if (!tensor.defined()) throw UsageError("cannot write " + path + ": tensor '" + name + "' is undefined");
    const char* dtype = dtype_name(tensor.scalar_type());
    if (dtype == nullptr) {
      throw UsageError("cannot write " + path + ": tensor '" + name + "' has dtype " +
                       std::string(c10::toString(tensor.scalar_type())) + "; supported: " + known_dtypes());
    }
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const int64_t nbytes = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    cpu.push_back(std::move(t));
  }
  if (!metadata.empty() || options.checksums) {
    nlohmann::ordered_json& meta = header["__metadata__"];
    for (const auto& [k, v] : metadata) meta[k] = v;
    if (options.checksums) {
      // Computed from the very bytes that are written next (the CPU copies).
      std::vector<std::pair<const void*, size_t>> buffers;
      for (const auto& t : cpu) buffers.emplace_back(t.data_ptr(), t.nbytes());
      const std::vector<uint32_t> crc = crcs_of(buffers);
      nlohmann::ordered_json record = nlohmann::ordered_json::object();
      for (size_t i = 0; i < cpu.size(); ++i) record[tensors[i].first] = hex32(crc[i]);
      meta[kChecksumKey] = record.dump();
      std::map<std::string, std::string> all = metadata;
      all[kChecksumKey] = record.dump();
      std::vector<HeaderTensor> described;
      for (size_t i = 0; i < cpu.size(); ++i)
        described.push_back({tensors[i].first, dtype_name(cpu[i].scalar_type()), cpu[i].sizes().vec()});
      meta[kHeaderChecksumKey] = hex32(header_crc(all, described));
    }
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned

  write_file_atomic(path, [&](std::FILE* f) {
    uint8_t len[8];
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_bytes(f, len, 8, path);
    write_bytes(f, json.data(), json.size(), path);
    for (const auto& t : cpu) write_bytes(f, t.data_ptr(), t.nbytes(), path);
  });
}

}  // namespace perftrain::io
