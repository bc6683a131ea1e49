#include "ops/gemm_bias_gelu.h"

#include <ATen/cuda/CUDAContext.h>

#include "base/env.h"
#include "kernels/gemm_bias_gelu_sm90.h"

namespace perftrain::ops {

bool own_fc1_product() {
  static const bool on = env_equals("PERFTRAIN_FC1_GEMM", "sm90");
  return on;
}

bool try_gemm_bias_gelu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                             const at::Tensor& act) {
  const auto bf16 = at::kBFloat16;
  if (!x.is_cuda() || x.dim() != 2 || w.dim() != 2 || b.dim() != 1 || x.scalar_type() != bf16 ||
      w.scalar_type() != bf16 || pre.scalar_type() != bf16 || act.scalar_type() != bf16 ||
      (b.scalar_type() != at::kFloat && b.scalar_type() != bf16))
    return false;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  if (w.size(1) != k || b.size(0) != n || pre.sizes() != at::IntArrayRef{m, n} || act.sizes() != pre.sizes() ||
      !x.is_contiguous() || !w.is_contiguous() || !b.is_contiguous() || !pre.is_contiguous() ||
      !act.is_contiguous() || !kernels::gemm_bias_gelu_sm90_supported(m, n, k))
    return false;
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  if (props->major != 9 || props->minor != 0) return false;
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

}  // namespace perftrain::ops
