// What the matrix-product ops (linear, gelu_mlp) share to call cuBLASLt from
// tensors: the handle, stream and workspace of the current device, the
// tensor -> kernels::GemmArgs plumbing, and the count of products that fell
// back to plain ATen because cuBLASLt refused their fused epilogue.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/gemm_lt.h"

namespace perftrain::ops {

// Bytes of a cuBLASLt workspace; a device has two, one for the training
// stream and one for the weight-gradient stream (ops/weight_grad_lane.h).
// PERFTRAIN_LT_WORKSPACE_MIB=<n> (1..64) sets the training stream's; 32 MiB
// by default. 8 MiB took DiT-S/2 b32's peak from 1.96 to 1.94 GiB and the
// step from 5.37 to 5.45 ms (the tuner finds slower split-K products with
// less scratch); B/2 b256 within noise (67adaac, H200).
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;
size_t main_workspace_bytes();
// The weight-gradient stream's, 8 MiB: it opens only for small steps
// (DiT-S/2 up to b128, B/2 up to b64), whose weight gradients need little
// split-K scratch. At DiT-S/2 b32 (8b6687e, H200, one process per size):
// 32 MiB 5.43 ms and 1.99 GiB peak, 8 MiB 5.39 ms and 1.96 GiB, 2 MiB 5.44
// ms and 1.96 GiB. PERFTRAIN_LT_SIDE_WORKSPACE_MIB=<n> (1..32) sets it.
constexpr size_t kSideCublasLtWorkspaceBytes = size_t(8) << 20;
size_t side_workspace_bytes();

// Handle (ATen's, per thread and device), the workspace of the current
// device and stream (allocated on first use and kept for the life of the process) and
// the current stream. The first call on a device must not be inside a CUDA
// graph capture (an eager warm-up step does it): it throws RuntimeError there.
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
// Whether gelu_mlp's fc1 bias gradient rides in the DGELU_BGRAD epilogue, on
// by default; PERFTRAIN_BGRAD_EPILOGUE=0 takes it with at::sum instead, to compare.
bool bias_grad_epilogue();
// Whether linear's bias gradients come from cuBLASLt's BGRADB epilogue
// (PERFTRAIN_BGRADB=1) instead of ops::column_sums_into (the default).
// cuBLASLt 13.0 runs BGRADB as its own reduction kernel after the product at
// about 1 TB/s on the H200; it was still faster than at::sum (DiT-S/2 b256
// step 35.3 vs 36.5 ms), and the column-sum kernel is meant to beat both.
bool bgradb_epilogue();
void note_gemm_fallback();

// How many of cuBLASLt's candidate algorithms each product configuration
// times on its first eligible call (kernels::GemmContext::tune_candidates);
// PERFTRAIN_GEMM_TUNE=N overrides, 0 takes the heuristic's first pick. On the
// H200, 8 found a faster algorithm for about half of DiT's configurations
// (DGELU k=384 0.266 -> 0.230 ms, the XL/2 fc weight gradient 1.10 -> 0.91
// ms) and took the DiT-S/2 b256 step from 32.37 to 31.84 ms, for ~0.3-0.6 s
// more before the first step. The choice comes from timings, so two processes
// may pick different algorithms (last-bit differences between runs, as with
// cuDNN's benchmark mode); 0 makes the choice fixed.
constexpr int kDefaultGemmTuneCandidates = 8;
int gemm_tune_candidates();
// Process-wide (the [speed] key gemm_tune); set before the first product.
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
};  // for the ops that fall back

}  // namespace perftrain::ops
