#include "data/image_file.h"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "base/error.h"
#include "base/text.h"

// A private copy (others may link their own stb), with only the decoders the
// image inputs take.
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_PNM
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace perftrain::data {
namespace {

struct StbFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

}  // namespace

std::vector<uint8_t> read_image_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError("image " + base::printable(path) + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw RuntimeError("image " + base::printable(path) + ": cannot read: " + std::strerror(err));
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  ::close(fd);
  return bytes;
}

at::Tensor decode_image(const uint8_t* bytes, size_t size, const std::string& name) {
  if (size == 0) throw RuntimeError("image " + base::printable(name) + ": the file is empty");
  if (size > static_cast<size_t>(INT32_MAX))
    throw RuntimeError("image " + base::printable(name) + ": " + std::to_string(size) + " bytes is too large to decode");
  int w = 0, h = 0, channels = 0;
  std::unique_ptr<stbi_uc, StbFree> pixels(
      stbi_load_from_memory(bytes, static_cast<int>(size), &w, &h, &channels, /*req_comp=*/3));
  if (!pixels) {
    const char* why = stbi_failure_reason();
    throw RuntimeError("image " + base::printable(name) + ": cannot decode (" +
                       (why ? std::string(why) : std::string("unknown format")) +
                       "; JPEG, PNG, BMP and PNM are read)");
  }
  at::Tensor out = at::empty({h, w, 3}, at::kByte);
  std::memcpy(out.data_ptr<uint8_t>(), pixels.get(), static_cast<size_t>(h) * w * 3);
  return out;
}

at::Tensor read_image_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_image_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path);
}

}  // namespace perftrain::data
