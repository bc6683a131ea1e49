#include "diffusion/guidance.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full_like.h>

#include <cmath>
#include <string>
#include <utility>

#include "base/error.h"

namespace perftrain::diffusion {

ModelFn classifier_free_guidance(ModelFn model, int64_t null_label, double scale) {
  if (!model) throw UsageError("classifier-free guidance: no model");
  if (!std::isfinite(scale)) throw UsageError("classifier-free guidance: scale must be finite");
  if (scale == 1.0) {
    // u + 1 * (c - u) = c: skip the unconditional half entirely.
    return [model = std::move(model)](const at::Tensor& x, const at::Tensor& t,
                                      const at::Tensor& y) { return model(x, t, y); };
  }
  return [model = std::move(model), null_label, scale](const at::Tensor& x, const at::Tensor& t,
                                                       const at::Tensor& y) {
    const int64_t B = x.size(0);
    const int64_t C = x.size(1);
    const at::Tensor out =
        model(at::cat({x, x}), at::cat({t, t}), at::cat({y, at::full_like(y, null_label)}))
            .to(at::kFloat);  // guidance amplifies c - u: keep bf16 rounding out of it
    if (out.size(0) != 2 * B || (out.size(1) != C && out.size(1) != 2 * C))
      throw UsageError("classifier-free guidance: model returned " +
                       std::to_string(out.size(1)) + " channels for a " + std::to_string(C) +
                       "-channel input");
    const at::Tensor cond = out.narrow(0, 0, B);
    const at::Tensor uncond = out.narrow(0, B, B);
    const at::Tensor c = cond.narrow(1, 0, C);
    const at::Tensor u = uncond.narrow(1, 0, C);
    const at::Tensor guided = u.add(c.sub(u).mul(scale));
    if (out.size(1) == C) return guided;
    return at::cat({guided, cond.narrow(1, C, C)}, 1);
  };
}

}  // namespace perftrain::diffusion
