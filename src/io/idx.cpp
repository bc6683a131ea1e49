#include "io/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/error.h"

namespace perftrain::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw RuntimeError(path + ": " + what);
}

bool starts_with_gzip_magic(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  return std::fread(magic, 1, 2, f.get()) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.insert(out.end(), buf, buf + n);
  if (std::ferror(f.get())) fail(path, std::string("read error: ") + std::strerror(errno));
  return out;
}

// gzerror's text, less the "<path>: " that zlib puts in front of it.
std::string gz_message(gzFile gz, const std::string& path, int* code) {
  std::string msg = gzerror(gz, code);
  if (msg.compare(0, path.size() + 2, path + ": ") == 0) msg.erase(0, path.size() + 2);
  return msg;
}

std::vector<uint8_t> read_gzip(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) fail(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(gz, 1 << 17);
  std::vector<uint8_t> out;
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    const size_t old = out.size();
    out.resize(old + kChunk);
    const int n = gzread(gz, out.data() + old, kChunk);
    if (n < 0) {
      int code = 0;
      const std::string msg = gz_message(gz, path, &code);
      gzclose(gz);
      fail(path, "truncated or corrupt gzip stream after " + std::to_string(old) + " decompressed bytes: " + msg);
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) break;
  }
  // A stream cut short reports itself only here ("unexpected end of file").
  int code = 0;
  const std::string msg = gz_message(gz, path, &code);
  gzclose(gz);
  if (code != Z_OK) fail(path, "truncated or corrupt gzip stream after " + std::to_string(out.size()) + " decompressed bytes: " + msg);
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "no such file");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const bool gz = starts_with_gzip_magic(path);
  std::vector<uint8_t> bytes = gz ? read_gzip(path) : read_raw(path);
  const std::string stream = gz ? " of the decompressed stream" : "";

  if (bytes.size() < 4) {
    fail(path, "truncated: expected a 4-byte idx magic, found " + std::to_string(bytes.size()) + " bytes");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%02x %02x", bytes[0], bytes[1]);
    fail(path, std::string("bad idx magic at byte 0") + stream + ": expected 00 00, found " + hex);
  }
  if (bytes[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", bytes[2]);
    fail(path, std::string("unsupported idx element type ") + hex + " at byte 2" + stream +
                   " (only 0x08, unsigned byte, is supported)");
  }
  const size_t ndim = bytes[3];
  if (ndim == 0) fail(path, "idx header at byte 3 says 0 dimensions");
  const size_t header = 4 + 4 * ndim;
  if (bytes.size() < header) {
    fail(path, "truncated: expected a " + std::to_string(header) + "-byte header, found " +
                   std::to_string(bytes.size()) + " bytes");
  }
  IdxArray out;
  uint64_t expected = 1;
  for (size_t d = 0; d < ndim; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    const uint32_t n = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    if (n > 0x7fffffffu) fail(path, "dimension " + std::to_string(d) + " at byte " + std::to_string(4 + 4 * d) + " is negative");
    out.dims.push_back(n);
    expected *= n;
    if (expected > (uint64_t(1) << 40)) fail(path, "dimensions in the header are implausibly large");
  }
  const uint64_t found = bytes.size() - header;
  if (found < expected) {
    fail(path, "truncated: expected " + std::to_string(expected) + " data bytes from byte " +
                   std::to_string(header) + stream + ", found " + std::to_string(found));
  }
  if (found > expected) {
    fail(path, "trailing garbage: " + std::to_string(found - expected) + " bytes after the data, from byte " +
                   std::to_string(header + expected) + stream);
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header));
  out.data = std::move(bytes);
  return out;
}

}  // namespace perftrain::io
