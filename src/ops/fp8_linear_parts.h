// The pieces of fp8_linear's autograd function (ops/fp8_linear.h) that the
// ops fusing an activation's casts around the same products reuse
// (ops/fp8_linear_gelu.h, ops/fp8_linear_swiglu.h): the checks, the products,
// the operands' codes, and the two gradient products from dY's codes.
// Internal to ops/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "ops/fp8_cast.h"
#include "ops/fp8_scaling.h"

namespace perftrain::ops::detail {

// A differentiable input as the autograd functions take it: itself under
// grad mode; detached under no-grad (sampling), where no backward runs, so
// that their forwards cast no transpose for one (need_dx, need_dw false).
at::Tensor grad_mode_input(const at::Tensor& t);
std::vector<at::Tensor> grad_mode_inputs(const std::vector<at::Tensor>& ts);

// fp8_linear's argument checks (x, weight, bias, state, sizes; UsageError).
void check_fp8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const Fp8Scaling& state);
// The same for a weight given as row blocks [N_i, K] (no bias).
void check_fp8_linear_args(const at::Tensor& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state);
// An operand's codes [M, K] E4M3 on x's device, contiguous, and its
// transposed codes [K, M] where given (std::nullopt otherwise); UsageError
// on other shapes or dtypes.
at::Tensor checked_fp8_codes(const Fp8Operand& x);
std::optional<at::Tensor> checked_fp8_codes_t(const Fp8Operand& x);

// d = (a_scale_inv a) (b_scale_inv b)^T (+ bias), a [m, k] and b [n, k] fp8:
// cuBLASLt on CUDA (the bias as given, else as a bf16 copy), else the
// dequantised product by ATen (a fallback on CUDA, counted).
void fp8_product(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                 const at::Tensor& b_scale_inv, const at::Tensor& d, bool fast_accum, const at::Tensor& bias);

// x [M, K]'s E4M3 codes for the state's x slot, and where `transposed` their
// transpose (for dW): the producer's codes where given (x's values then not
// read; the transpose the producer's, else fp8_transpose of the codes), else
// one cast(-transpose) of x.
Fp8Casts fp8_input_codes(const at::Tensor& x2d, const std::optional<at::Tensor>& x_codes,
                         const std::optional<at::Tensor>& x_codes_t, const at::Tensor& scale, const at::Tensor& amax,
                         bool transposed);

// The weight's codes q [N, K] (and q_t [K, N] where `transposed`) from its
// row blocks [N_i, K] in compute dtype dt: one cast of each block in place,
// its codes at row offset sum_{j<i} N_j (no concatenation made); the W slot's
// amax takes every block's.
Fp8Casts fp8_weight_codes(at::TensorList weights, at::ScalarType dt, const at::Tensor& scale, const at::Tensor& amax,
                          bool transposed);

// The forward product y [m, N] = x W^T (+ b) in x's dtype (fast accumulation)
// on the codes of x (fp8_input_codes; x [..., K]) and of the weight's row
// blocks (fp8_weight_codes; N their rows), with x's transpose where dW is
// wanted and W's where dX is: what the forwards of fp8_linear,
// fp8_linear_gelu and fp8_linear_swiglu share.
struct Fp8Product {
  Fp8Casts xq, wq;
  at::Tensor y;
};
Fp8Product fp8_forward_product(const at::Tensor& x, at::TensorList weights, const at::Tensor& bias,
                               const std::optional<at::Tensor>& x_codes, const std::optional<at::Tensor>& x_codes_t,
                               const at::Tensor& scale, const at::Tensor& amax, const at::Tensor& scale_inv,
                               bool need_dx, bool need_dw);

// The stand-in (fp8_stand_in) of a product's output [..., n] on x [..., k],
// for an op that writes only the output's codes.
at::Tensor fp8_stand_in_for(const at::Tensor& x, int64_t n);

// dX [m, k] = dY W from dY's E5M2 codes dq [m, n] and W^T's codes [k, n],
// into dx (a [m, k] view).
void fp8_linear_dx(const at::Tensor& dq, const at::Tensor& wq_t, const at::Tensor& scale_inv, const at::Tensor& dx);
// dW [n, k] = dY^T x from dY^T's codes [n, m] and x^T's [k, m], in w_dtype.
at::Tensor fp8_linear_dw(const at::Tensor& dq_t, const at::Tensor& xq_t, const at::Tensor& scale_inv,
                         at::ScalarType w_dtype);

}  // namespace perftrain::ops::detail
