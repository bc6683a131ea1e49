#include "ops/gelu_mlp.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/gemm_bias_gelu_sm90.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/cublaslt_workspace.h"
#include "ops/cuda_capture.h"
#include "ops/cuda_timing.h"
#include "ops/dtype_dispatch.h"
#include "ops/gelu_backward.h"
#include "ops/gemm_bias_gelu.h"
#include "ops/linear.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using kernels::GemmEpilogue;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The forms of d(pre) = (dy w2) * gelu_tanh'(pre), with db1 = its column
// sums (fp32) when wanted: our Hopper kernel, cuBLASLt's DGELU epilogue, or
// the split form (DGeluPath's).
enum class DGeluForm { kKernel, kEpilogue, kSplit };

const char* form_name(DGeluForm f) {
  return f == DGeluForm::kKernel ? "kernel" : f == DGeluForm::kEpilogue ? "epilogue" : "split";
}

// Our kernel (ops/gemm_bias_gelu.h's try_gemm_dgelu_sm90), db1 from its
// column partials. False where it does not apply.
bool dgelu_in_kernel(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre,
                     bool want_db1, at::Tensor& db1) {
  db1 = want_db1 ? at::empty({pre.size(1)}, dy.options().dtype(at::kFloat)) : at::Tensor();
  if (try_gemm_dgelu_sm90(dy, w2, pre, dpre, db1)) return true;
  db1 = at::Tensor();
  return false;
}

// The DGELU epilogue form, with db1 when wanted and cuBLASLt takes it.
// False where cuBLASLt refuses the product.
bool dgelu_in_epilogue(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre,
                       bool want_db1, at::Tensor& db1) {
  // An fp32 bias gradient (cuBLASLt 13.0 refuses it with a bf16 D, and a
  // 16-bit one is not asked for: the column sums of loss-scaled gradients
  // could overflow fp16); then DGELU alone, db1 from dW1's pass.
  if (want_db1) {
    db1 = at::empty({pre.size(1)}, dy.options().dtype(at::kFloat));
    if (try_gemm_lt(dy, false, w2, false, dpre, GemmEpilogue::kDGeluBGrad, db1, pre)) return true;
  }
  db1 = at::Tensor();
  return try_gemm_lt(dy, false, w2, false, dpre, GemmEpilogue::kDGelu, at::Tensor(), pre);
}

// The split form (or the fallback): the plain product, then GELU's
// backward in place on it (with db1 from the same pass when fused).
at::Tensor dgelu_split(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, at::Tensor& dpre,
                       bool want_db1) {
  detail::linear_input_grad(dy, w2, dpre);
  if (!gelu_mlp_fused_gelu_backward(dy.size(0), dy.size(1))) {
    at::gelu_backward_out(dpre, dpre, pre, "tanh");
    return at::Tensor();
  }
  const at::Tensor db1 = want_db1 ? at::empty({pre.size(1)}, dy.options().dtype(at::kFloat)) : at::Tensor();
  gelu_tanh_backward_(dpre, pre, db1);
  return db1;
}

// One form, run: d(pre) into dpre and db1 (undefined where the form leaves
// it to dW1's pass). False where the kernel or cuBLASLt refuses.
bool run_dgelu_form(DGeluForm form, const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, at::Tensor& dpre,
                    bool want_db1, at::Tensor& db1) {
  if (form == DGeluForm::kKernel) return dgelu_in_kernel(dy, w2, pre, dpre, want_db1, db1);
  if (form == DGeluForm::kEpilogue) return dgelu_in_epilogue(dy, w2, pre, dpre, want_db1, db1);
  db1 = dgelu_split(dy, w2, pre, dpre, want_db1);
  return true;
}

struct DGeluKey {
  int64_t rows, hidden, width;
  at::ScalarType dtype;
  bool want_db1;
  int device;
  bool operator<(const DGeluKey& o) const {
    return std::tie(rows, hidden, width, dtype, want_db1, device) <
           std::tie(o.rows, o.hidden, o.width, o.dtype, o.want_db1, o.device);
  }
};

std::mutex& dgelu_choices_mutex() {
  static std::mutex m;
  return m;
}
std::map<DGeluKey, DGeluForm>& dgelu_choices() {
  static auto* m = new std::map<DGeluKey, DGeluForm>();
  return *m;
}

