// What the matrix-product ops (linear, gelu_mlp) share to call cuBLASLt from
// tensors: the handle, stream and workspace of the current device, the
// tensor -> kernels::GemmArgs plumbing, and the count of products that fell
// back to plain ATen because cuBLASLt refused their fused epilogue.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm_lt.h"

namespace perftrain::ops {

// Bytes of a cuBLASLt workspace; a device has two, one for the training
// stream and one for the weight-gradient stream (ops/weight_grad_stream.h).
// The training stream's is 32 MiB: with less, the tuner finds slower split-K
// products. The weight-gradient stream opens only for small steps, whose
// weight gradients need little split-K scratch: 8 MiB.
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kSideCublasLtWorkspaceBytes = size_t(8) << 20;

// Handle (ATen's, per thread and device), the workspace of the current
// device and stream (allocated on first use and kept for the life of the
// process) and the current stream. The first call on a device must not be
// inside a CUDA graph capture (an eager warm-up step does it): it throws
// RuntimeError there.
kernels::GemmContext cublaslt_context();

// bf16 / fp16 / fp32; anything else throws UsageError naming `what`.
kernels::GemmDtype gemm_dtype(at::ScalarType t, const char* what);

// d = epilogue(op(a) op(b)) on 2-D contiguous CUDA tensors (a [m,k] or
// [k,m] when trans_a, b [k,n] or [n,k] when trans_b, d [m,n]), bias/aux as
// kernels::GemmArgs describes. Returns false, launching nothing, when
// cuBLASLt has no algorithm for it; the caller then falls back. With
// accumulate, d += ... (d's old contents are read).
bool try_gemm_lt(const at::Tensor& a, bool trans_a, const at::Tensor& b, bool trans_b, const at::Tensor& d,
                 kernels::GemmEpilogue epilogue, const at::Tensor& bias = at::Tensor(),
                 const at::Tensor& aux = at::Tensor(), bool accumulate = false);

// The fp8 product d [m, n] = a_scale_inv * b_scale_inv * a [m, k] b [n, k]^T
// (+ bias [n]) on contiguous CUDA tensors: a and b in at::kFloat8_e4m3fn or
// at::kFloat8_e5m2 (not both e5m2), d bf16 or fp32, the scale_invs one fp32
// element each (device), fast_accum as kernels::GemmArgs says. Returns
// false, launching nothing, where cuBLASLt cannot run it (kernels/gemm_lt.h
// lists its fp8 rules: sizes multiples of 16, 16-byte alignment, ...).
bool try_gemm_lt_fp8(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                     const at::Tensor& b_scale_inv, const at::Tensor& d, bool fast_accum,
                     const at::Tensor& bias = at::Tensor());

// Whether a product of a and b goes to cuBLASLt: CUDA tensors with something
// to multiply. Empty products (and CPU tensors) go through ATen, which
// handles them and is not a fallback.
inline bool cublaslt_path(const at::Tensor& a, const at::Tensor& b) {
  return a.is_cuda() && a.numel() > 0 && b.numel() > 0;
}

// How many products, since the process started, ran as a plain ATen product
// (+ ATen epilogue ops) because cuBLASLt refused the fused form. 0 on the
// DiT shapes is expected; tests and the benchmark report it.
int64_t gemm_fallback_count();
// Counts one more (for the ops that fall back).
void note_gemm_fallback();
// What cuBLASLt said of the last product it refused in this process (the
// product and the reason), or "" where it refused none.
std::string gemm_last_refusal();

// How many of cuBLASLt's candidate algorithms each product configuration
// times on its first eligible call (kernels::GemmContext::tune_candidates);
// 0 takes the heuristic's first pick. Tuning finds a faster algorithm for
// about half of DiT's configurations, for well under a second more before
// the first step. The choice comes from timings, so two processes may pick
// different algorithms (last-bit differences between runs, as with cuDNN's
// benchmark mode); 0 makes the choice fixed.
constexpr int kDefaultGemmTuneCandidates = 8;
int gemm_tune_candidates();
// Process-wide (the [speed] key gemm_tune, 0..64); set before the first product.
void set_gemm_tune_candidates(int n);
// What the tuning chose, per product configuration (for reports).
std::vector<kernels::GemmTuneRecord> gemm_tune_records();

// Whether products may do their timing now (GemmContext::tune_now); true
// except inside a GemmTuningDeferred. Process-wide: the backward runs on
// autograd's threads.
bool gemm_tuning_open();

// While alive (and `active`), products run on cuBLASLt's first pick and time
// nothing; the shapes they meet are tuned by their first call after it. The
// step runner holds one over a run's first step, so that timing ~100
// candidate kernels (each loaded on first use) is not in the time to the
// first step, and the warm-up steps after it do the tuning.
class GemmTuningDeferred {
 public:
  explicit GemmTuningDeferred(bool active = true);
  ~GemmTuningDeferred();
  GemmTuningDeferred(const GemmTuningDeferred&) = delete;
  GemmTuningDeferred& operator=(const GemmTuningDeferred&) = delete;

 private:
  bool active_, was_open_;
};

}  // namespace perftrain::ops
