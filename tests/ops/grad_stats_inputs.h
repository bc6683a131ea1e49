// Inputs shared by the grad_stats CPU and GPU tests: the monitor's bucket
// edges, every edge with its float neighbours plus special values, and random
// gradients over 18 decades with those values planted.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace perftrain::ops::grad_stats_inputs {

// The monitor's 114 edges (observe::grad_histogram_limits() but the last), float32.
inline at::Tensor monitor_edges() {
  std::vector<float> e;
  for (int k = 56; k >= 0; --k) e.push_back(static_cast<float>(-std::pow(10.0, -12.0 + k / 4.0)));
  for (int k = 0; k < 57; ++k) e.push_back(static_cast<float>(std::pow(10.0, -12.0 + k / 4.0)));
  return at::tensor(e, at::kFloat);
}

// Every edge times `scale` and its float neighbours, plus the special values.
inline std::vector<float> edge_and_special_values(const at::Tensor& edges, float scale) {
  std::vector<float> v;
  const at::Tensor ec = edges.cpu().contiguous();
  const float* e = ec.data_ptr<float>();
  for (int64_t i = 0; i < ec.numel(); ++i) {
    const float s = e[i] * scale;
    v.insert(v.end(), {s, std::nextafter(s, INFINITY), std::nextafter(s, -INFINITY)});
  }
  for (float s : {0.f, -0.f, 1e-45f, -1e-45f, 1.1e-38f, -2e-39f, 1e-30f, -1e-25f, 3e-13f, 99.99f, 100.f, -100.f,
                  1e15f, -1e18f, 2.5e38f, -3.3e38f})
    v.push_back(s);
  return v;
}

// Random values over 18 decades of both signs with `specials` planted, on the CPU.
inline at::Tensor planted(at::IntArrayRef shape, const std::vector<float>& specials, at::ScalarType dtype) {
  at::Tensor g = at::randn(shape) * at::pow(10.0, at::rand(shape) * 18 - 15);
  auto flat = g.view(-1);
  for (size_t i = 0; i < specials.size() && static_cast<int64_t>(i) < flat.numel(); ++i)
    flat[static_cast<int64_t>((i * 7919) % flat.numel())] = specials[i];
  return g.to(dtype);
}

}  // namespace perftrain::ops::grad_stats_inputs
