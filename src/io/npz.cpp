#include "io/npz.h"

#include <ATen/ops/empty.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>

#include "base/error.h"
#include "base/text.h"
#include "io/atomic_file.h"

namespace perftrain::io {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kZip32Max = 0xFFFFFFFFull;
const char kNpyMagic[] = "\x93NUMPY";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw RuntimeError(base::printable(path) + ": " + what);
}

uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

const char* descr_of(at::ScalarType t) {
  switch (t) {
    case at::kByte: return "|u1";
    case at::kBool: return "|b1";
    case at::kInt: return "<i4";
    case at::kLong: return "<i8";
    case at::kFloat: return "<f4";
    case at::kDouble: return "<f8";
    default: throw UsageError(std::string("npy: no NumPy type for ") + c10::toString(t));
  }
}

bool dtype_of(const std::string& descr, at::ScalarType* t) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"|u1", at::kByte}, {"<u1", at::kByte}, {"|b1", at::kBool}, {"<i4", at::kInt},
      {"<i8", at::kLong}, {"<f4", at::kFloat}, {"<f8", at::kDouble}};
  auto it = kTypes.find(descr);
  if (it == kTypes.end()) return false;
  *t = it->second;
  return true;
}

// A whole file's bytes.
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Parses one .npy held in `bytes`; `where` names it in errors.
at::Tensor parse_npy(const uint8_t* bytes, size_t size, const std::string& where) {
  if (size < 10 || std::memcmp(bytes, kNpyMagic, 6) != 0) fail(where, "not an .npy array (no \\x93NUMPY magic)");
  const int major = bytes[6];
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3) fail(where, "unknown .npy version " + std::to_string(major));
  const size_t header_len = le(bytes + 8, static_cast<int>(len_bytes));
  const size_t data_start = 8 + len_bytes + header_len;
  if (data_start > size) fail(where, ".npy header runs past the end");
  const std::string header(reinterpret_cast<const char*>(bytes) + 8 + len_bytes, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) fail(where, ".npy header has no descr");
  at::ScalarType dtype;
  if (!dtype_of(m[1].str(), &dtype)) fail(where, "unsupported .npy dtype '" + m[1].str() + "'");
  const bool fortran = header.find("'fortran_order': True") != std::string::npos;
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) fail(where, ".npy header has no shape");
  std::vector<int64_t> shape;
  const std::string dims = m[1].str();
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  std::vector<int64_t> stored = shape;
  if (fortran) std::reverse(stored.begin(), stored.end());
  at::Tensor t = at::empty(stored, at::TensorOptions().dtype(dtype));
  const size_t nbytes = t.numel() * t.element_size();
  if (size - data_start != nbytes)
    fail(where, "holds " + std::to_string(size - data_start) + " data bytes, its shape needs " + std::to_string(nbytes));
  std::memcpy(t.data_ptr(), bytes + data_start, nbytes);
  if (!fortran) return t;
  std::vector<int64_t> order;
  for (int64_t d = t.dim() - 1; d >= 0; --d) order.push_back(d);
  return t.permute(order).contiguous();
}

// One zip entry's stored bytes, inflated when deflated.
std::string inflate_raw(const uint8_t* data, uint64_t size, uint64_t out_size, const std::string& where) {
  std::string out(out_size, '\0');
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail(where, "zlib inflateInit2 failed");
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out_size);
  const int r = inflate(&z, Z_FINISH);
  inflateEnd(&z);
  if (r != Z_STREAM_END || z.total_out != out_size) fail(where, "corrupt deflated data");
  return out;
}

struct CentralEntry {
  std::string name;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, offset = 0;
};

// The central directory's entries (zip64 sizes and offsets read from their
// extra fields).
std::vector<CentralEntry> central_directory(const std::string& z, const std::string& path) {
  const auto* b = reinterpret_cast<const uint8_t*>(z.data());
  if (z.size() < 22) fail(path, "not a zip file (too short)");
  size_t end = std::string::npos;
  for (size_t i = z.size() - 22 + 1; i-- > 0 && z.size() - i <= 22 + 65535;)
    if (le(b + i, 4) == kEndSig) { end = i; break; }
  if (end == std::string::npos) fail(path, "not a zip file (no end of central directory)");
  uint64_t count = le(b + end + 10, 2), cd_offset = le(b + end + 16, 4);
  if (end >= 20 && le(b + end - 20, 4) == kZip64LocatorSig) {
    const uint64_t z64 = le(b + end - 20 + 8, 8);
    if (z64 + 56 > z.size() || le(b + z64, 4) != kZip64EndSig) fail(path, "bad zip64 end record");
    count = le(b + z64 + 32, 8);
    cd_offset = le(b + z64 + 48, 8);
  }
  std::vector<CentralEntry> out;
  uint64_t p = cd_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + 46 > z.size() || le(b + p, 4) != kCentralSig) fail(path, "bad zip central directory");
    CentralEntry e;
    e.method = static_cast<uint16_t>(le(b + p + 10, 2));
    e.crc = static_cast<uint32_t>(le(b + p + 16, 4));
    e.compressed = le(b + p + 20, 4);
    e.size = le(b + p + 24, 4);
    const uint64_t name_len = le(b + p + 28, 2), extra_len = le(b + p + 30, 2), comment_len = le(b + p + 32, 2);
    e.offset = le(b + p + 42, 4);
    if (p + 46 + name_len + extra_len > z.size()) fail(path, "bad zip central directory");
    e.name = z.substr(p + 46, name_len);
    for (uint64_t x = p + 46 + name_len; x + 4 <= p + 46 + name_len + extra_len;) {
      const uint64_t id = le(b + x, 2), n = le(b + x + 2, 2);
      uint64_t f = x + 4;
      if (id == 1) {
        if (e.size == kZip32Max) e.size = le(b + f, 8), f += 8;
        if (e.compressed == kZip32Max) e.compressed = le(b + f, 8), f += 8;
        if (e.offset == kZip32Max) e.offset = le(b + f, 8);
      }
      x += 4 + n;
    }
    out.push_back(e);
    p += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// An entry's .npy bytes (CRC32 checked).
