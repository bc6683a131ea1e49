// What the GPU tests of the matrix-product ops share (cublaslt_gemm,
// linear, gelu_mlp): seeded CUDA generators, random inputs and fp32 masters
// exactly representable in the compute dtype, a NaN-aware relative L2 with
// its tolerance per compute dtype, NaN-poisoned outputs, the fallback count
// around a body, and the CUDA-graph check with a changed input.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "ops/cublaslt_workspace.h"

namespace perftrain::ops::gpu_products {

inline const at::Device kCuda(at::kCUDA, 0);

// Rows of the op tests: a single row, an odd count, DiT-S/2 b32 and b256.
inline const std::vector<int64_t> kRows = {1, 7, 8192, 65536};

inline at::Generator cuda_gen(uint64_t seed) {
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(seed);
  return g;
}

// N(shift, scale^2) in dtype dt on the GPU.
inline at::Tensor rnd(at::IntArrayRef shape, at::Generator& g, at::ScalarType dt, double scale = 1.0,
                      double shift = 0.0) {
  return (at::randn(shape, g, at::TensorOptions().device(kCuda)) * scale + shift).to(dt);
}

// fp32 master values exactly representable in dt, so that the per-call
// cast inside the ops is exact and the float64 reference multiplies the
// very numbers the Tensor Cores see.
inline at::Tensor master(at::IntArrayRef shape, at::Generator& g, at::ScalarType dt, double scale) {
  return rnd(shape, g, at::kFloat, scale).to(dt).to(at::kFloat);
}

// ||got - ref|| / ||ref||, NaN if got has any NaN.
inline double rel_l2(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor g = got.to(at::kDouble), r = ref.to(at::kDouble);
  if (g.isnan().any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
  return (g - r).norm().item<double>() / r.norm().item<double>();
}

// Relative L2 tolerances per compute dtype: bf16 8 mantissa bits (outputs
// rounded to 2^-9 relative), fp32 through TF32 (inputs rounded to 2^-11),
// fp16 11 bits. A NaN fails (NaN < tol is false).
inline double tolerance(at::ScalarType dt) { return dt == at::kBFloat16 ? 1e-2 : dt == at::kHalf ? 5e-3 : 2e-3; }

inline at::Tensor nan_like(at::IntArrayRef shape, at::ScalarType dt) {
  return at::full(shape, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().device(kCuda).dtype(dt));
}

inline std::string case_name(const char* op, at::ScalarType dt, int64_t m, int64_t k, int64_t n) {
  return std::string(op) + " " + c10::toString(dt) + " M=" + std::to_string(m) + " K=" + std::to_string(k) +
         " N=" + std::to_string(n);
}

// Runs `body` and checks the fallback count: 0 expected on the DiT shapes at
// training batch sizes; every case that fell back is printed.
template <class F>
void count_fallbacks(const std::string& name, bool must_be_fused, F body) {
  const int64_t before = gemm_fallback_count();
  body();
  const int64_t fell_back = gemm_fallback_count() - before;
  if (fell_back != 0)
    std::printf("[gemm] %s: %lld product(s) fell back to ATen; the last refusal: %s\n", name.c_str(),
                (long long)fell_back, gemm_last_refusal().c_str());
  if (must_be_fused) EXPECT_EQ(fell_back, 0) << name << ": cuBLASLt refused a fused epilogue on a DiT shape";
}

// `step` (forward and backward) captured into a CUDA graph after one eager
// warm-up and replayed: no host sync, no data-dependent allocation, and each
// replay reproduces the eager values bit for bit (the same plans and
// algorithms run), also after `input` (a leaf the graph reads) takes the
// values of `next`. No product falls back.
inline void expect_capture_matches_eager(const std::function<std::vector<at::Tensor>()>& step,
                                         const at::Tensor& input, const at::Tensor& next) {
  compat::synchronize(kCuda);  // the inputs were made on the default stream
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
  const int64_t fallbacks = gemm_fallback_count();
  const auto eager = step();  // warm-up: plans, workspace, handles
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  const auto captured = step();
  graph.capture_end();
  auto expect_same = [&](const std::vector<at::Tensor>& want, const std::string& when) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (at::equal(captured[i], want[i])) continue;
      ADD_FAILURE() << when << ": output " << i << " differs from eager, relative L2 "
                    << rel_l2(captured[i], want[i]);
    }
  };
  for (int i = 0; i < 2; ++i) {
    graph.replay();
    at::cuda::getCurrentCUDAStream().synchronize();
    expect_same(eager, "replay " + std::to_string(i));
  }
  input.detach().copy_(next);  // the graph reads input's memory
  const auto eager_next = step();
  graph.replay();
  at::cuda::getCurrentCUDAStream().synchronize();
  expect_same(eager_next, "replay on new input");
  EXPECT_EQ(gemm_fallback_count(), fallbacks) << "the DiT-shaped capture should run fully fused; the last refusal: "
                                              << gemm_last_refusal();
}

}  // namespace perftrain::ops::gpu_products
