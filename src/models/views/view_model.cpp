#include "models/views/view_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>

#include "base/error.h"

namespace perftrain::models::views {
namespace {

// ATen's C++ has no meta kernel for index_select (PyTorch registers one from
// Python), which the label embedding needs: the output's shape is the input's
// with dimension dim as long as the index.
at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[static_cast<size_t>(dim < 0 ? dim + self.dim() : dim)] = index.numel();
  return at::empty(shape, self.options());
}

// Nor for convolution on a backend other than CPU/CUDA (the patch embedding's
// conv2d): the output's shape from the usual size formula.
at::Tensor convolution_meta(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>&,
                            c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                            bool transposed, c10::SymIntArrayRef, c10::SymInt) {
  if (transposed) throw RuntimeError("meta convolution: transposed convolutions are not supported");
  std::vector<int64_t> shape{input.size(0), weight.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) {
    const size_t k = static_cast<size_t>(d - 2);
    const int64_t s = stride.size() > k ? stride[k].expect_int() : 1;
    const int64_t p = padding.size() > k ? padding[k].expect_int() : 0;
    const int64_t dl = dilation.size() > k ? dilation[k].expect_int() : 1;
    shape.push_back((input.size(d) + 2 * p - dl * (weight.size(d) - 1) - 1) / s + 1);
  }
  return at::empty(shape, input.options());
}

// Nor for batch norm, which layer_norm on a device other than the CPU and
// CUDA is computed through: the output like the input, statistics per channel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_meta(const at::Tensor& input, const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&, bool, double, double) {
  const auto stats = input.options().dtype(at::kFloat);
  return {at::empty(input.sizes(), input.options()), at::empty({input.size(1)}, stats), at::empty({input.size(1)}, stats)};
}

// Nor for where(cond, a, b, out=) (in the attention's safe softmax).
at::Tensor& where_out_meta(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes()));
  return out;
}

// Nor for where(cond, a, b) (the single-stream model's zeroed padding of the
// condition features): the broadcast shape, in a's dtype.
at::Tensor where_meta(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  return at::empty(at::infer_size(at::infer_size(cond.sizes(), self.sizes()), other.sizes()), self.options());
}

void register_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto missing = [](const char* name) {
      auto op = c10::Dispatcher::singleton().findSchema({name, ""});
      return op && !op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
    };
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    if (missing("aten::index_select")) lib.impl("index_select", TORCH_FN(index_select_meta));
    auto missing_overload = [](const char* name, const char* overload) {
      auto op = c10::Dispatcher::singleton().findSchema({name, overload});
      return op && !op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
    };
    if (missing_overload("aten::where", "self_out")) lib.impl("where.self_out", TORCH_FN(where_out_meta));
    if (missing_overload("aten::where", "self")) lib.impl("where.self", TORCH_FN(where_meta));
    if (missing("aten::native_batch_norm")) lib.impl("native_batch_norm", TORCH_FN(batch_norm_meta));
    if (missing("aten::convolution_overrideable")) lib.impl("convolution_overrideable", TORCH_FN(convolution_meta));
  });
}

}  // namespace

at::Tensor ViewModel::forward() const { return model->forward(x, t, cond); }

at::Tensor ViewModel::loss() const {
  const at::Tensor out = forward();
  const at::Tensor target = at::empty(out.sizes(), out.options().requires_grad(false));
  return (out - target).pow(2).mean();
}

ViewModel meta_model(const DiTConfig& cfg, int64_t batch) {
  if (batch < 1) throw UsageError("--batch: must be at least 1, got " + std::to_string(batch));
  register_meta_kernels();
  ViewModel v;
  v.model = make_diffusion_model(cfg, /*seed=*/0);
  // transform() also marks the trainable tensors as requiring gradients.
  v.model->transform([](const std::string&, const at::Tensor& t) { return t.to(at::kMeta); });
  const auto meta = at::TensorOptions().device(at::kMeta);
  v.x = at::empty({batch, cfg.in_channels, cfg.image_size, cfg.image_size}, meta.dtype(at::kFloat));
  v.t = at::empty({batch}, meta.dtype(at::kFloat));
  v.cond.labels = at::empty({batch}, meta.dtype(at::kLong));
  if (cfg.single_stream() && cfg.cond_dim > 0) {
    v.cond.features = at::empty({batch, cfg.cond_tokens, cfg.cond_dim}, meta.dtype(at::kFloat));
    v.cond.lengths = at::empty({batch}, meta.dtype(at::kLong));
  }
  return v;
}

}  // namespace perftrain::models::views
