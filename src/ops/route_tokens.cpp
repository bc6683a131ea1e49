#include "ops/route_tokens.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <tuple>

#include "base/error.h"
#include "kernels/route_tokens.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw UsageError(std::string(op) + ": " + what);
}

void check_u(const char* op, const at::Tensor& u) {
  require(u.defined() && u.dim() == 3, op, "u must be [B, T, D], got " + (u.defined() ? shape(u) : "undefined"));
  require(u.scalar_type() == at::kFloat, op, "u must be float32, got " + std::string(c10::toString(u.scalar_type())));
}

void check_same_device(const char* op, const at::Tensor& u, const at::Tensor& t, const char* name) {
  require(t.device() == u.device(), op,
          std::string("u is on ") + u.device().str() + " but " + name + " is on " + t.device().str());
}

void check_select(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias, int64_t k) {
  constexpr const char* op = "route_select";
  check_u(op, u);
  const int64_t T = u.size(1), D = u.size(2);
  require(weight.defined() && weight.dim() == 2 && weight.size(0) == 1 && weight.size(1) == D, op,
          "weight must be [1, " + std::to_string(D) + "], got " + (weight.defined() ? shape(weight) : "undefined"));
  require(!bias.defined() || (bias.dim() == 1 && bias.size(0) == 1), op, "bias must be [1], got " + shape(bias));
  require(k >= 1 && k <= T, op, "k must be in [1, " + std::to_string(T) + "], got " + std::to_string(k));
  check_same_device(op, u, weight, "weight");
  if (bias.defined()) check_same_device(op, u, bias, "bias");
}

void check_combine(const at::Tensor& u, const at::Tensor& kept, const at::Tensor& y, const at::Tensor& gate,
                   const at::Tensor& index) {
  constexpr const char* op = "route_combine";
  check_u(op, u);
  const int64_t B = u.size(0), D = u.size(2);
  require(index.defined() && index.dim() == 2 && index.size(0) == B && index.scalar_type() == at::kLong, op,
          "index must be int64 [" + std::to_string(B) + ", k], got " + (index.defined() ? shape(index) : "undefined"));
  const int64_t k = index.size(1);
  const std::string rows = "[" + std::to_string(B) + ", " + std::to_string(k) + ", " + std::to_string(D) + "]";
  require(kept.defined() && kept.sizes() == at::IntArrayRef({B, k, D}) && kept.scalar_type() == at::kFloat, op,
          "kept must be float32 " + rows + ", got " + (kept.defined() ? shape(kept) : "undefined"));
  require(y.defined() && y.sizes() == at::IntArrayRef({B, k, D}) && is_kernel_dtype(y.scalar_type()), op,
          "y must be float32, bfloat16 or float16 " + rows + ", got " + (y.defined() ? shape(y) : "undefined"));
  require(gate.defined() && gate.sizes() == at::IntArrayRef({B, k}) && gate.scalar_type() == at::kFloat, op,
          "gate must be float32 [" + std::to_string(B) + ", " + std::to_string(k) + "], got " +
              (gate.defined() ? shape(gate) : "undefined"));
  check_same_device(op, u, kept, "kept");
  check_same_device(op, u, y, "y");
  check_same_device(op, u, gate, "gate");
  check_same_device(op, u, index, "index");
}

// index [B, k] -> [B, k, D] for gather / scatter along tokens.
at::Tensor rows_index(const at::Tensor& index, int64_t D) {
  return index.unsqueeze(-1).expand({index.size(0), index.size(1), D});
}

// slot_of [B, T] int32 (kernels/route_tokens.h), on the GPU.
at::Tensor slots_of(const at::Tensor& index, int64_t T, cudaStream_t stream) {
  at::Tensor slots = at::empty({index.size(0), T}, index.options().dtype(at::kInt));
  kernels::route_slots(index.data_ptr<int64_t>(), slots.data_ptr<int32_t>(), int(index.size(0)), int(T),
                       int(index.size(1)), stream);
  return slots;
}

