#include "io/png.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC  // private copy: others may link their own stb
#include <stb_image_write.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "io/atomic_file.h"

namespace perftrain::io {

void save_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels) {
  if (width <= 0 || height <= 0 || channels < 1 || channels > 4) {
    throw UsageError("cannot write " + path + ": bad image size " + std::to_string(width) + "x" +
                     std::to_string(height) + "x" + std::to_string(channels));
  }
  std::vector<uint8_t> png;
  auto append = [](void* ctx, void* data, int size) {
    auto* out = static_cast<std::vector<uint8_t>*>(ctx);
    out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  };
  if (stbi_write_png_to_func(append, &png, width, height, channels, pixels, width * channels) == 0) {
    throw RuntimeError("cannot write " + path + ": PNG encoding failed");
  }
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, png.data(), png.size(), path); });
}

void save_png_grid(const std::string& path, const at::Tensor& images, int64_t nrow) {
  constexpr int64_t kPad = 2;
  if (!images.defined() || images.dim() != 4 || (images.size(1) != 1 && images.size(1) != 3) ||
      images.size(0) < 1 || images.size(2) < 1 || images.size(3) < 1) {
    throw UsageError("cannot write " + path + ": expected images [N, C, H, W] with N >= 1 and C = 1 or 3, got " +
                     (images.defined() ? c10::str(images.sizes()) : std::string("undefined")));
  }
  if (nrow < 1) throw UsageError("cannot write " + path + ": nrow must be >= 1, got " + std::to_string(nrow));
  const at::Tensor x = images.detach().to(at::kCPU, at::kFloat).contiguous();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t cols = std::min(nrow, n), rows = (n + cols - 1) / cols;
  const int64_t gw = cols * (w + kPad) + kPad, gh = rows * (h + kPad) + kPad;
  if (gw > (1 << 20) || gh > (1 << 20) || gw * gh * c > (int64_t(1) << 31)) {
    throw UsageError("cannot write " + path + ": grid of " + std::to_string(gw) + "x" +
                     std::to_string(gh) + " pixels is too large for a PNG");
  }
  std::vector<uint8_t> grid(static_cast<size_t>(gw * gh * c), 0);
  const float* src = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x0 = kPad + (i % cols) * (w + kPad), y0 = kPad + (i / cols) * (h + kPad);
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t yy = 0; yy < h; ++yy) {
        const float* row = src + ((i * c + ch) * h + yy) * w;
        uint8_t* dst = grid.data() + ((y0 + yy) * gw + x0) * c + ch;
        for (int64_t xx = 0; xx < w; ++xx) {
          float v = row[xx];
          v = v >= -1.0f ? std::min(v, 1.0f) : -1.0f;  // also maps NaN to -1
          dst[xx * c] = static_cast<uint8_t>((v + 1.0f) * 127.5f + 0.5f);
        }
      }
    }
  }
  save_png(path, grid.data(), static_cast<int>(gw), static_cast<int>(gh), static_cast<int>(c));
}

}  // namespace perftrain::io
