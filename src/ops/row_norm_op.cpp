#include "ops/row_norm_op.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <string>

#include "base/error.h"
#include "ops/column_sums.h"
#include "ops/dtype_dispatch.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops::detail {

void check_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight, const char* what) {
  if (!weight.defined()) return;
  const std::string o = std::string(op) + ": " + what;
  const int64_t d = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != d)
    throw UsageError(o + " must be [" + std::to_string(d) + "] (x is " + shape(x) + "), got " + shape(weight));
  const at::ScalarType t = weight.scalar_type();
  if (!is_kernel_dtype(t) && t != at::kDouble)
    throw UsageError(o + " must be float32, bfloat16, float16 or float64, got " + c10::toString(t));
  if (weight.device() != x.device())
    throw UsageError(std::string(op) + ": x is on " + x.device().str() + " but " + what + " is on " +
                     weight.device().str());
}

void check_row_norm_args(const char* op, const at::Tensor& x, const std::vector<NamedTensor>& like_x,
                         const std::vector<NamedTensor>& rows, const std::vector<NamedTensor>& optional_rows,
                         int64_t max_cols, at::ScalarType out_dtype) {
  std::vector<NamedTensor> present = rows;
  for (const NamedTensor& r : optional_rows)
    if (r.t.defined()) present.push_back(r);
  check_row_op_args(op, x, like_x, present, max_cols);
  check_kernel_dtype(op, out_dtype, "out_dtype");
}

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

std::vector<at::Tensor> per_sample_rows(std::initializer_list<at::Tensor> rows) {
  std::optional<at::ScalarType> common;
  bool same = true;
  for (const at::Tensor& t : rows) {
    if (!t.defined()) continue;
    if (common && *common != t.scalar_type()) same = false;
    common = t.scalar_type();
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : rows)
    out.push_back(!t.defined() ? t : rows_dense(same ? t : t.to(at::kFloat)));
  return out;
}

bool fp8_output_fused(const Fp8Target* fp8, at::ScalarType act, at::ScalarType out_dtype) {
  return fp8 != nullptr && act == out_dtype;
}

RowNormTensors row_norm_tensors(const at::Tensor& x, const at::Tensor& y, at::ScalarType out_dtype, bool keep_xhat,
                                bool stat, const Fp8Target* fp8) {
  RowNormTensors r;
  r.batch = int(x.size(0)), r.tokens = int(x.size(1)), r.cols = int(x.size(2));
  r.x = x.contiguous();
  const bool residual = y.defined();
  r.act = !residual || y.scalar_type() == out_dtype ? out_dtype : at::kFloat;
  if (residual) {
    r.y = y.to(r.act).contiguous();
    r.x1 = at::empty(r.x.sizes(), r.x.options());
  }
  if (!fp8_output_fused(fp8, r.act, out_dtype)) r.h = at::empty(r.x.sizes(), r.x.options().dtype(r.act));
  if (keep_xhat && c10::elementSize(r.act) == 2 && c10::elementSize(r.x.scalar_type()) > 2)
    r.xhat = at::empty(r.x.sizes(), r.x.options().dtype(r.act));
  const at::TensorOptions f32 = r.x.options().dtype(at::kFloat);
  r.rstd = at::empty({int64_t(r.batch) * r.tokens}, f32);
  if (stat) r.stat = at::empty({int64_t(r.batch) * r.tokens}, f32);
  return r;
}

FusedFp8Output fused_fp8_output(const Fp8Target* fp8, const RowNormTensors& t, at::ScalarType out_dtype,
                                const char* op) {
  FusedFp8Output q;
  if (fp8 == nullptr) return q;
  check_fp8_target(*fp8, t.x, op);
  if (!fp8_output_fused(fp8, t.act, out_dtype)) return q;
  q.fused = true;
  q.codes = at::empty({int64_t(t.batch) * t.tokens, t.cols}, t.x.options().dtype(at::kFloat8_e4m3fn));
  q.kernel.q = static_cast<uint8_t*>(q.codes.data_ptr());
  q.kernel.scale = fp8->scale.data_ptr<float>();
  q.kernel.amax = fp8->amax.data_ptr<float>();
  return q;
}

FinishedFp8Output finish_fp8_output(const FusedFp8Output& q, const Fp8Target* fp8, const RowNormTensors& t,
                                    at::ScalarType out_dtype, const char* op) {
  if (q.fused) return {fp8_stand_in(t.x.sizes(), t.x.options().dtype(out_dtype)), q.codes};
  FinishedFp8Output out{as_dtype(t.h, out_dtype), at::Tensor()};
  if (fp8 != nullptr)
    out.codes = fp8_cast(out.h.view({-1, out.h.size(-1)}), fp8->scale, fp8->amax, Fp8Format::kE4M3, op);
  return out;
}

void save_dtypes(torch::autograd::AutogradContext* ctx,
                 std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs) {
  for (const auto& [key, t] : inputs) ctx->saved_data[key] = t->defined() ? int64_t(t->scalar_type()) : int64_t(-1);
}

void save_residual_types(torch::autograd::AutogradContext* ctx, at::ScalarType act, const at::Tensor& x,
                         const at::Tensor& y, const at::Tensor& gate) {
  ctx->saved_data["act"] = int64_t(act);
  save_dtypes(ctx, {{"x_dtype", &x}, {"y_dtype", &y}, {"gate_dtype", &gate}});
}

bool saved_present(torch::autograd::AutogradContext* ctx, const char* key) {
  return ctx->saved_data[key].toInt() >= 0;
}

at::ScalarType saved_dtype(torch::autograd::AutogradContext* ctx, const char* key) {
  return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
}

at::Tensor as_dtype(const at::Tensor& t, at::ScalarType d) { return t.scalar_type() == d ? t : t.to(d); }

at::Tensor dense_grad(const at::Tensor& g, at::ScalarType d) {
  return g.defined() ? g.to(d).contiguous() : at::Tensor();
}

int sm_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

at::Tensor f32_scratch(int64_t n, const at::Tensor& like) {
  return at::empty({n}, like.options().dtype(at::kFloat));
}

std::vector<at::Tensor> batch_sums_on_lane(const std::vector<PerSampleGrad>& grads) {
  std::vector<at::Tensor> out, reads;
  for (const PerSampleGrad& g : grads) {
    out.push_back(at::empty({g.per_sample.size(1)}, g.per_sample.options().dtype(g.dtype)));
    reads.push_back(g.per_sample);
  }
  if (grads.empty()) return out;
  run_weight_grads(
      [&] {
        for (size_t i = 0; i < grads.size(); ++i) batch_sums_into(grads[i].per_sample, out[i]);
      },
      std::move(reads));
  return out;
}

}  // namespace perftrain::ops::detail
