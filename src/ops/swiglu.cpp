#include "ops/swiglu.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/silu.h>

#include <string>

#include "base/error.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "swiglu";

// gate_up defined, at least 1-d, an even last dimension of at least 2, and a
// floating dtype the op takes (float64 only for the reference).
void check_gate_up(const at::Tensor& gate_up, bool allow_double) {
  const std::string o(kOp);
  if (!gate_up.defined()) throw UsageError(o + ": gate_up must be a defined tensor");
  if (gate_up.dim() < 1) throw UsageError(o + ": gate_up must be [..., 2F], got a 0-d tensor");
  const int64_t n = gate_up.size(-1);
  if (n < 2 || n % 2 != 0)
    throw UsageError(o + ": gate_up's last dimension must be 2F (even, F >= 1: gate then up), got shape " +
                     shape(gate_up));
  if (allow_double && gate_up.scalar_type() == at::kDouble) return;
  check_kernel_dtype(kOp, gate_up.scalar_type(), "gate_up");
}

}  // namespace

at::Tensor swiglu_reference(const at::Tensor& gate_up) {
  check_gate_up(gate_up, /*allow_double=*/true);
  const int64_t f = gate_up.size(-1) / 2;
  const at::ScalarType ct = gate_up.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor gu = gate_up.to(ct);
  return (at::silu(gu.narrow(-1, 0, f)) * gu.narrow(-1, f, f)).to(gate_up.scalar_type());
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  check_gate_up(gate_up, /*allow_double=*/false);
  // CUDA: kernel pending; the reference meanwhile (same values, unfused).
  return swiglu_reference(gate_up);
}

}  // namespace perftrain::ops
