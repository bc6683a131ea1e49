// One optimizer step over every parameter in three multi-tensor launches
// (kernels/multi_tensor_adamw.h): global gradient norm, fp16 dynamic loss
// scale with inf/NaN skip, LR warm-up, norm clipping, AdamW and the EMA, all
// on the device with no host sync and no allocation, so it captures in a CUDA
// graph. The per-step scalars live in a small float32 tensor on the device
// (make_adamw_scalars), one slot each, so callers read them as 0-d views.
//
// Step semantics (the reference below spells them in plain ATen):
//   norm = sqrt(sum g^2) / loss_scale; found_inf = !isfinite(norm)  (NaN, not computed, without grad_norm)
//   dynamic scale: inf -> scale /= 2, skip the whole update; else every
//   growth_interval finite steps scale *= 2 (as torch.amp.GradScaler)
//   schedule_step += 1 (every step, skipped ones too); lr = lr_at(schedule, schedule_step)
//   step += 1 (updates taken)
//   g *= (1 / loss_scale) * min(1, grad_clip / (norm + 1e-6))   (clip > 0)
//   AdamW (decoupled weight decay on the tensors whose group has it,
//   bias-corrected, as _fused_adamw_), then
//   ema = lerp(ema, p, 1 - d), d = ema_decay_at(ema schedule, step - 1)
// (the schedules' closed forms: kernels/optimizer_schedule.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/optimizer_schedule.h"

namespace perftrain::ops {

struct MultiTensorAdamWOptions {
  // The LR schedule (lr_schedule_of): peak lr, warm-up, shape, floor, the
  // total steps it spans and wsd's decay fraction.
  double lr = 1e-4;
  int64_t warmup_steps = 0;
  kernels::LrShape lr_shape = kernels::LrShape::kConstant;
  double lr_min = 0;
  int64_t total_steps = 0;
  double decay_fraction = 0.2;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  double grad_clip = 0;  // 0: off
  // The EMA decay schedule (ema_schedule_of).
  double ema_decay = 0.9999;
  bool ema_warmup = true;
  int64_t ema_start = 0;  // updates before this one copy the weights into the EMA
  bool dynamic_loss_scale = false;
  int64_t growth_interval = 2000;
  // false: skip the pass over every gradient that only the norm needs; the
  // norm slot reads NaN. Only without clipping and the dynamic loss scale,
  // which need it (the constructor throws UsageError otherwise). For a step
  // that must match one without a norm (the benchmark against torch's AdamW).
  bool grad_norm = true;
  // Without the dynamic loss scale: a step whose gradient norm is inf/NaN
  // changes nothing but the skipped count (the weights never take a NaN).
  // Needs grad_norm.
  bool skip_nonfinite = false;
};

inline kernels::LrSchedule lr_schedule_of(const MultiTensorAdamWOptions& o) {
  kernels::LrSchedule s;
  s.lr = o.lr, s.lr_min = o.lr_min, s.warmup_steps = o.warmup_steps, s.total_steps = o.total_steps;
  s.decay_fraction = o.decay_fraction, s.shape = o.lr_shape;
  return s;
}
inline kernels::EmaSchedule ema_schedule_of(const MultiTensorAdamWOptions& o) {
  return kernels::EmaSchedule{o.ema_decay, o.ema_warmup, o.ema_start};
}
// The LR schedule's shape by its name (constant, cosine, linear, wsd), as
// train.lr_schedule and the Python op spell it; nullopt for another name.
std::optional<kernels::LrShape> lr_shape_named(const std::string& name);
// The inverse: the options' schedule fields set from the two schedules.
inline void set_schedules(MultiTensorAdamWOptions& o, const kernels::LrSchedule& s, const kernels::EmaSchedule& e) {
  o.lr = s.lr, o.lr_min = s.lr_min, o.warmup_steps = s.warmup_steps, o.total_steps = s.total_steps;
  o.decay_fraction = s.decay_fraction, o.lr_shape = s.shape;
  o.ema_decay = e.decay, o.ema_warmup = e.warmup, o.ema_start = e.start;
}

// Slots of the scalars tensor (the order of kernels::AdamWScalars).
enum AdamWSlot : int64_t {
  kSlotLossScale = 0,  // scale the gradients carry; after step(): the one for the next step
  kSlotGradNorm = 1,   // unscaled, before clipping, of the last step
  kSlotLr = 2,         // LR of the last step (skipped ones too)
  kSlotSkipped = 3,    // steps skipped for inf/NaN, in total
  kSlotStep = 4,       // updates taken (AdamW's step counter)
  kSlotGoodSteps = 5,  // finite steps since the loss scale last changed
  kSlotSkip = 6,       // 1: the last step was skipped (inf/NaN)
  kSlotEmaWeight = 11,  // 1 - EMA decay of the last update (the lerp weight)
  kSlotScheduleStep = 12,  // steps taken, skipped ones too: the LR schedule's position
};

// A fresh scalars tensor: float32 [adamw_scalar_slots()] on `device`, step 0.
at::Tensor make_adamw_scalars(at::Device device, double loss_scale);
int64_t adamw_scalar_slots();

// The launch plan for one fixed list of parameters: descriptor tables, grids
// and the partial-sum buffer are made here, once. It keeps references to the
// tensors (not copies): they must stay allocated; their contents may change.
class MultiTensorAdamW {
 public:
  // params, exp_avgs, exp_avg_sqs, emas: float32, contiguous, one device,
  // pairwise the same sizes; emas may be empty (no EMA). scalars from
  // make_adamw_scalars on the same device. names (optional) label errors.
  // shadows (optional, one per parameter, each may be undefined): bf16
  // contiguous tensors of the parameters' sizes that every step rewrites as
  // params[i].to(bfloat16) where the parameter changed (the caller fills
  // them once at the start; they stay in step from then on).
  // norm_only (optional): float32 contiguous tensors on the device whose
  // gradients count in the gradient norm but are not updated here (ZeRO-1:
  // the parameters another rank owns; train/sharded_optimizer.h).
  // decay (optional, one per parameter): whether weight_decay applies to it
  // (its parameter group; train/weight_decay.h). Empty: to every parameter.
  MultiTensorAdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> exp_avgs,
                   std::vector<at::Tensor> exp_avg_sqs, std::vector<at::Tensor> emas, at::Tensor scalars,
                   MultiTensorAdamWOptions opts, std::vector<std::string> names = {},
                   std::vector<at::Tensor> shadows = {}, std::vector<at::Tensor> norm_only = {},
                   std::vector<bool> decay = {});
  ~MultiTensorAdamW();
  MultiTensorAdamW(const MultiTensorAdamW&) = delete;
  MultiTensorAdamW& operator=(const MultiTensorAdamW&) = delete;

