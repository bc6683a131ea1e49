// A small generated image folder (torchvision's ImageFolder layout: one
// sub-folder per class) of PNGs, for the extract tests.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randint.h>

#include <string>

#include "base/fs.h"
#include "io/png.h"

namespace perftrain::testing {

// `classes` folders ("class0", ...) of `per_class` random RGB images each,
// of width x height pixels (the last image of each class twice as wide, so
// that the centre crop resizes and crops). Returns the folder.
inline std::string write_image_folder(const std::string& dir, int classes, int per_class, int width, int height,
                                      uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int c = 0; c < classes; ++c) {
    const std::string folder = dir + "/class" + std::to_string(c);
    fs::create_directories(folder);
    for (int i = 0; i < per_class; ++i) {
      const int w = i == per_class - 1 ? 2 * width : width;
      const at::Tensor px = at::randint(0, 256, {height, w, 3}, gen, at::TensorOptions().dtype(at::kByte));
      io::save_png(folder + "/img" + std::to_string(i) + ".png", px.data_ptr<uint8_t>(), w, height, 3);
    }
  }
  return dir;
}

}  // namespace perftrain::testing