// The rule: a forced path, or kAuto without timing: the size rule between
// cuBLASLt's epilogue and the split form (our kernel only where timed, or
// forced; forced where it does not apply, the split form).
DGeluForm dgelu_rule(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre) {
  if (gelu_mlp_dgelu_path() == DGeluPath::kKernel) {
    const bool kernel_applies = dy.scalar_type() == at::kBFloat16 && w2.scalar_type() == at::kBFloat16 &&
                                kernels::gemm_dgelu_sm90_supported(pre.size(0), pre.size(1), dy.size(1)) &&
                                compat::current_device_is_sm90();
    return kernel_applies ? DGeluForm::kKernel : DGeluForm::kSplit;
  }
  return gelu_mlp_dgelu_in_epilogue(pre.size(0), pre.size(1)) ? DGeluForm::kEpilogue : DGeluForm::kSplit;
}

// Our kernel is chosen only where it times at most this fraction of the
// best other form: timed one call at a time at start-up (full clock) it
// came out faster than cuBLASLt's epilogue at DiT-B/2 and XL/2, yet those
// power-capped steps ran slower with it, while DiT-L/2 b128's, where it
// times 18% under the split form, ran faster (docs/PERFORMANCE.md).
constexpr double kDGeluKernelMargin = 0.9;

// kAuto with GEMM tuning on: the first backward of a shape outside a capture
// times each form on its own buffers and keeps the fastest for the process,
// our kernel only by kDGeluKernelMargin (cuBLASLt offers only a pre-Hopper
// DGELU kernel for some shapes: at DiT-L/2 b128 on the H100 it ran at 2.5x
// the time of fc2's forward, a plain product of the same size); the choice
// and the times go into the GEMM tuning records. The same work on each
// side: a form that leaves db1 to a column-sum pass over d(pre) with dW1 is
// timed with that pass (the epilogue form where cuBLASLt gives no fp32 bias
// gradient with a bf16 output, the split form where ATen's GELU backward
// runs). Without tuning, or inside a capture before any timing, the rule.
DGeluForm dgelu_form_chosen(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, at::Tensor& dpre,
                            bool want_db1) {
  const DGeluForm rule = dgelu_rule(dy, w2, pre);
  if (gelu_mlp_dgelu_path() != DGeluPath::kAuto || gemm_tune_candidates() < 2) return rule;
  const DGeluKey key{pre.size(0), pre.size(1), dy.size(1), dy.scalar_type(), want_db1, dy.get_device()};
  const std::lock_guard<std::mutex> lock(dgelu_choices_mutex());
  if (const auto it = dgelu_choices().find(key); it != dgelu_choices().end()) return it->second;
  if (current_stream_capturing() || !gemm_tuning_open()) return rule;
  // Candidate 0 the rule's form, then the others in a fixed order.
  std::vector<DGeluForm> forms = {rule};
  for (const DGeluForm f : {DGeluForm::kKernel, DGeluForm::kEpilogue, DGeluForm::kSplit})
    if (f != rule) forms.push_back(f);
  const at::Tensor db1_later = want_db1 ? at::empty({pre.size(1)}, dy.options().dtype(at::kFloat)) : at::Tensor();
  std::string forms_text = " (", times = ":";
  std::vector<double> ms;
  for (size_t i = 0; i < forms.size(); ++i) {
    bool ok = true, left_db1 = false;
    at::Tensor db1;
    const double t = median_cuda_ms([&] {
      ok = ok && run_dgelu_form(forms[i], dy, w2, pre, dpre, want_db1, db1);
      left_db1 = ok && want_db1 && !db1.defined();
      if (left_db1) column_sums_into({dpre}, {db1_later});
    });
    ms.push_back(ok ? t : -1.0);  // a form that refused is not a candidate
    forms_text += (i ? ", " : "") + std::to_string(i) + ": " + form_name(forms[i]);
    char line[96];
    if (ok)
      std::snprintf(line, sizeof line, "%s %s %.3f ms%s", i ? "," : "", form_name(forms[i]), t,
                    left_db1 ? " with db1's column sums" : "");
    else
      std::snprintf(line, sizeof line, "%s %s refused", i ? "," : "", form_name(forms[i]));
    times += line;
  }
  forms_text += ")";
  // Among cuBLASLt's and the split form, as the products' tuning: the rule's form unless the other beats it
  // by more than 3%, so that near-ties choose the same in every run; then our kernel where it beats that by
  // the margin above.
  size_t best = ms[0] >= 0 ? 0 : forms.size();  // the rule is never the kernel; the split form never refuses
  for (size_t i = 1; i < forms.size(); ++i)
    if (forms[i] != DGeluForm::kKernel && ms[i] >= 0 &&
        (best == forms.size() || ms[i] < (best == 0 ? 0.97 : 1.0) * ms[best]))
      best = i;
  for (size_t i = 1; i < forms.size(); ++i)
    if (forms[i] == DGeluForm::kKernel && ms[i] >= 0 && ms[i] < kDGeluKernelMargin * ms[best]) best = i;
  dgelu_choices().emplace(key, forms[best]);
  kernels::gemm_add_tune_record({"DGELU form m=" + std::to_string(pre.size(0)) + " n=" + std::to_string(pre.size(1)) +
                                     " k=" + std::to_string(dy.size(1)) + forms_text + times,
                                 int(forms.size()), int(best), ms[0] >= 0 ? ms[0] : ms[best], ms[best]});
  return forms[best];
}

