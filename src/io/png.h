// PNG output for sample grids and plots, written atomically.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace perftrain::io {

// Writes 8-bit pixels, row-major height x width x channels (1 gray, 2 gray +
// alpha, 3 RGB, 4 RGBA). Throws UsageError on a bad size, RuntimeError when
// encoding or writing fails.
void save_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels);

// Tiles images [N, C, H, W] (C = 1 or 3, any float dtype, any device; values
// in [-1, 1], clamped, NaN shown as -1) into a grid of `nrow` images per row
// with 2 black pixels between and around them, like torchvision's make_grid.
void save_png_grid(const std::string& path, const at::Tensor& images, int64_t nrow);

}  // namespace perftrain::io
