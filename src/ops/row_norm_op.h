// What the row-norm ops (adaln_layernorm, residual_adaln, rms_adaln,
// residual_rms_adaln: the kernels of kernels/row_norm.cuh) share around their
// kernels: the checks of their optional inputs, the forward's tensors (x made
// dense, the activations' kernel type, the outputs and what the backward
// keeps), the dtypes saved for the backward, and the backward's plumbing (the
// incoming gradients made dense, scratch, the per-sample weight gradients
// summed over the batch on the weight-gradient lane).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/fp8_cast.h"
#include "ops/dtype_dispatch.h"
#include "ops/fp8_cast.h"

#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

namespace perftrain::ops {

// The types the row-norm ops' autograd functions take and return.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

}  // namespace perftrain::ops

namespace perftrain::ops::detail {

// The check the RMS ops make on a norm weight: undefined, or [D] (D =
// x.size(-1)) of a floating dtype on x's device; UsageError naming `op` and
// `what` otherwise.
void check_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight, const char* what);

// The row-norm ops' argument checks (check_row_op_args): x, `like_x` (y),
// the per-sample rows `rows`, and those of `optional_rows` that are defined
// (an undefined one is an absent input); out_dtype a kernel dtype.
void check_row_norm_args(const char* op, const at::Tensor& x, const std::vector<NamedTensor>& like_x,
                         const std::vector<NamedTensor>& rows, const std::vector<NamedTensor>& optional_rows,
                         int64_t max_cols, at::ScalarType out_dtype);

// An autograd function takes no undefined tensor: an absent input travels as
// nullopt (and has no input edge).
std::optional<at::Tensor> optional_tensor(const at::Tensor& t);

// The per-sample rows (gate, shift, scale: [B, D], the last dimension made
// dense) in the one kernel type they share: their own where the defined ones
// agree, fp32 otherwise (tiny tensors). Undefined ones stay undefined.
std::vector<at::Tensor> per_sample_rows(std::initializer_list<at::Tensor> rows);

// A forward's tensors. act is the kernels' type of y, h and xhat: out_dtype,
// or for the residual ops fp32 where y is not in out_dtype (both then go
// through fp32, which changes no value: y's upcast is exact and h is rounded
// once, by the caller's cast to out_dtype). xhat, the normalised rows in act,
// is kept (instead of x or x1) where it is narrower: a 16-bit act and a wider
// x, the bf16 training path.
struct RowNormTensors {
  int batch = 0, tokens = 0, cols = 0;
  at::Tensor x;     // contiguous
  at::ScalarType act = at::kFloat;
  at::Tensor y;     // in act, contiguous (residual ops)
  at::Tensor x1;    // like x (residual ops)
  at::Tensor h;     // in act; undefined where the fp8 output is fused (not written)
  at::Tensor xhat;  // in act, where kept
  at::Tensor stat;  // a second per-row fp32 statistic where asked for (the mean, or y's rstd)
  at::Tensor rstd;  // per-row fp32
};

// x [B, T, D]; y like x for a residual op, else undefined. keep_xhat: whether
// the op's backward can read xhat; stat: whether a second per-row statistic
// is kept; fp8: the forward's fp8 output (null: none), where it is fused no h
// is made (the kernels write only the codes).
RowNormTensors row_norm_tensors(const at::Tensor& x, const at::Tensor& y, at::ScalarType out_dtype, bool keep_xhat,
                                bool stat, const Fp8Target* fp8 = nullptr);

// Whether a forward's fp8 output is fused: an fp8 output and the kernels'
// h type act is out_dtype.
bool fp8_output_fused(const Fp8Target* fp8, at::ScalarType act, at::ScalarType out_dtype);

// A forward's fp8 output (ops/fp8_cast.h: Fp8Target, Fp8Operand; null: none).
// Fused where the kernels write h in out_dtype (t.act): the codes [B*T, D]
// and the kernels' Fp8RowOut for them, and h is then not written. Else
// (a residual op whose y is not in out_dtype) the op casts h afterwards.
struct FusedFp8Output {
  bool fused = false;
  at::Tensor codes;
  kernels::Fp8RowOut kernel;
};
FusedFp8Output fused_fp8_output(const Fp8Target* fp8, const RowNormTensors& t, at::ScalarType out_dtype,
                                const char* op);
// After the kernels, from their h (t.h, in t.act): fused, the stand-in for h
// (x's sizes) and the codes; else h in out_dtype and, with fp8, fp8_cast of it.
struct FinishedFp8Output {
  at::Tensor h, codes;
};
FinishedFp8Output finish_fp8_output(const FusedFp8Output& q, const Fp8Target* fp8, const RowNormTensors& t,
                                    at::ScalarType out_dtype, const char* op);

// The inputs' dtypes saved for the backward, by key: -1 for an undefined one.
void save_dtypes(torch::autograd::AutogradContext* ctx,
                 std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs);
// A residual op's: the activations' kernel type ("act") and x's, y's and gate's dtypes.
void save_residual_types(torch::autograd::AutogradContext* ctx, at::ScalarType act, const at::Tensor& x,
                         const at::Tensor& y, const at::Tensor& gate);
bool saved_present(torch::autograd::AutogradContext* ctx, const char* key);
at::ScalarType saved_dtype(torch::autograd::AutogradContext* ctx, const char* key);

// t in dtype d (t itself when it already is).
at::Tensor as_dtype(const at::Tensor& t, at::ScalarType d);

// An incoming gradient in dtype d and dense (a broadcast or strided one is
// made dense once); undefined stays undefined.
at::Tensor dense_grad(const at::Tensor& g, at::ScalarType d);

// The current device's SM count (what the backward tile counts take).
int sm_count();

// Shape-determined fp32 scratch of n floats from the caching allocator on
// like's device: fine under graph capture.
at::Tensor f32_scratch(int64_t n, const at::Tensor& like);

// A weight-like gradient (a bias, a norm weight): its per-sample fp32 sums
// [B, D] and the parameter's dtype.
struct PerSampleGrad {
  at::Tensor per_sample;
  at::ScalarType dtype;
};

// Each per-sample gradient summed over the batch in fp32, then rounded once to
// its parameter's dtype, as new [D] tensors. They are for the optimizer only,
// so the sums run beside the rest of the backward when a weight-gradient
// scope is open (ops::run_weight_grads).
std::vector<at::Tensor> batch_sums_on_lane(const std::vector<PerSampleGrad>& grads);

}  // namespace perftrain::ops::detail