  // One step with grads[i] the gradient of params[i] (undefined: that
  // parameter and its moments stay as they are, its EMA still follows it).
  // CUDA: three launch groups on the current stream. CPU: the reference.
  // norm_grads: the gradients of the norm_only tensors, in their order
  // (undefined: not counted).
  void step(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& norm_grads = {});

  const MultiTensorAdamWOptions& options() const { return opts_; }
  // Kernel launches per step (2 per table + 1), for the profile breakdown.
  int launches_per_step() const;

 private:
  struct Plan;
  std::vector<at::Tensor> params_, exp_avgs_, exp_avg_sqs_, emas_, shadows_, norm_only_;
  at::Tensor scalars_;
  MultiTensorAdamWOptions opts_;
  std::vector<std::string> names_;
  std::vector<bool> decay_;     // per parameter (all true when not given)
  std::unique_ptr<Plan> plan_;  // CUDA only
};

// The plain-ATen fp32 reference of one step, same arguments and semantics
// (host syncs: it reads and writes `scalars` through the host). norm_grads
// count in the norm only (as MultiTensorAdamW::step's); decay as the
// constructor's (empty: every parameter decays).
void multi_tensor_adamw_reference(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                  const std::vector<at::Tensor>& exp_avgs,
                                  const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& emas,
                                  const at::Tensor& scalars, const MultiTensorAdamWOptions& opts,
                                  const std::vector<at::Tensor>& norm_grads = {},
                                  const std::vector<bool>& decay = {});

}  // namespace perftrain::ops
