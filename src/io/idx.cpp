#include "io/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/text.h"

namespace perftrain::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw RuntimeError(base::printable(path) + ": " + what);
}

// The file's bytes, decompressed on the fly when it is gzip'ed (zlib reads a
// file without the gzip magic as it is). Read in pieces, so that nothing is
// decompressed beyond what the idx header announces.
class Stream {
 public:
  explicit Stream(const std::string& path) : path_(path), gz_(gzopen(path.c_str(), "rb")) {
    if (gz_ == nullptr) fail(path, std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(gz_, 1 << 17);
  }
  ~Stream() { gzclose(gz_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Reads up to n bytes into out; fewer only at the end of the stream. A
  // corrupt or cut gzip stream is an error naming the bytes read so far.
  size_t read(uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      const int r = gzread(gz_, out + got, static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30)));
      if (r < 0) corrupt(total_ + got);
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    total_ += got;
    // A stream cut short reports itself only at its end ("unexpected end of file").
    if (got < n) {
      int code = Z_OK;
      gzerror(gz_, &code);
      if (code != Z_OK) corrupt(total_);
    }
    return got;
  }

  bool compressed() { return gzdirect(gz_) == 0; }

 private:
  [[noreturn]] void corrupt(size_t decompressed) {
    int code = 0;
    std::string msg = gzerror(gz_, &code);
    // gzerror's text, less the "<path>: " that zlib puts in front of it.
    if (msg.compare(0, path_.size() + 2, path_ + ": ") == 0) msg.erase(0, path_.size() + 2);
    fail(path_, "truncated or corrupt gzip stream after " + std::to_string(decompressed) +
                    " decompressed bytes: " + base::printable(msg));
  }

  std::string path_;
  gzFile gz_;
  size_t total_ = 0;
};

// The header after the magic: the sizes, checked against each other and
// kIdxMaxBytes.
std::vector<int64_t> read_dims(Stream& in, const std::string& path, size_t ndim, uint64_t* numel) {
  std::vector<uint8_t> sizes(4 * ndim);
  const size_t got = in.read(sizes.data(), sizes.size());
  if (got < sizes.size()) {
    fail(path, "truncated: expected a " + std::to_string(4 + sizes.size()) + "-byte header, found " +
                   std::to_string(4 + got) + " bytes");
  }
  std::vector<int64_t> dims;
  *numel = 1;
  for (size_t d = 0; d < ndim; ++d) {
    const uint8_t* p = sizes.data() + 4 * d;
    const uint32_t n = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    if (n > 0x7fffffffu) fail(path, "dimension " + std::to_string(d) + " at byte " + std::to_string(4 + 4 * d) + " is negative");
    dims.push_back(n);
    *numel *= n;
    if (*numel > kIdxMaxBytes) {
      fail(path, "the header's dimensions announce more than " + std::to_string(kIdxMaxBytes) +
                     " data bytes (the most read_idx takes)");
    }
  }
  return dims;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "no such file");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  Stream in(path);

  uint8_t magic[4];
  const size_t got = in.read(magic, 4);
  const std::string stream = in.compressed() ? " of the decompressed stream" : "";
  if (got < 4) fail(path, "truncated: expected a 4-byte idx magic, found " + std::to_string(got) + " bytes");
  if (magic[0] != 0 || magic[1] != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%02x %02x", magic[0], magic[1]);
    fail(path, std::string("bad idx magic at byte 0") + stream + ": expected 00 00, found " + hex);
  }
  if (magic[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", magic[2]);
    fail(path, std::string("unsupported idx element type ") + hex + " at byte 2" + stream +
                   " (only 0x08, unsigned byte, is supported)");
  }
  const size_t ndim = magic[3];
  if (ndim == 0) fail(path, "idx header at byte 3 says 0 dimensions");
  IdxArray out;
  uint64_t expected = 0;
  out.dims = read_dims(in, path, ndim, &expected);
  const uint64_t header = 4 + 4 * ndim;
  // An uncompressed file's size says it all before anything is read.
  if (!in.compressed() && static_cast<uint64_t>(st.st_size) > header + expected) {
    fail(path, "trailing garbage: " + std::to_string(st.st_size - header - expected) +
                   " bytes after the data, from byte " + std::to_string(header + expected));
  }
  // In pieces: the buffer grows with what the stream really holds, not with
  // what a corrupt header announces.
  constexpr uint64_t kPiece = 1 << 24;
  while (out.data.size() < expected) {
    const size_t have = out.data.size();
    out.data.resize(have + std::min(kPiece, expected - have));
    const size_t n = in.read(out.data.data() + have, out.data.size() - have);
    if (have + n < out.data.size()) {
      fail(path, "truncated: expected " + std::to_string(expected) + " data bytes from byte " +
                     std::to_string(header) + stream + ", found " + std::to_string(have + n));
    }
  }
  // One byte past the announced data is enough to refuse the file: a gzip
  // bomb stops here, not after decompressing the rest.
  uint8_t extra = 0;
  if (in.read(&extra, 1) == 1) {
    fail(path, "trailing garbage: the decompressed stream goes on past the " + std::to_string(expected) +
                   " data bytes its header announces, from byte " + std::to_string(header + expected));
  }
  return out;
}

}  // namespace perftrain::io
