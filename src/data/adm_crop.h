// ADM's centre crop (guided-diffusion's image_datasets.py `center_crop_arr`),
// the transform facebookresearch/DiT's train.py applies to every image, with
// PIL's resampling reproduced so that pixels equal what PIL gives:
//   while min(W, H) >= 2 * size: resize to (W // 2, H // 2) with BOX;
//   resize to (round(W * s), round(H * s)), s = size / min(W, H), BICUBIC
//     (round: Python's, half to even);
//   crop size x size at ((H' - size) // 2, (W' - size) // 2).
//
// Contract (the image inputs, `perftrain extract`):
// - `rgb` is a CPU uint8 tensor [H, W, C] (C >= 1; contiguous or not), the
//   result a new contiguous uint8 tensor [size, size, C];
// - pixels are PIL's (Pillow's libImaging/Resample.c: the separable
//   convolution in two passes, in the order Pillow 13 picks, the filter's
//   support scaled by the downscale factor, bicubic a = -0.5, 22-bit
//   fixed-point coefficients, each pass rounded and clipped to uint8),
//   checked against the installed Pillow by tests/data/adm_crop_test.cpp;
// - UsageError for size < 1, an empty image or the wrong dtype/rank.
// Thread-safe (no state).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace perftrain::data {

at::Tensor adm_center_crop(const at::Tensor& rgb, int64_t size);

// PIL's Image.resize(rgb, (width, height), resample) for the two filters the
// crop uses, on uint8 [H, W, C]; the same size returns a copy, as PIL does.
enum class PilFilter { kBox, kBicubic };
at::Tensor pil_resize(const at::Tensor& rgb, int64_t width, int64_t height, PilFilter filter);

}  // namespace perftrain::data
