#include "ops/gemm_bias_gelu.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include "compat/compat.h"
#include "kernels/column_sums.h"
#include "kernels/gemm_bias_gelu_sm90.h"

namespace perftrain::ops {

namespace {

// bf16, 2-D, contiguous, on the GPU.
bool dense_bf16(const at::Tensor& t) {
  return t.is_cuda() && t.dim() == 2 && t.scalar_type() == at::kBFloat16 && t.is_contiguous();
}

}  // namespace

bool try_gemm_bias_gelu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                             const at::Tensor& act) {
  if (!dense_bf16(x) || !dense_bf16(w) || !dense_bf16(pre) || !dense_bf16(act) || b.dim() != 1 ||
      !b.is_contiguous() || (b.scalar_type() != at::kFloat && b.scalar_type() != at::kBFloat16))
    return false;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  if (w.size(1) != k || b.size(0) != n || pre.sizes() != at::IntArrayRef{m, n} || act.sizes() != pre.sizes() ||
      !kernels::gemm_bias_gelu_sm90_supported(m, n, k) || !compat::current_device_is_sm90())
    return false;
  const auto* xp = static_cast<const __nv_bfloat16*>(x.data_ptr());
  const auto* wp = static_cast<const __nv_bfloat16*>(w.data_ptr());
  auto* pp = static_cast<__nv_bfloat16*>(pre.data_ptr());
  auto* ap = static_cast<__nv_bfloat16*>(act.data_ptr());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (b.scalar_type() == at::kFloat) {
    kernels::gemm_bias_gelu_sm90<float>(xp, wp, b.data_ptr<float>(), pp, ap, m, n, k, stream);
  } else {
    kernels::gemm_bias_gelu_sm90<__nv_bfloat16>(xp, wp, static_cast<const __nv_bfloat16*>(b.data_ptr()), pp, ap,
                                                m, n, k, stream);
  }
  return true;
}

bool try_gemm_dgelu_sm90(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre,
                         const at::Tensor& db1) {
  if (!dense_bf16(dy) || !dense_bf16(w2) || !dense_bf16(pre) || !dense_bf16(dpre)) return false;
  const int64_t m = dy.size(0), k = dy.size(1), n = w2.size(1);
  if (w2.size(0) != k || pre.sizes() != at::IntArrayRef{m, n} || dpre.sizes() != pre.sizes() ||
      !kernels::gemm_dgelu_sm90_supported(m, n, k) || !compat::current_device_is_sm90())
    return false;
  if (db1.defined() && (!db1.is_cuda() || db1.scalar_type() != at::kFloat || db1.dim() != 1 || db1.size(0) != n ||
                        !db1.is_contiguous()))
    return false;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // Shape-determined scratch from the caching allocator: fine under capture.
  const at::Tensor partials = db1.defined() ? at::empty({m / 128, n}, db1.options()) : at::Tensor();
  kernels::gemm_dgelu_sm90(static_cast<const __nv_bfloat16*>(dy.data_ptr()),
                           static_cast<const __nv_bfloat16*>(w2.data_ptr()),
                           static_cast<const __nv_bfloat16*>(pre.data_ptr()),
                           static_cast<__nv_bfloat16*>(dpre.data_ptr()),
                           partials.defined() ? partials.data_ptr<float>() : nullptr, m, n, k, stream);
  if (db1.defined()) {
    float* out = db1.data_ptr<float>();
    kernels::column_sums_reduce(partials.data_ptr<float>(), &out, 1, int(m / 128), int(n), stream);
  }
  return true;
}

bool try_gemm_swiglu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& gate_up, const at::Tensor& h) {
  if (!dense_bf16(x) || !dense_bf16(w) || !dense_bf16(gate_up) || !dense_bf16(h)) return false;
  const int64_t m = x.size(0), k = x.size(1), f = h.size(1);
  if (w.size(1) != k || w.size(0) != 2 * f || h.size(0) != m || gate_up.sizes() != at::IntArrayRef{m, 2 * f} ||
      !kernels::gemm_swiglu_sm90_supported(m, f, k) || !compat::current_device_is_sm90())
    return false;
  kernels::gemm_swiglu_sm90(static_cast<const __nv_bfloat16*>(x.data_ptr()),
                            static_cast<const __nv_bfloat16*>(w.data_ptr()),
                            static_cast<__nv_bfloat16*>(gate_up.data_ptr()), static_cast<__nv_bfloat16*>(h.data_ptr()),
                            m, f, k, at::cuda::getCurrentCUDAStream());
  return true;
}

}  // namespace perftrain::ops