std::string entry_bytes(const std::string& z, const CentralEntry& e, const std::string& where) {
  const auto* b = reinterpret_cast<const uint8_t*>(z.data());
  if (e.offset + 30 > z.size() || le(b + e.offset, 4) != kLocalSig) fail(where, "bad zip local header");
  const uint64_t start = e.offset + 30 + le(b + e.offset + 26, 2) + le(b + e.offset + 28, 2);
  if (start + e.compressed > z.size()) fail(where, "zip entry runs past the end of the file (truncated?)");
  std::string bytes;
  if (e.method == 0) bytes = z.substr(start, e.compressed);
  else if (e.method == 8) bytes = inflate_raw(b + start, e.compressed, e.size, where);
  else fail(where, "zip compression method " + std::to_string(e.method) + " (only stored and deflate are read)");
  uLong c = crc32(0L, Z_NULL, 0);
  for (size_t i = 0; i < bytes.size(); i += (1u << 30))
    c = crc32(c, reinterpret_cast<const Bytef*>(bytes.data()) + i,
              static_cast<uInt>(std::min<size_t>(bytes.size() - i, 1u << 30)));
  if (static_cast<uint32_t>(c) != e.crc) fail(where, "CRC32 mismatch (corrupt entry)");
  return bytes;
}

}  // namespace

std::map<std::string, at::Tensor> read_npz(const std::string& path) {
  const std::string z = file_bytes(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : central_directory(z, path)) {
    const std::string where = base::printable(path) + " entry " + base::printable(e.name);
    const std::string bytes = entry_bytes(z, e, where);
    std::string name = e.name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    out[name] = parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), where);
  }
  return out;
}

at::Tensor read_npy(const std::string& path) {
  const std::string bytes = file_bytes(path);
  return parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), base::printable(path));
}

std::map<std::string, at::Tensor> read_arrays(const std::string& path) {
  const std::string bytes = file_bytes(path);
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), kNpyMagic, 6) == 0)
    return {{"arr_0", parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), base::printable(path))}};
  return read_npz(path);
}

std::string npy_header(at::ScalarType dtype, const std::vector<int64_t>& shape) {
  std::string dict = std::string("{'descr': '") + descr_of(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : "") +
                                                    (i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  const size_t unpadded = 10 + dict.size() + 1;  // magic, version, length, dict, '\n'
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out(kNpyMagic, 6);
  out.push_back('\x01');
  out.push_back('\x00');
  put_le(out, dict.size(), 2);
  return out + dict;
}

NpzWriter::NpzWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}

void NpzWriter::write(const void* data, size_t bytes) {
  write_bytes(f_, data, bytes, path_);
  pos_ += bytes;
}

void NpzWriter::begin(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  if (open_) throw RuntimeError(path_ + ": npz entry " + entries_.back().name + " not ended");
  const std::string header = npy_header(dtype, shape);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  Entry e{name + ".npy", pos_, header.size() + static_cast<uint64_t>(count) * c10::elementSize(dtype), 0};
  // Local header; the CRC is patched in by end(). Zip64 sizes in the extra
  // field when the entry may not fit 32 bits.
  const bool z64 = e.size >= kZip32Max;
  std::string h;
  put_le(h, kLocalSig, 4);
  put_le(h, z64 ? 45 : 20, 2);
  put_le(h, 0, 2);  // flags
  put_le(h, 0, 2);  // stored
  put_le(h, 0, 2);  // time
  put_le(h, 0x21, 2);  // date: 1980-01-01
  put_le(h, 0, 4);  // CRC32, patched
  put_le(h, z64 ? kZip32Max : e.size, 4);
  put_le(h, z64 ? kZip32Max : e.size, 4);
  put_le(h, e.name.size(), 2);
  put_le(h, z64 ? 20 : 0, 2);
  h += e.name;
  if (z64) {
    put_le(h, 1, 2);
    put_le(h, 16, 2);
    put_le(h, e.size, 8);
    put_le(h, e.size, 8);
  }
  entries_.push_back(e);
  write(h.data(), h.size());
  open_ = true;
  expected_ = e.size;
  written_ = 0;
  append(header.data(), header.size());
}

