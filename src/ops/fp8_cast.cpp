#include "ops/fp8_cast.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "base/error.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {
namespace {

void check_scalar(const std::string& op, const at::Tensor& t, const at::Tensor& x, const char* what) {
  if (!t.defined() || t.numel() != 1 || t.scalar_type() != at::kFloat)
    throw UsageError(op + ": " + what + " must be one float32 element, got " +
                     (t.defined() ? shape(t) + " " + c10::toString(t.scalar_type()) : std::string("undefined")));
  if (t.device() != x.device())
    throw UsageError(op + ": " + what + " is on " + t.device().str() + " but x is on " + x.device().str());
}

void check_cast_args(const std::string& op, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax) {
  if (!x.defined() || x.dim() != 2) throw UsageError(op + ": x must be a 2-D tensor [rows, cols]");
  if (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kFloat)
    throw UsageError(op + ": x must be bfloat16 or float32, got " + std::string(c10::toString(x.scalar_type())));
  check_scalar(op, scale, x, "scale");
  if (amax.defined()) check_scalar(op, amax, x, "amax");
}

kernels::Fp8CastArgs kernel_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
                                 Fp8Format f) {
  kernels::Fp8CastArgs a;
  a.x = x.data_ptr();
  a.x_type = x.scalar_type() == at::kFloat ? kernels::Fp8Source::kF32 : kernels::Fp8Source::kBF16;
  a.rows = x.size(0);
  a.cols = x.size(1);
  a.format = f;
  a.scale = scale.data_ptr<float>();
  a.amax = amax.defined() ? amax.data_ptr<float>() : nullptr;
  return a;
}

// The CPU path's amax: max-accumulated as the kernel does.
void accumulate_amax(const at::Tensor& amax, const at::Tensor& x) {
  if (!amax.defined()) return;
  at::Tensor out = amax;  // a handle on the same storage
  out.copy_(at::maximum(amax.reshape({}), fp8_amax_reference(x)));
}

uint8_t* bits(const at::Tensor& q) { return static_cast<uint8_t*>(q.data_ptr()); }

}  // namespace

at::ScalarType fp8_dtype(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

at::Tensor fp8_cast(const at::Tensor& x_in, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                    const char* op) {
  check_cast_args(op, x_in, scale, amax);
  const at::Tensor x = x_in.contiguous();
  if (!x.is_cuda()) {
    accumulate_amax(amax, x);
    return fp8_quantize_reference(x, scale, f);
  }
  const c10::DeviceGuard guard(x.device());
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(fp8_dtype(f)));
  kernels::Fp8CastArgs a = kernel_args(x, scale, amax, f);
  a.q = bits(q);
  kernels::fp8_cast(a, at::cuda::getCurrentCUDAStream().stream());
  return q;
}

namespace detail {

void fp8_cast_transpose_prologue(const at::Tensor& src, const at::Tensor& x2, int64_t rows, int64_t cols,
                                 kernels::Fp8Prologue prologue, Fp8Format format, const at::Tensor& scale,
                                 const at::Tensor& amax, const at::Tensor& q, const at::Tensor& q_t,
                                 const at::Tensor& partials) {
  kernels::Fp8CastArgs a = kernel_args(src, scale, amax, format);
  a.rows = rows;
  a.cols = cols;
  a.q = bits(q);
  a.q_t = bits(q_t);
  a.prologue = prologue;
  if (x2.defined()) a.x2 = x2.data_ptr();
  if (partials.defined()) a.col_partials = partials.data_ptr<float>();
  kernels::fp8_cast_transpose(a, at::cuda::getCurrentCUDAStream().stream());
}

void fp8_cast_activation(const at::Tensor& src, int64_t rows, int64_t cols, kernels::Fp8Prologue prologue,
                         Fp8Format format, const at::Tensor& scale, const at::Tensor& amax, const at::Tensor& q) {
  kernels::Fp8CastArgs a = kernel_args(src, scale, amax, format);
  a.rows = rows;
  a.cols = cols;
  a.q = bits(q);
  a.prologue = prologue;
  kernels::fp8_cast(a, at::cuda::getCurrentCUDAStream().stream());
}

}  // namespace detail

Fp8Casts fp8_cast_transpose(const at::Tensor& x_in, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                            bool with_rows, const char* op) {
  check_cast_args(op, x_in, scale, amax);
  const at::Tensor x = x_in.contiguous();
  Fp8Casts out;
  if (!x.is_cuda()) {
    accumulate_amax(amax, x);
    const at::Tensor q = fp8_quantize_reference(x, scale, f);
    out.q_t = q.t().contiguous();
    if (with_rows) out.q = q;
    return out;
  }
  const c10::DeviceGuard guard(x.device());
  const auto options = x.options().dtype(fp8_dtype(f));
  out.q_t = at::empty({x.size(1), x.size(0)}, options);
  if (with_rows) out.q = at::empty(x.sizes(), options);
  kernels::Fp8CastArgs a = kernel_args(x, scale, amax, f);
  a.q = with_rows ? bits(out.q) : nullptr;
  a.q_t = bits(out.q_t);
  kernels::fp8_cast_transpose(a, at::cuda::getCurrentCUDAStream().stream());
  return out;
}

