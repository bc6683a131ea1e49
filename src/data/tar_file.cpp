#include "data/tar_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/text.h"

namespace perftrain::data {
namespace {

constexpr int64_t kBlock = 512;

class File {
 public:
  explicit File(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw RuntimeError("tar shard " + base::printable(path) + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      throw RuntimeError("tar shard " + base::printable(path) + ": cannot stat: " + std::strerror(err));
    }
    size_ = st.st_size;
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int64_t size() const { return size_; }
  // Exactly n bytes at offset, or false (a short file).
  bool read(int64_t offset, void* out, int64_t n) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, static_cast<size_t>(n), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      p += got, offset += got, n -= got;
    }
    return true;
  }

 private:
  std::string path_;
  int fd_;
  int64_t size_ = 0;
};

std::string field(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// A numeric header field: octal text (spaces and NULs around it), or GNU's
// base-256 (first byte's high bit set) for values over 8 GiB.
bool number(const unsigned char* p, size_t n, int64_t& out) {
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return false;  // negative
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return false;
      v = (v << 8) | p[i];
    }
    out = static_cast<int64_t>(v);
    return true;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == 0)) ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i, any = true) {
    if (v >> 60) return false;
    v = v * 8 + (p[i] - '0');
  }
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != 0) return false;
  out = static_cast<int64_t>(v);
  return any;
}

bool all_zero(const unsigned char* h) {
  for (int64_t i = 0; i < kBlock; ++i)
    if (h[i] != 0) return false;
  return true;
}

bool checksum_ok(const unsigned char* h) {
  int64_t stored = 0;
  if (!number(h + 148, 8, stored)) return false;
  int64_t sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return sum == stored;
}

// "path" from a pax extended header's records ("<len> key=value\n" each).
std::string pax_path(const std::string& records) {
  std::string path;
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const size_t len = std::strtoull(records.c_str() + at, nullptr, 10);
    if (len == 0 || at + len > records.size()) break;
    const std::string kv = records.substr(space + 1, at + len - space - 2);  // without the newline
    if (kv.rfind("path=", 0) == 0) path = kv.substr(5);
    at += len;
  }
  return path;
}

std::string where(const std::string& path, int64_t offset) {
  return "tar shard " + base::printable(path) + " (header at byte " + std::to_string(offset) + ")";
}

}  // namespace

std::vector<TarMember> list_tar(const std::string& path) {
  const File f(path);
  std::vector<TarMember> out;
  std::string long_name;  // from an 'L' or 'x' header, for the next member
  unsigned char h[kBlock];
  int64_t at = 0;
  while (at + kBlock <= f.size()) {
    if (!f.read(at, h, kBlock)) throw RuntimeError(where(path, at) + ": cannot read");
    if (all_zero(h)) break;  // the end-of-archive blocks
    if (!checksum_ok(h)) throw RuntimeError(where(path, at) + ": not a tar header (bad checksum)");
    int64_t size = 0;
    if (!number(h + 124, 12, size)) throw RuntimeError(where(path, at) + ": the size field is not a number");
    const int64_t data = at + kBlock;
    if (size > f.size() - data)
      throw RuntimeError(where(path, at) + ": the member needs " + std::to_string(size) + " bytes but the file ends at " +
                         std::to_string(f.size()) + " (truncated)");
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {
      std::string text(static_cast<size_t>(size), '\0');
      if (!f.read(data, text.data(), size)) throw RuntimeError(where(path, at) + ": cannot read");
      std::string name = type == 'L' ? field(text.data(), text.size()) : pax_path(text);
      if (!name.empty()) long_name = std::move(name);
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string name = field(reinterpret_cast<const char*>(h), 100);
      const std::string prefix = field(reinterpret_cast<const char*>(h) + 345, 155);
      if (std::memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty()) name = prefix + "/" + name;
      if (!long_name.empty()) name = std::move(long_name);
      out.push_back({name, data, size});
      long_name.clear();
    } else {
      long_name.clear();  // directories, links, global headers: nothing to read
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return out;
}

std::vector<uint8_t> read_tar_member(const std::string& path, const TarMember& member) {
  const File f(path);
  std::vector<uint8_t> bytes(static_cast<size_t>(member.size));
  if (!f.read(member.offset, bytes.data(), member.size))
    throw RuntimeError("tar shard " + base::printable(path) + ": cannot read member " + base::printable(member.name) +
                       " (" + std::to_string(member.size) + " bytes at " + std::to_string(member.offset) +
                       "; the file has " + std::to_string(f.size()) + ")");
  return bytes;
}

namespace {

// The alternatives of the brace body "a,b" or "lo..hi".
std::vector<std::string> alternatives(const std::string& body) {
  const size_t dots = body.find("..");
  auto is_int = [](const std::string& s) {
    size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
    if (i == s.size()) return false;
    for (; i < s.size(); ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    return true;
  };
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    if (is_int(a) && is_int(b) && a.size() < 19 && b.size() < 19) {
      const long long lo = std::stoll(a), hi = std::stoll(b);
      const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
      const size_t width = padded ? std::max(a.size(), b.size()) : 0;
      std::vector<std::string> out;
      for (long long v = lo;; v += lo <= hi ? 1 : -1) {
        std::string s = std::to_string(v < 0 ? -v : v);
        if (s.size() + (v < 0) < width) s.insert(0, width - s.size() - (v < 0), '0');
        out.push_back((v < 0 ? "-" : "") + s);
        if (v == hi) break;
      }
      return out;
    }
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = body.find(',', start);
    out.push_back(body.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void expand_one(const std::string& pattern, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos)
      throw UsageError("shard pattern '" + base::printable(whole) + "': a '}' without its '{'");
    out.push_back(pattern);
    return;
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos || pattern.find('{', open + 1) < close)
    throw UsageError("shard pattern '" + base::printable(whole) + "': a '{' without its '}' (braces do not nest)");
  if (pattern.find('}') < open)
    throw UsageError("shard pattern '" + base::printable(whole) + "': a '}' without its '{'");
  for (const std::string& alt : alternatives(pattern.substr(open + 1, close - open - 1)))
    expand_one(pattern.substr(0, open) + alt + pattern.substr(close + 1), whole, out);
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t sep = pattern.find("::", start);
    const std::string one = pattern.substr(start, sep == std::string::npos ? std::string::npos : sep - start);
    if (!one.empty()) expand_one(one, pattern, out);
    if (sep == std::string::npos) break;
    start = sep + 2;
  }
  return out;
}

}  // namespace perftrain::data