void NpzWriter::append(const void* data, size_t bytes) {
  if (!open_) throw RuntimeError(path_ + ": npz append outside an entry");
  if (written_ + bytes > expected_) throw RuntimeError(path_ + ": npz entry " + entries_.back().name + " overfull");
  uLong c = entries_.back().crc;
  for (size_t i = 0; i < bytes; i += (1u << 30))
    c = crc32(c, static_cast<const Bytef*>(data) + i, static_cast<uInt>(std::min<size_t>(bytes - i, 1u << 30)));
  entries_.back().crc = static_cast<uint32_t>(c);
  write(data, bytes);
  written_ += bytes;
}

void NpzWriter::append(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  append(c.data_ptr(), c.numel() * c.element_size());
}

void NpzWriter::end() {
  const Entry& e = entries_.back();
  if (!open_ || written_ != expected_)
    throw RuntimeError(path_ + ": npz entry " + e.name + " got " + std::to_string(written_) + " of " +
                       std::to_string(expected_) + " bytes");
  std::string crc;
  put_le(crc, e.crc, 4);
  if (fseeko(f_, static_cast<off_t>(e.offset + 14), SEEK_SET) != 0) fail(path_, "seek failed");
  write_bytes(f_, crc.data(), 4, path_);
  if (fseeko(f_, static_cast<off_t>(pos_), SEEK_SET) != 0) fail(path_, "seek failed");
  open_ = false;
}

// The central directory, then (where anything passes 32 bits) the zip64 end
// record and its locator, then the end record.
void NpzWriter::finish() {
  if (open_) end();
  const uint64_t cd_start = pos_;
  for (const Entry& e : entries_) {
    const bool z64 = e.size >= kZip32Max || e.offset >= kZip32Max;
    std::string h, extra;
    if (z64) {
      put_le(extra, 1, 2);
      put_le(extra, 24, 2);
      put_le(extra, e.size, 8);
      put_le(extra, e.size, 8);
      put_le(extra, e.offset, 8);
    }
    put_le(h, kCentralSig, 4);
    put_le(h, z64 ? 45 : 20, 2);  // made by
    put_le(h, z64 ? 45 : 20, 2);  // needed
    put_le(h, 0, 2);
    put_le(h, 0, 2);
    put_le(h, 0, 2);
    put_le(h, 0x21, 2);
    put_le(h, e.crc, 4);
    put_le(h, z64 ? kZip32Max : e.size, 4);
    put_le(h, z64 ? kZip32Max : e.size, 4);
    put_le(h, e.name.size(), 2);
    put_le(h, extra.size(), 2);
    put_le(h, 0, 2);  // comment
    put_le(h, 0, 2);  // disk
    put_le(h, 0, 2);  // internal attributes
    put_le(h, 0x1800000, 4);  // external: -rw------- (0600 << 16)
    put_le(h, z64 ? kZip32Max : e.offset, 4);
    h += e.name + extra;
    write(h.data(), h.size());
  }
  const uint64_t cd_size = pos_ - cd_start;
  const bool z64 = cd_start >= kZip32Max || entries_.size() >= 0xFFFF;
  std::string t;
  if (z64) {
    const uint64_t record = pos_;
    put_le(t, kZip64EndSig, 4);
    put_le(t, 44, 8);
    put_le(t, 45, 2);
    put_le(t, 45, 2);
    put_le(t, 0, 4);
    put_le(t, 0, 4);
    put_le(t, entries_.size(), 8);
    put_le(t, entries_.size(), 8);
    put_le(t, cd_size, 8);
    put_le(t, cd_start, 8);
    put_le(t, kZip64LocatorSig, 4);
    put_le(t, 0, 4);
    put_le(t, record, 8);
    put_le(t, 1, 4);
  }
  put_le(t, kEndSig, 4);
  put_le(t, 0, 2);
  put_le(t, 0, 2);
  put_le(t, z64 ? 0xFFFF : entries_.size(), 2);
  put_le(t, z64 ? 0xFFFF : entries_.size(), 2);
  put_le(t, z64 ? kZip32Max : cd_size, 4);
  put_le(t, z64 ? kZip32Max : cd_start, 4);
  put_le(t, 0, 2);
  write(t.data(), t.size());
}

void write_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& arrays) {
  write_file_atomic(path, [&](std::FILE* f) {
    NpzWriter w(f, path);
    for (const auto& [name, t] : arrays) {
      const at::Tensor c = t.cpu().contiguous();
      w.begin(name, c.scalar_type(), c.sizes().vec());
      w.append(c);
      w.end();
    }
    w.finish();
  });
}

}  // namespace perftrain::io