// The router's logits in float32 whatever autocast says (top-k compares them).
at::Tensor router_scores(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::linear(u, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt).squeeze(-1);
}

at::Tensor top_tokens(const at::Tensor& scores, int64_t k) {
  return std::get<0>(at::sort(std::get<1>(at::topk(scores, k, 1)), 1));
}

struct RouteSelectFunction : public torch::autograd::Function<RouteSelectFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u_in, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, int64_t k) {
    const at::Tensor u = u_in.contiguous();
    const at::Tensor scores = router_scores(u, weight, bias.value_or(at::Tensor()));
    const at::Tensor index = top_tokens(scores, k).contiguous();
    at::Tensor kept;
    if (u.is_cuda()) {
      const c10::cuda::CUDAGuard guard(u.device());
      kept = at::empty({u.size(0), k, u.size(2)}, u.options());
      kernels::route_gather_rows(u.data_ptr<float>(), index.data_ptr<int64_t>(), kept.data_ptr<float>(),
                                 int(u.size(0)), int(u.size(1)), int(k), int(u.size(2)),
                                 at::cuda::getCurrentCUDAStream());
    } else {
      kept = at::gather(u, 1, rows_index(index, u.size(2)));
    }
    ctx->mark_non_differentiable({index});
    ctx->save_for_backward({u, weight, index});
    ctx->saved_data["bias"] = bias.has_value();
    return {scores, index, kept, u_in};
  }

  // grads: scores, index (none), kept, through.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &u = saved[0], &weight = saved[1], &index = saved[2];
    const int64_t B = u.size(0), T = u.size(1), D = u.size(2), k = index.size(1);
    const at::Tensor ds = grads[0].defined() ? grads[0].contiguous() : at::zeros({B, T}, u.options());
    const at::Tensor dkept = grads[2].defined() ? grads[2].contiguous() : at::zeros({B, k, D}, u.options());
    const at::Tensor dthrough = grads[3].defined() ? grads[3].to(at::kFloat).contiguous() : at::Tensor();
    const at::Tensor w = weight.to(at::kFloat).contiguous().view({D});
    at::Tensor du;
    if (u.is_cuda()) {
      const c10::cuda::CUDAGuard guard(u.device());
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      du = at::empty_like(u);
      const at::Tensor slots = slots_of(index, T, stream);
      kernels::route_select_backward(dthrough.defined() ? dthrough.data_ptr<float>() : nullptr, ds.data_ptr<float>(),
                                     w.data_ptr<float>(), slots.data_ptr<int32_t>(), dkept.data_ptr<float>(),
                                     du.data_ptr<float>(), int(B), int(T), int(k), int(D), stream);
    } else {
      du = ds.unsqueeze(-1) * w.view({1, 1, D});
      if (dthrough.defined()) du = du + dthrough;
      du = at::scatter_add(du, 1, rows_index(index, D), dkept);
    }
    // The router's own gradients: [1, B*T] x [B*T, D] and the sum of ds.
    const at::Tensor dw = ds.view({1, B * T}).mm(u.view({B * T, D})).to(weight.scalar_type());
    const at::Tensor db = ctx->saved_data["bias"].toBool() ? ds.sum().view({1}) : at::Tensor();
    return {du, dw, db, at::Tensor()};
  }
};