// d(pre) = (dy w2) * gelu_tanh'(pre), with db1 = its column sums (fp32) when
// wanted: from our kernel's column partials, the DGELU_BGRAD product, or the
// split form's fused GELU pass; otherwise db1 is returned undefined and comes
// later with dW1.
std::pair<at::Tensor, at::Tensor> fc2_back_through_gelu(const at::Tensor& dy, const at::Tensor& w2,
                                                        const at::Tensor& pre, bool want_db1) {
  at::Tensor dpre = at::empty(pre.sizes(), dy.options());
  if (cublaslt_path(dy, w2)) {
    const DGeluForm form = dgelu_form_chosen(dy, w2, pre, dpre, want_db1);
    at::Tensor db1;
    if (form != DGeluForm::kSplit) {
      if (run_dgelu_form(form, dy, w2, pre, dpre, want_db1, db1)) return {dpre, db1};
      note_gemm_fallback();
    }
  }
  return {dpre, dgelu_split(dy, w2, pre, dpre, want_db1)};
}

at::ScalarType dtype_of(AutogradContext* ctx, const char* key) {
  return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
}

// act = gelu_tanh(pre) again, for fc2's weight gradient, where the forward
// kept only pre (keep_activation false).
at::Tensor gelu_again(const at::Tensor& pre) {
  at::Tensor act = at::empty(pre.sizes(), pre.options());
  at::gelu_out(act, pre, "tanh");
  return act;
}

at::Tensor cast_to(const at::Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.scalar_type() != dtype ? t.to(dtype) : t;
}

struct GeluMlpFunction : public torch::autograd::Function<GeluMlpFunction> {
  // b2 travels as an optional: autograd functions take no undefined tensors.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                            const at::Tensor& w2, const std::optional<at::Tensor>& b2_opt, bool keep_activation) {
    const at::Tensor b2 = b2_opt.value_or(at::Tensor());
    const c10::DeviceGuard device_guard(x.device());  // handle, stream and workspace of x's device
    const int64_t m = detail::leading_rows(x), c = x.size(-1), h = w1.size(0), d = w2.size(0);
    const at::ScalarType dt = x.scalar_type();
    const at::Tensor x2 = x.contiguous().view({m, c});
    const at::Tensor w1c = compute_weight(w1, dt), w2c = compute_weight(w2, dt);
    at::Tensor pre = at::empty({m, h}, x.options());
    at::Tensor act = at::empty({m, h}, x.options());
    std::vector<int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = d;
    at::Tensor y = at::empty(out_sizes, x.options());
    detail::gelu_mlp_forward_into(x2, w1c, b1, w2c, b2, pre, act, y.view({m, d}));

