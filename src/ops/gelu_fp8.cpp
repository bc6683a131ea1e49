#include "ops/gelu_fp8.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "base/error.h"
#include "kernels/fp8_cast.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kOp = "gelu_fp8";

// Outputs: act's stand-in (differentiable), codes and codes_t (not).
struct GeluFp8Function : torch::autograd::Function<GeluFp8Function> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& pre_in, const at::Tensor& scale,
                               const at::Tensor& amax) {
    const c10::DeviceGuard guard(pre_in.device());
    const at::Tensor pre = pre_in.contiguous();
    const int64_t f = pre.size(-1), m = pre.numel() / f;
    const auto options = pre.options().dtype(at::kFloat8_e4m3fn);
    at::Tensor codes = at::empty({m, f}, options), codes_t = at::empty({f, m}, options);
    kernels::Fp8CastArgs a;
    a.x = pre.data_ptr();
    a.x_type = kernels::Fp8Source::kBF16;
    a.rows = m;
    a.cols = f;
    a.format = kernels::Fp8Format::kE4M3;
    a.scale = scale.data_ptr<float>();
    a.amax = amax.data_ptr<float>();
    a.q = static_cast<uint8_t*>(codes.data_ptr());
    a.q_t = static_cast<uint8_t*>(codes_t.data_ptr());
    a.prologue = kernels::Fp8Prologue::kGeluTanh;
    kernels::fp8_cast_transpose(a, at::cuda::getCurrentCUDAStream().stream());
    ctx->save_for_backward({pre});
    ctx->mark_non_differentiable({codes, codes_t});
    return {fp8_stand_in(pre.sizes(), pre.options()), codes, codes_t};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor pre = ctx->get_saved_variables()[0];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    return {at::gelu_backward(grads[0].to(pre.scalar_type()), pre, "tanh"), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Fp8Operand gelu_fp8_reference(const at::Tensor& pre, const Fp8Target& target) {
  return fp8_operand_of(at::gelu(pre, "tanh"), target, kOp);
}

Fp8Operand gelu_fp8(const at::Tensor& pre, const Fp8Target& target) {
  if (!pre.defined() || pre.dim() < 1 || pre.numel() == 0)
    throw UsageError(std::string(kOp) + ": pre must be a non-empty tensor [..., F]");
  check_fp8_target(target, pre, kOp);
  if (!pre.is_cuda() || pre.scalar_type() != at::kBFloat16) return gelu_fp8_reference(pre, target);
  variable_list out = GeluFp8Function::apply(pre, target.scale, target.amax);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

}  // namespace perftrain::ops
