#include "ops/cublaslt_workspace.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "base/error.h"
#include "ops/cuda_capture.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {
namespace {

std::atomic<int64_t> g_fallbacks{0};
std::atomic<bool> g_tuning_open{true};
std::atomic<int> g_tune_candidates{kDefaultGemmTuneCandidates};

// Two workspaces per device: one for the training stream's products, one for
// the weight-gradient stream's (ops/weight_grad_stream), which run at the same
// time. Products on one stream run in order, so one workspace per stream is
// enough; the training stream is one at a time (eager or replayed graph).
void* workspace_for(int device, bool side) {
  static std::mutex mutex;
  static auto* buffers = new std::map<std::pair<int, bool>, at::Tensor>();  // kept to the end
  std::lock_guard<std::mutex> lock(mutex);
  auto it = buffers->find({device, side});
  if (it != buffers->end()) return it->second.data_ptr();
  if (current_stream_capturing()) {
    throw RuntimeError("cuBLASLt workspace: first use on cuda:" + std::to_string(device) +
                       " inside a CUDA graph capture; run one eager step before capturing");
  }
  at::Tensor w = at::empty({int64_t(side ? kSideCublasLtWorkspaceBytes : kCublasLtWorkspaceBytes)},
                           at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, device)));
  return buffers->emplace(std::make_pair(device, side), std::move(w)).first->second.data_ptr();
}

void check_matrix(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.dim() == 2 && t.is_contiguous() && t.is_cuda(), "try_gemm_lt: ", what,
              " must be a defined, contiguous 2-D CUDA tensor, got ",
              t.defined() ? t.sizes() : at::IntArrayRef{});
}

// The bias operand of g (length n, contiguous), for an epilogue that has one.
void set_bias(kernels::GemmArgs& g, const at::Tensor& bias) {
  TORCH_CHECK(bias.is_contiguous() && bias.dim() == 1, "try_gemm_lt: bias must be a contiguous vector");
  TORCH_CHECK(bias.size(0) == g.n, "try_gemm_lt: bias has ", bias.size(0), " elements, the epilogue needs ", g.n);
  g.bias = bias.data_ptr();
  g.bias_type = gemm_dtype(bias.scalar_type(), "bias");
}

// Runs g on the current device's context; false where cuBLASLt refuses it.
std::mutex& refusal_mutex() {
  static std::mutex m;
  return m;
}

std::string& last_refusal() {
  static auto* s = new std::string();
  return *s;
}

bool run_gemm_lt(const kernels::GemmArgs& g) {
  try {
    kernels::gemm_lt(g, cublaslt_context());
  } catch (const kernels::GemmUnsupported& e) {
    const std::lock_guard<std::mutex> lock(refusal_mutex());
    last_refusal() = e.what();
    return false;
  }
  return true;
}

}  // namespace

kernels::GemmContext cublaslt_context() {
  kernels::GemmContext ctx;
  const int device = c10::cuda::current_device();
  const bool side = on_weight_grad_stream();
  ctx.workspace = workspace_for(device, side);
  ctx.workspace_bytes = side ? kSideCublasLtWorkspaceBytes : kCublasLtWorkspaceBytes;
  ctx.handle = at::cuda::getCurrentCUDABlasLtHandle();
  ctx.stream = at::cuda::getCurrentCUDAStream().stream();
  ctx.tune_candidates = gemm_tune_candidates();
  ctx.tune_now = gemm_tuning_open();
  return ctx;
}

kernels::GemmDtype gemm_dtype(at::ScalarType t, const char* what) {
  switch (t) {
    case at::kFloat: return kernels::GemmDtype::kF32;
    case at::kBFloat16: return kernels::GemmDtype::kBF16;
    case at::kHalf: return kernels::GemmDtype::kF16;
    default:
      throw UsageError(std::string(what) + " must be float32, bfloat16 or float16, got " +
                       std::string(c10::toString(t)));
  }
}