void fp8_cast_into(const at::Tensor& x_in, const at::Tensor& scale, const at::Tensor& amax, Fp8Format f,
                   const at::Tensor& q, const at::Tensor& q_t, const char* op) {
  check_cast_args(op, x_in, scale, amax);
  const int64_t rows = x_in.size(0), cols = x_in.size(1);
  const auto bad_output = [&](const at::Tensor& t, int64_t r, int64_t c) {
    return t.dim() != 2 || t.size(0) != r || t.size(1) != c || t.scalar_type() != fp8_dtype(f) ||
           t.device() != x_in.device() || (c > 1 && t.stride(1) != 1) || (r > 1 && t.stride(0) < c);
  };
  if ((!q.defined() && !q_t.defined()) || (q.defined() && (bad_output(q, rows, cols) || !q.is_contiguous())) ||
      (q_t.defined() && bad_output(q_t, cols, rows)))
    throw UsageError(std::string(op) + ": the outputs must be q [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "] (dense) and/or q_t [" + std::to_string(cols) + ", " +
                     std::to_string(rows) + "] (unit column stride) in " + c10::toString(fp8_dtype(f)) +
                     " on x's device");
  const at::Tensor x = x_in.contiguous();
  if (!x.is_cuda()) {
    accumulate_amax(amax, x);
    const at::Tensor codes = fp8_quantize_reference(x, scale, f);
    for (auto [out, from] : {std::pair{q, codes}, std::pair{q_t, codes.t()}}) {
      if (out.defined()) out.copy_(from);  // a handle on the caller's storage
    }
    return;
  }
  const c10::DeviceGuard guard(x.device());
  kernels::Fp8CastArgs a = kernel_args(x, scale, amax, f);
  a.q = q.defined() ? bits(q) : nullptr;
  if (!q_t.defined()) {
    kernels::fp8_cast(a, at::cuda::getCurrentCUDAStream().stream());
    return;
  }
  a.q_t = bits(q_t);
  a.q_t_ld = std::max<int64_t>(q_t.stride(0), rows);
  kernels::fp8_cast_transpose(a, at::cuda::getCurrentCUDAStream().stream());
}

at::Tensor fp8_transpose(const at::Tensor& q_in, const char* op) {
  if (!q_in.defined() || q_in.dim() != 2 ||
      (q_in.scalar_type() != at::kFloat8_e4m3fn && q_in.scalar_type() != at::kFloat8_e5m2))
    throw UsageError(std::string(op) + ": q must be a 2-D float8 (e4m3fn or e5m2) tensor");
  const at::Tensor q = q_in.contiguous();
  if (!q.is_cuda()) return q.t().contiguous();
  const c10::DeviceGuard guard(q.device());
  at::Tensor q_t = at::empty({q.size(1), q.size(0)}, q.options());
  kernels::fp8_transpose(static_cast<const uint8_t*>(q.data_ptr()), q.size(0), q.size(1), bits(q_t),
                         at::cuda::getCurrentCUDAStream().stream());
  return q_t;
}

void check_fp8_target(const Fp8Target& target, const at::Tensor& like, const char* op) {
  check_scalar(op, target.scale, like, "the fp8 scale");
  check_scalar(op, target.amax, like, "the fp8 amax");
}

at::Tensor fp8_stand_in(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::full({}, std::numeric_limits<double>::quiet_NaN(), options).expand(sizes);
}

Fp8Operand fp8_operand_of(const at::Tensor& h, const Fp8Target& target, const char* op) {
  const at::Tensor values = h.detach();
  return {h, fp8_cast(values.reshape({-1, values.size(-1)}), target.scale, target.amax, Fp8Format::kE4M3, op), at::Tensor()};
}

at::Tensor fp8_quantize_reference(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  const double max = kernels::fp8_max(f);
  // fp32 product (a one-element fp32 tensor), then the clamp (NaN passes).
  const at::Tensor scaled = x.to(at::kFloat) * scale.reshape({}).to(x.device());
  return at::clamp(scaled, -max, max).to(fp8_dtype(f));
}

at::Tensor fp8_dequantize_reference(const at::Tensor& q, const at::Tensor& scale_inv) {
  return q.to(at::kFloat) * scale_inv.reshape({}).to(q.device());
}

at::Tensor fp8_amax_reference(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  return at::amax(x.to(at::kFloat).abs());  // NaN propagates
}

}  // namespace perftrain::ops
