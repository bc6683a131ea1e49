// One image file decoded to pixels, with Debian's stb_image: JPEG (baseline
// and progressive), PNG (8 and 16 bit, palette, grey, alpha), BMP and PNM.
//
// Contract (the image inputs, `perftrain extract`):
// - the result is a CPU uint8 tensor [H, W, 3], contiguous, RGB: grey is
//   repeated into the three channels and alpha is dropped (as PIL's
//   convert("RGB"), which torchvision's ImageFolder loader calls); 16-bit
//   samples keep their high byte; no EXIF rotation (PIL applies none either).
// - a file that cannot be read or decoded is a RuntimeError whose one line
//   names `name` (the path, or "shard.tar:member" for bytes out of a tar
//   shard) and says why.
// - safe to call from several threads at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::data {

// Decodes `size` bytes of an encoded image; `name` is what errors call it.
at::Tensor decode_image(const uint8_t* bytes, size_t size, const std::string& name);

// The bytes of the file at `path` (RuntimeError naming it when unreadable).
std::vector<uint8_t> read_image_bytes(const std::string& path);

// Reads and decodes the file at `path`.
at::Tensor read_image_file(const std::string& path);

}  // namespace perftrain::data