bool try_gemm_lt(const at::Tensor& a, bool trans_a, const at::Tensor& b, bool trans_b, const at::Tensor& d,
                 kernels::GemmEpilogue epilogue, const at::Tensor& bias, const at::Tensor& aux, bool accumulate) {
  check_matrix(a, "A");
  check_matrix(b, "B");
  check_matrix(d, "D");
  kernels::GemmArgs g;
  g.m = trans_a ? a.size(1) : a.size(0);
  g.k = trans_a ? a.size(0) : a.size(1);
  g.n = trans_b ? b.size(0) : b.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0);
  TORCH_CHECK(kb == g.k && d.size(0) == g.m && d.size(1) == g.n, "try_gemm_lt: shapes do not chain: op(A) [", g.m,
              ", ", g.k, "], op(B) [", kb, ", ", g.n, "], D ", d.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "try_gemm_lt: A and B dtypes differ");
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.d = d.data_ptr();
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.ab_type = gemm_dtype(a.scalar_type(), "matrix operand");
  g.d_type = gemm_dtype(d.scalar_type(), "matrix product output");
  g.epilogue = epilogue;
  g.accumulate = accumulate;
  if (bias.defined()) set_bias(g, bias);
  if (aux.defined()) {
    TORCH_CHECK(aux.is_contiguous() && aux.sizes() == d.sizes() && aux.scalar_type() == d.scalar_type(),
                "try_gemm_lt: aux must be contiguous with D's shape and dtype");
    g.aux = aux.data_ptr();
  }
  return run_gemm_lt(g);
}

namespace {

kernels::GemmDtype fp8_gemm_dtype(at::ScalarType t) {
  if (t == at::kFloat8_e4m3fn) return kernels::GemmDtype::kE4M3;
  TORCH_CHECK(t == at::kFloat8_e5m2, "try_gemm_lt_fp8: operands must be float8_e4m3fn or float8_e5m2, got ", t);
  return kernels::GemmDtype::kE5M2;
}

const float* scalar_ptr(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.numel() == 1 && t.scalar_type() == at::kFloat && t.is_cuda(), "try_gemm_lt_fp8: ",
              what, " must be one float32 CUDA element");
  return t.data_ptr<float>();
}

}  // namespace

bool try_gemm_lt_fp8(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                     const at::Tensor& b_scale_inv, const at::Tensor& d, bool fast_accum, const at::Tensor& bias) {
  check_matrix(a, "A");
  check_matrix(b, "B");
  check_matrix(d, "D");
  kernels::GemmArgs g;
  g.m = a.size(0);
  g.k = a.size(1);
  g.n = b.size(0);
  TORCH_CHECK(b.size(1) == g.k && d.size(0) == g.m && d.size(1) == g.n, "try_gemm_lt_fp8: shapes do not chain: A ",
              a.sizes(), ", B ", b.sizes(), " (used as B^T), D ", d.sizes());
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.d = d.data_ptr();
  g.trans_b = true;
  g.ab_type = fp8_gemm_dtype(a.scalar_type());
  g.b_fp8_type = fp8_gemm_dtype(b.scalar_type());
  g.d_type = gemm_dtype(d.scalar_type(), "fp8 product output");
  g.a_scale_inv = scalar_ptr(a_scale_inv, "a_scale_inv");
  g.b_scale_inv = scalar_ptr(b_scale_inv, "b_scale_inv");
  g.fast_accum = fast_accum;
  if (bias.defined()) {
    g.epilogue = kernels::GemmEpilogue::kBias;
    set_bias(g, bias);
  }
  return run_gemm_lt(g);
}

int64_t gemm_fallback_count() { return g_fallbacks.load(); }

std::string gemm_last_refusal() {
  const std::lock_guard<std::mutex> lock(refusal_mutex());
  return last_refusal();
}

void note_gemm_fallback() { g_fallbacks.fetch_add(1); }

bool gemm_tuning_open() { return g_tuning_open.load(); }

GemmTuningDeferred::GemmTuningDeferred(bool active) : active_(active), was_open_(g_tuning_open.load()) {
  if (active_) g_tuning_open.store(false);
}

GemmTuningDeferred::~GemmTuningDeferred() {
  if (active_) g_tuning_open.store(was_open_);
}

int gemm_tune_candidates() { return g_tune_candidates.load(); }
void set_gemm_tune_candidates(int n) { g_tune_candidates.store(n < 0 ? 0 : n); }
std::vector<kernels::GemmTuneRecord> gemm_tune_records() { return kernels::gemm_tune_records(); }

}  // namespace perftrain::ops