struct RouteCombineFunction : public torch::autograd::Function<RouteCombineFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& u_in, const at::Tensor& kept_in,
                            const at::Tensor& y_in, const at::Tensor& gate_in, const at::Tensor& index_in) {
    const at::Tensor u = u_in.contiguous(), kept = kept_in.contiguous(), y = y_in.contiguous();
    const at::Tensor gate = gate_in.contiguous(), index = index_in.contiguous();
    at::Tensor out;
    if (u.is_cuda()) {
      const c10::cuda::CUDAGuard guard(u.device());
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      const at::Tensor slots = slots_of(index, u.size(1), stream);
      out = at::empty_like(u);
      with_kernel_type("route_combine", y.scalar_type(), [&](auto ty) {
        using TY = kernel_type<decltype(ty)>;
        kernels::route_combine_forward<TY>(u.data_ptr<float>(), slots.data_ptr<int32_t>(), kept.data_ptr<float>(),
                                           kernel_ptr<const TY>(y), gate.data_ptr<float>(), out.data_ptr<float>(),
                                           int(u.size(0)), int(u.size(1)), int(index.size(1)), int(u.size(2)),
                                           stream);
      });
    } else {
      out = route_combine_reference(u, kept, y, gate, index);
    }
    ctx->save_for_backward({kept, y, gate, index});
    ctx->saved_data["tokens"] = u.size(1);
    return out;
  }

  // d u = dout itself; dkept = -gate dout[kept], dy = gate dout[kept], dgate = sum_D dout[kept] (y - kept).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &kept = saved[0], &y = saved[1], &gate = saved[2], &index = saved[3];
    const at::Tensor& dout_in = grads[0];
    if (!dout_in.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor dout = dout_in.to(at::kFloat).contiguous();
    const int64_t B = kept.size(0), k = kept.size(1), D = kept.size(2);
    at::Tensor dkept, dy, dgate;
    if (dout.is_cuda()) {
      const c10::cuda::CUDAGuard guard(dout.device());
      dkept = at::empty_like(kept);
      dy = at::empty_like(y);
      dgate = at::empty_like(gate);
      with_kernel_type("route_combine", y.scalar_type(), [&](auto ty) {
        using TY = kernel_type<decltype(ty)>;
        kernels::route_combine_backward<TY>(dout.data_ptr<float>(), index.data_ptr<int64_t>(), kept.data_ptr<float>(),
                                            kernel_ptr<const TY>(y), gate.data_ptr<float>(), kernel_ptr<TY>(dy),
                                            dkept.data_ptr<float>(), dgate.data_ptr<float>(), int(B),
                                            int(ctx->saved_data["tokens"].toInt()), int(k), int(D),
                                            at::cuda::getCurrentCUDAStream());
      });
    } else {
      const at::Tensor d = at::gather(dout, 1, rows_index(index, D));
      const at::Tensor gd = gate.unsqueeze(-1) * d;
      dy = gd.to(y.scalar_type());
      dkept = -gd;
      dgate = (d * (y.to(at::kFloat) - kept)).sum(-1);
    }
    return {dout_in, dkept, dy, dgate, at::Tensor()};
  }
};

}  // namespace

RouteSelection route_select_reference(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias,
                                      int64_t k) {
  check_select(u, weight, bias, k);
  RouteSelection s;
  s.scores = router_scores(u, weight, bias);
  s.index = top_tokens(s.scores, k);
  s.kept = at::gather(u, 1, rows_index(s.index, u.size(2)));
  s.through = u;
  return s;
}

at::Tensor route_combine_reference(const at::Tensor& u, const at::Tensor& kept, const at::Tensor& y,
                                   const at::Tensor& gate, const at::Tensor& index) {
  check_combine(u, kept, y, gate, index);
  return at::scatter_add(u, 1, rows_index(index, u.size(2)), gate.unsqueeze(-1) * (y.to(at::kFloat) - kept));
}

RouteSelection route_select(const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias, int64_t k) {
  check_select(u, weight, bias, k);
  const variable_list out = RouteSelectFunction::apply(
      u, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, k);
  return {out[0], out[1], out[2], out[3]};
}

at::Tensor route_combine(const at::Tensor& u, const at::Tensor& kept, const at::Tensor& y, const at::Tensor& gate,
                         const at::Tensor& index) {
  check_combine(u, kept, y, gate, index);
  return RouteCombineFunction::apply(u, kept, y, gate, index);
}

}  // namespace perftrain::ops
