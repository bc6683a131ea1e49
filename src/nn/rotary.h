// Rotary position embedding over up to three position axes (axis 0: a
// sequence index, for condition tokens and later a frame; axes 1, 2: image
// row and column). The head dimension is split between the axes; each axis
// rotates its own consecutive pairs (x[2k], x[2k+1]) by pos * theta^(-2k/d).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <utility>
#include <vector>

namespace perftrain::nn {

// The head dimension's split: rows and columns 3/8 each (rounded down to
// even), axis 0 the rest. Head dim 64 -> {16, 24, 24}, 72 -> {20, 26, 26}.
std::array<int64_t, 3> rope_axes(int64_t head_dim);

// positions: one (axis0, axis1, axis2) per token. Returns cos and sin
// [T, head_dim/2] float32 (CPU), computed in double.
std::pair<at::Tensor, at::Tensor> rope_tables(const std::vector<std::array<int64_t, 3>>& positions,
                                              int64_t head_dim, double theta = 10000.0);

// x [..., T, head_dim]; cos, sin [T, head_dim/2]. Rotated in float32,
// returned in x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace perftrain::nn
