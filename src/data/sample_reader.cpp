#include "data/sample_reader.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "base/text.h"

namespace perftrain::data {
namespace {

// The whole of n bytes at offset, retrying short reads and EINTR; the bytes
// read (fewer at the end of the file).
int64_t pread_fully(int fd, void* buf, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(buf) + done, static_cast<size_t>(n - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += r;
  }
  return done;
}

// Each shard keeps a descriptor open; a directory of thousands of shards
// needs more than the usual soft limit of 1024, so raise it to the hard limit
// once.
void raise_open_file_limit() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct rlimit r {};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &r);
    }
  });
}

template <typename T>
void convert(const T* src, int64_t n, float* out) {
  for (int64_t e = 0; e < n; ++e) out[e] = static_cast<float>(src[e]);
}

// The index of the first NaN or inf, or -1. On the bits (exponent all ones),
// which the compiler vectorises, where std::isfinite in a loop is 3x slower.
int64_t first_non_finite(const float* v, int64_t n) {
  uint32_t any = 0;
  for (int64_t e = 0; e < n; ++e) {
    uint32_t b;
    std::memcpy(&b, v + e, sizeof b);
    any |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return -1;
  for (int64_t e = 0; e < n; ++e)
    if (!std::isfinite(v[e])) return e;
  return -1;
}

}  // namespace

struct SampleReader::Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

SampleReader SampleReader::open(const io::SafetensorsFile& file, const std::string& name) {
  SampleReader r;
  r.path_ = file.path();
  const std::string shown = base::printable(r.path_);  // for messages
  r.name_ = name;
  const at::Tensor t = file.get(name);  // a view: dtype and shape, no bytes touched
  r.dtype_ = t.scalar_type();
  r.n_ = t.dim() > 0 ? t.size(0) : 0;
  r.numel_ = r.n_ > 0 ? t.numel() / r.n_ : 0;

  raise_open_file_limit();
  r.fd_ = std::make_shared<Fd>();
  r.fd_->fd = ::open(r.path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_->fd < 0) throw RuntimeError(shown + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(r.fd_->fd, &st) != 0) throw RuntimeError(shown + ": cannot stat: " + std::strerror(errno));
  r.file_size_ = static_cast<int64_t>(st.st_size);

  // The tensor's offset from the header (the file was checked at open):
  // little-endian u64 header length, the JSON header, then the data.
  unsigned char len_bytes[8];
  if (pread_fully(r.fd_->fd, len_bytes, 8, 0) != 8) throw RuntimeError(shown + ": cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > static_cast<uint64_t>(r.file_size_) - 8)
    throw RuntimeError(shown + ": the header runs past the end of the file (changed since it was opened?)");
  std::string header(header_len, '\0');
  if (pread_fully(r.fd_->fd, header.data(), static_cast<int64_t>(header_len), 8) != static_cast<int64_t>(header_len))
    throw RuntimeError(shown + ": cannot read the header");
  int64_t begin = -1;
  try {
    begin = nlohmann::json::parse(header).at(name).at("data_offsets").at(0).get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    throw RuntimeError(shown + ": no data offsets for '" + name + "' in the header (changed since it was opened?)");
  }
  r.offset_ = static_cast<int64_t>(8 + header_len) + begin;
  return r;
}

void SampleReader::read(int64_t j, float* out) const {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype_));
  const int64_t bytes = numel_ * elem, pos = offset_ + j * bytes;
  thread_local std::vector<unsigned char> staging;
  void* dst = out;
  if (dtype_ != at::kFloat) {
    staging.resize(static_cast<size_t>(bytes));
    dst = staging.data();
  }
  if (pread_fully(fd_->fd, dst, bytes, pos) != bytes) {
    struct stat st {};
    const int64_t now = ::fstat(fd_->fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
    throw RuntimeError(base::printable(path_) + ": cannot read sample " + std::to_string(j) + " of '" + name_ +
                       "' (bytes " + std::to_string(pos) + " to " + std::to_string(pos + bytes) + "): the file is " +
                       std::to_string(now) + " bytes now, " + std::to_string(file_size_) +
                       " when training started; was it changed or truncated while training?");
  }
  if (dtype_ == at::kHalf) convert(reinterpret_cast<const c10::Half*>(staging.data()), numel_, out);
  else if (dtype_ == at::kBFloat16) convert(reinterpret_cast<const c10::BFloat16*>(staging.data()), numel_, out);
  const int64_t bad = first_non_finite(out, numel_);
  if (bad >= 0)
    throw RuntimeError("data error: " + base::printable(path_) + ": sample " + std::to_string(j) + " of '" + name_ +
                       "' holds " + (std::isnan(out[bad]) ? "NaN" : "inf") + " (element " + std::to_string(bad) +
                       " of " + std::to_string(numel_) + "); fix or remove that shard");
}

}  // namespace perftrain::data