    // Only what the wanted gradients read: act for dW2 (or pre, to compute
    // it again); w2 and pre to reach pre's gradient; then x for dW1 and w1
    // for dx.
    const bool need_pre = x.requires_grad() || w1.requires_grad() || b1.requires_grad();
    const bool keep_act = w2.requires_grad() && keep_activation;
    const at::Tensor none;
    ctx->save_for_backward({w1.requires_grad() ? x2 : none, x.requires_grad() ? w1c : none, need_pre ? w2c : none,
                            need_pre || (w2.requires_grad() && !keep_act) ? pre : none, keep_act ? act : none});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["dtype"] = int64_t(dt);
    ctx->saved_data["w1_dtype"] = int64_t(w1.scalar_type());
    ctx->saved_data["b1_dtype"] = int64_t(b1.scalar_type());
    ctx->saved_data["w2_dtype"] = int64_t(w2.scalar_type());
    ctx->saved_data["b2_dtype"] = b2.defined() ? int64_t(b2.scalar_type()) : int64_t(-1);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(6);
    const variable_list saved = ctx->get_saved_variables();
    const auto wanted_dtype = [&](int input, const char* key) {
      return ctx->needs_input_grad(input) ? std::optional(dtype_of(ctx, key)) : std::nullopt;
    };
    detail::GeluMlpWanted wanted;
    wanted.x = ctx->needs_input_grad(0);
    wanted.w1 = wanted_dtype(1, "w1_dtype"), wanted.b1 = wanted_dtype(2, "b1_dtype");
    wanted.w2 = wanted_dtype(3, "w2_dtype");
    if (ctx->saved_data["b2_dtype"].toInt() >= 0) wanted.b2 = wanted_dtype(4, "b2_dtype");
    const detail::GeluMlpGrads g =
        detail::gelu_mlp_backward(grads[0], {saved[0], saved[1], saved[2], saved[3], saved[4]},
                                  ctx->saved_data["x_sizes"].toIntVector(), dtype_of(ctx, "dtype"), wanted);
    return {g.x, g.w1, g.b1, g.w2, g.b2, at::Tensor()};
  }
};

at::Tensor apply_gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                          const at::Tensor& b2, bool keep_activation) {
  return GeluMlpFunction::apply(x, w1, b1, w2, b2.defined() ? std::optional<at::Tensor>(b2) : std::nullopt,
                                keep_activation);
}

std::atomic<DGeluPath> g_dgelu_path{DGeluPath::kAuto};
std::atomic<GeluBackwardForm> g_gelu_backward_form{GeluBackwardForm::kAuto};

// A choice's kAuto takes the shape rule; a forced one is `yes` or not.
template <typename Choice>
bool decide(Choice choice, Choice yes, bool auto_rule) {
  return choice == Choice::kAuto ? auto_rule : choice == yes;
}
}  // namespace

DGeluPath gelu_mlp_dgelu_path() { return g_dgelu_path.load(); }
void set_gelu_mlp_dgelu_path(DGeluPath path) { g_dgelu_path.store(path); }

bool gelu_mlp_dgelu_in_epilogue(int64_t rows, int64_t hidden) {
  return decide(gelu_mlp_dgelu_path(), DGeluPath::kEpilogue, rows * hidden > kSplitDGeluMaxElements);
}

GeluBackwardForm gelu_mlp_gelu_backward_form() { return g_gelu_backward_form.load(); }
void set_gelu_mlp_gelu_backward_form(GeluBackwardForm form) { g_gelu_backward_form.store(form); }

// With the second stream ATen's pass is faster (its bias sum runs beside the
// critical path); on one stream the fused pass is.
bool gelu_mlp_fused_gelu_backward(int64_t rows, int64_t width) {
  return decide(gelu_mlp_gelu_backward_form(), GeluBackwardForm::kFused, !weight_grad_stream_size_rule(rows, width));
}

at::Tensor gelu_mlp_reference(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                              const at::Tensor& b2) {
  const at::Tensor h = at::linear(x.to(at::kFloat), w1.to(at::kFloat), b1.to(at::kFloat));
  return at::linear(at::gelu(h, "tanh"), w2.to(at::kFloat), b2.defined() ? b2.to(at::kFloat) : b2);
}

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, bool keep_activation) {
  detail::check_gelu_mlp_args(x, w1, b1, w2, b2);
  if (!x.is_cuda()) return gelu_mlp_reference(x, w1, b1, w2, b2).to(x.scalar_type());
  return apply_gelu_mlp(x, w1, b1, w2, b2, keep_activation);
}

