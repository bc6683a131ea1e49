#include "ops/qk_norm_rope.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/stack.h>

#include <string>

#include "base/error.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "qk_norm_rope";

// The widest head the CUDA kernels take (kernels/qk_norm_rope.h).
constexpr int64_t kMaxHeadDim = 256;

bool is_float_dtype(at::ScalarType t, bool allow_f64) { return is_kernel_dtype(t) || (allow_f64 && t == at::kDouble); }

// Every argument check, each failure a UsageError naming the op and the input.
// allow_f64: the reference also takes float64 (the tests' float64 references).
void check_args(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight, const at::Tensor& k_weight,
                const at::Tensor& cos, const at::Tensor& sin, double eps, bool allow_f64) {
  const std::string o(kOp);
  if (!qkv.defined()) throw UsageError(o + ": qkv must be a defined tensor");
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0 || qkv.size(2) == 0)
    throw UsageError(o + ": qkv must be [B, T, 3D] (q | k | v), got shape " + shape(qkv));
  const int64_t d = qkv.size(2) / 3;
  if (heads < 1 || d % heads != 0)
    throw UsageError(o + ": heads must be >= 1 and divide D = " + std::to_string(d) + ", got " + std::to_string(heads));
  const int64_t hd = d / heads, t = qkv.size(1);
  if (hd % 2 != 0) throw UsageError(o + ": the head dimension D / heads must be even, got " + std::to_string(hd));
  if (!is_float_dtype(qkv.scalar_type(), allow_f64))
    throw UsageError(o + ": qkv must be float32, bfloat16 or float16, got " + c10::toString(qkv.scalar_type()));
  if (!(eps >= 0)) throw UsageError(o + ": eps must be >= 0, got " + std::to_string(eps));
  auto same_device = [&](const at::Tensor& a, const char* name) {
    if (a.device() != qkv.device())
      throw UsageError(o + ": qkv is on " + qkv.device().str() + " but " + name + " is on " + a.device().str());
  };
  for (const auto& [w, name] : {std::pair<const at::Tensor&, const char*>{q_weight, "q_weight"},
                                std::pair<const at::Tensor&, const char*>{k_weight, "k_weight"}}) {
    if (!w.defined()) continue;
    if (w.dim() != 1 || w.size(0) != hd)
      throw UsageError(o + ": " + name + " must be [" + std::to_string(hd) + "] (the head dimension), got " +
                       shape(w));
    if (!is_float_dtype(w.scalar_type(), true))
      throw UsageError(o + ": " + name + " must be float32, bfloat16, float16 or float64, got " +
                       c10::toString(w.scalar_type()));
    same_device(w, name);
  }
  for (const auto& [c, name] : {std::pair<const at::Tensor&, const char*>{cos, "cos"},
                                std::pair<const at::Tensor&, const char*>{sin, "sin"}}) {
    if (!c.defined()) throw UsageError(o + ": " + name + " must be a defined tensor");
    if (c.dim() != 2 || c.size(0) != t || c.size(1) != hd / 2)
      throw UsageError(o + ": " + name + " must be [T, hd/2] = [" + std::to_string(t) + ", " + std::to_string(hd / 2) +
                       "], got " + shape(c));
    if (c.scalar_type() != at::kFloat && !(allow_f64 && c.scalar_type() == at::kDouble))
      throw UsageError(o + ": " + name + " must be float32, got " + c10::toString(c.scalar_type()));
    same_device(c, name);
  }
  if (!qkv.is_cuda() || allow_f64) return;
  if (hd > kMaxHeadDim)
    throw UsageError(o + ": head dimension " + std::to_string(hd) + " is wider than the CUDA kernel takes (" +
                     std::to_string(kMaxHeadDim) + ")");
  if (qkv.numel() > INT32_MAX) throw UsageError(o + ": qkv " + shape(qkv) + " is too large for the CUDA kernel");
}

}  // namespace

at::Tensor qk_norm_rope_reference(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight,
                                  const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                  double eps) {
  check_args(qkv, heads, q_weight, k_weight, cos, sin, eps, /*allow_f64=*/true);
  auto f64 = [](const at::Tensor& a) { return a.defined() && a.scalar_type() == at::kDouble; };
  const at::ScalarType ct =
      f64(qkv) || f64(q_weight) || f64(k_weight) || f64(cos) || f64(sin) ? at::kDouble : at::kFloat;
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / 3, hd = d / heads, half = hd / 2;
  const at::Tensor x = qkv.to(ct).reshape({b, t, 3, heads, hd});
  const at::Tensor c = cos.to(ct).view({1, t, 1, half}), s = sin.to(ct).view({1, t, 1, half});
  auto norm_rope = [&](const at::Tensor& p, const at::Tensor& w) {  // p [B, T, H, hd]
    at::Tensor n = p * at::rsqrt(p.pow(2).mean(-1, /*keepdim=*/true) + eps);
    if (w.defined()) n = n * w.to(ct);
    const at::Tensor pairs = n.reshape({b, t, heads, half, 2});
    const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
    return at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).reshape({b, t, heads, hd});
  };
  const at::Tensor out =
      at::stack({norm_rope(x.select(2, 0), q_weight), norm_rope(x.select(2, 1), k_weight), x.select(2, 2)}, 2);
  return out.reshape({b, t, 3 * d}).to(qkv.scalar_type());
}

at::Tensor qk_norm_rope(const at::Tensor& qkv, int64_t heads, const at::Tensor& q_weight, const at::Tensor& k_weight,
                        const at::Tensor& cos, const at::Tensor& sin, double eps) {
  check_args(qkv, heads, q_weight, k_weight, cos, sin, eps, /*allow_f64=*/false);
  // CUDA: kernel pending (the reference runs there until the fused kernels land).
  return qk_norm_rope_reference(qkv, heads, q_weight, k_weight, cos, sin, eps);
}

}  // namespace perftrain::ops
