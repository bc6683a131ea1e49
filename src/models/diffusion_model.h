// What the trainer, the step runner, checkpoints and sampling need of a
// model, whichever family it is (models::DiT, models::SingleStreamDiT): a
// forward of the noisy input, the time and the condition, run as the caller
// says, and its config; its tensors come from nn::Module.
#pragma once

#include <ATen/core/Tensor.h>

#include <future>
#include <memory>

#include "models/dit_config.h"
#include "models/fp8_states.h"
#include "nn/module.h"

namespace perftrain::models {

// How forward runs its blocks, chosen by the caller (the step runner, from
// the [speed] config); the default is the plain eager path.
struct DiTExecution {
  // Through the fused ops (src/ops) rather than the plain ATen modules
  // (a model without a fused path ignores it: has_fused_path()).
  bool fused_kernels = false;
  // Each block's activations recomputed in backward instead of kept: less
  // memory, one more block forward per step.
  bool recompute = false;
  // Fused blocks: keep only each MLP's pre-activation and compute GELU again
  // in backward (gelu_mlp's keep_activation false): one [B*T, 4D] tensor
  // less per block held for backward, one elementwise pass more. The
  // single-stream blocks likewise keep only SwiGLU's gate_up
  // (ops::swiglu_product_linear): one [B*S, F] tensor less per block.
  bool gelu_recompute = false;
  // fp8 products (train.precision = fp8, issue 39): the fused schedules run
  // their blocks' big linears (qkv, attention out, MLP / SwiGLU) through
  // ops::fp8_linear with the states of this table (models/fp8_states.h),
  // owned by the caller; null: none. Needs fused_kernels, without recompute.
  Fp8States* fp8 = nullptr;
};

// The condition of a batch. labels: [B] int64 class labels (the null class
// num_classes means "unconditional"). features / lengths: [B, Tc, Dc] float
// condition features and [B] int64 valid tokens per sample (a model with
// cond_dim > 0; length 0 is the null condition); undefined otherwise.
struct Condition {
  at::Tensor labels;
  at::Tensor features;
  at::Tensor lengths;
};

// A training forward's output: the prediction and the model's own auxiliary
// loss (already weighted; undefined when the model has none).
struct ForwardOutput {
  at::Tensor out, aux_loss;
};

class DiffusionModel : public nn::Module {
 public:
  // x [B, C, H, W], t [B] float (timestep units) -> [B, out, H, W].
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                             const DiTExecution& exec = {}) const = 0;
  // The forward a training step runs: forward's output and the auxiliary
  // loss the objective adds (a looped model's routers'); none by default.
  virtual ForwardOutput forward_train(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                      const DiTExecution& exec = {}) const {
    return {forward(x, t, cond, exec), at::Tensor()};
  }
  virtual const DiTConfig& config() const = 0;
  // Whether exec.fused_kernels changes anything (DiT's fused ops).
  virtual bool has_fused_path() const { return false; }
};

// The model cfg.family names, built as build_model builds a DiT: on
// `device`, drawn from that device's generator seeded with `seed`,
// trainable tensors requiring gradients.
std::unique_ptr<DiffusionModel> build_diffusion_model(const DiTConfig& cfg, uint64_t seed, const at::Device& device);
// On the CPU in float32 (e.g. to load weights into).
std::unique_ptr<DiffusionModel> make_diffusion_model(const DiTConfig& cfg, uint64_t seed);

struct DiffusionModelAndEma {
  std::unique_ptr<DiffusionModel> model, ema;  // the same initial weights; the EMA takes no gradients
};
DiffusionModelAndEma build_diffusion_model_and_ema(const DiTConfig& cfg, uint64_t seed, const at::Device& device);

// A model and its EMA from one builder (the same seed, so the same weights):
// on the CPU two threads, since its draws are slow for large models; the
// EMA's parameters take no gradients.
template <class Pair, class Build>
Pair build_with_ema(const Build& build, const at::Device& device) {
  Pair out;
  if (device.is_cpu()) {
    auto ema = std::async(std::launch::async, build);
    out.model = build();
    out.ema = ema.get();
  } else {
    out.model = build();
    out.ema = build();
  }
  for (auto& p : out.ema->parameters()) p.set_requires_grad(false);
  return out;
}

}  // namespace perftrain::models