namespace detail {

void check_gelu_mlp_args(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                         const at::Tensor& b2) {
  if (!b1.defined()) throw UsageError("gelu_mlp: b1 is required (use linear for no bias)");
  check_linear_args("gelu_mlp fc1", x, w1, b1);
  const int64_t h = w1.size(0);
  if (w2.dim() != 2 || w2.size(1) != h)
    throw UsageError("gelu_mlp: fc1 gives H=" + std::to_string(h) + " features (w1 " + shape(w1) + ") but w2 is " +
                     shape(w2) + "; expected w2 [D, " + std::to_string(h) + "]");
  // fc2's input is the activation: [..., H] in x's dtype on x's device.
  check_linear_params("gelu_mlp fc2", h, x.scalar_type(), x.device(), w2, b2);
}

void gelu_mlp_forward_into(const at::Tensor& x2, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                           const at::Tensor& b2, const at::Tensor& pre, const at::Tensor& act, const at::Tensor& y2) {
  linear_bias_gelu_into(x2, w1, b1.contiguous(), pre, act);
  linear_forward_product(act, w2, b2.defined() ? b2.contiguous() : b2, y2);
}

// The weight gradients are handed off as soon as their inputs exist, each
// before the input-gradient product it can run beside
// (ops/weight_grad_stream.h); their outputs are allocated here, in the
// parameters' dtypes.
GeluMlpGrads gelu_mlp_backward(const at::Tensor& grad, const GeluMlpSaved& saved, at::IntArrayRef x_sizes,
                               at::ScalarType dtype, const GeluMlpWanted& wanted) {
  const int64_t m = leading_rows(x_sizes), c = x_sizes.back();
  const at::Tensor dy = grad.to(dtype).contiguous().view({m, grad.size(-1)});
  const auto out = [&](const std::optional<at::ScalarType>& want, std::initializer_list<int64_t> sizes) {
    return want ? at::empty(sizes, dy.options().dtype(*want)) : at::Tensor();
  };
  const at::Tensor& hidden = saved.pre.defined() ? saved.pre : saved.act;  // [M, H] (undefined: db2 alone)
  const int64_t h = hidden.defined() ? hidden.size(1) : 0, d = dy.size(1);
  GeluMlpGrads g;
  // fc2: dW2 = dy^T act (act computed again when only pre was kept).
  g.w2 = out(wanted.w2, {d, h});
  g.b2 = out(wanted.b2, {d});
  if (g.w2.defined() || g.b2.defined()) {
    const at::Tensor a = saved.act.defined() || !g.w2.defined() ? saved.act : gelu_again(saved.pre);
    run_weight_grads([&] { linear_weight_grad_into(dy, a, g.w2, g.b2); }, {dy, a});
  }
  if (wanted.x || wanted.w1 || wanted.b1) {
    auto [dpre, db1_fused] = fc2_back_through_gelu(dy, saved.w2, saved.pre, wanted.b1.has_value());
    // fc1: dW1 = dpre^T x (taking db1 here when the DGELU product did not).
    g.w1 = out(wanted.w1, {h, c});
    g.b1 = db1_fused.defined() ? db1_fused : out(wanted.b1, {h});
    const at::Tensor db1_here = db1_fused.defined() ? at::Tensor() : g.b1;
    if (g.w1.defined() || db1_here.defined())
      run_weight_grads([&] { linear_weight_grad_into(dpre, saved.x2, g.w1, db1_here); }, {dpre, saved.x2});
    if (wanted.x) {
      g.x = at::empty(x_sizes, dy.options());
      linear_input_grad(dpre, saved.w1, g.x.view({m, c}));
    }
    if (wanted.b1) g.b1 = cast_to(g.b1, *wanted.b1);
  }
  return g;
}

// Our Hopper kernel where it applies (bf16 on sm_90, m % 128, h % 256,
// c % 64), else where cuBLASLt takes the epilogue (fp32 bias first, then the
// cast bias), else ATen.
void linear_bias_gelu_into(const at::Tensor& x2, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& pre,
                           const at::Tensor& act) {
  if (try_gemm_bias_gelu_sm90(x2, w1, b1, pre, act)) return;
  if (cublaslt_path(x2, w1)) {
    if (try_gemm_lt(x2, false, w1, true, act, GemmEpilogue::kGeluAuxBias, b1, pre)) return;
    if (b1.scalar_type() != x2.scalar_type() &&
        try_gemm_lt(x2, false, w1, true, act, GemmEpilogue::kGeluAuxBias, compute_weight(b1, x2.scalar_type()), pre))
      return;
    note_gemm_fallback();
  }
  detail::linear_forward_product(x2, w1, b1, pre);
  at::Tensor out = act;  // a handle to the caller's tensor
  at::gelu_out(out, pre, "tanh");
}

at::Tensor gelu_mlp_function(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                             const at::Tensor& b2, bool keep_activation) {
  detail::check_gelu_mlp_args(x, w1, b1, w2, b2);
  return apply_gelu_mlp(x, w1, b1, w2, b2, keep_activation);
}
}  // namespace detail

}  // namespace perftrain::ops
