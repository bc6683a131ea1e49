// One training step of a DiT, the way it runs fastest on the device at hand:
// the objective (timestep and noise sampling, label dropout, forward, loss),
// backward (over train.accumulate micro-batches), gradient clipping, AdamW,
// the EMA and the LR schedule, with
//  - precision: bf16 (default) or fp16 autocast over the forward, or fp32
//    with TF32 matrix products; fp16 keeps a dynamic loss scale on the device;
//    fp8: the blocks' big linears as fp8 products with delayed scaling (its
//    states here, updated once a step between backward and the optimizer;
//    bf16 autocast elsewhere on CUDA, fp32 on the CPU, where the fused
//    schedule runs on the ops' references);
//  - fused kernels in the DiT blocks (adaLN LayerNorm, gated residual,
//    cuBLASLt matrix products with bias / GELU epilogues);
//  - the optimizer on the device (one multi-tensor launch for clip, AdamW,
//    EMA, LR; no host sync);
//  - the whole step captured once in a CUDA graph and replayed: static input
//    buffers filled by one asynchronous copy from pinned memory on a side
//    stream, overlapping the previous step.
// When the graph cannot be used (a CPU device, `graph = false`, an objective
// that syncs) the step runs eagerly and graph_status() says why in one line.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/batch_loader.h"
#include "models/diffusion_model.h"
#include "observe/grad_health.h"
#include "train/config.h"
#include "train/nan_locator.h"

namespace perftrain::distributed {
class Group;
}

namespace perftrain::train {

// What a step runner needs beyond the config. The step's shape (graph,
// fused kernels, device optimizer, recompute, GELU recompute) is cfg.speed;
// the process-wide [speed] keys are apply_speed_settings' (train/speed.h).
struct StepOptions {
  std::string precision = "bf16";  // bf16 | fp16 | fp32 | fp8 (train.precision resolved for the device)
  int warmup_steps = 3;            // eager steps before the capture
  // The gradient norm each step, for the log, also without clipping; false:
  // only where clipping or the fp16 loss scale needs it (the bench again).
  bool grad_norm = true;
  // Data parallel (docs/guide/multi-gpu.md): each batch is this rank's slice
  // of the global batch; the timesteps, noise and label dropout are drawn for
  // the global batch (the same generator state on every rank) and sliced, and
  // the gradients are averaged over the ranks between backward and the
  // optimizer, in buckets sent during backward (distributed/grad_buckets.h); on
  // CUDA (NCCL) inside the captured step too. null: one process.
  distributed::Group* group = nullptr;
};

// Loss terms summed on the device since the last take_window().
struct WindowStats {
  int64_t steps = 0;
  double loss = 0, mse = 0, vb = 0;  // means over the window (vb: 0 when not learned)
  double aux = 0;                    // the model's auxiliary loss, in `loss` (0: none; a looped model's routers')
  double grad_norm = -1;             // of the last step (NaN/Inf too); -1: not tracked (StepOptions::grad_norm off, no clipping)
  double lr = 0;                     // of the last step
  double loss_scale = 1;             // fp16 only
  int64_t skipped_steps = 0;         // fp16 steps skipped for inf/NaN gradients, in total
  // The non-finite guard (health.nan_policy; off in the bench, whose step
  // has no gradient norm): steps of the window whose loss or gradient norm
  // was inf/NaN, their update skipped and left out of the means above, and
  // the first of them (runner step, 1 = this runner's first; -1: none).
  int64_t nonfinite_steps = 0;
  int64_t first_nonfinite_step = -1;
};

class StepRunner {
 public:
  // model and ema live on `device` already; ema null: no EMA is kept (perftrain
  // bench, whose step is torch's reference step: AdamW without one). gen is
  // the training generator (timesteps, noise, label dropout). cfg gives the
  // objective, the optimizer hyper-parameters, the batch size and the step's
  // speed settings (cfg.speed; the model runs dit_execution(cfg.speed)).
  // A model without a fused path (has_fused_path) runs its generic path.
  StepRunner(models::DiffusionModel& model, models::DiffusionModel* ema, const TrainConfig& cfg,
             const StepOptions& opts, at::Device device, at::Generator gen);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Queues one step on batch.x [B, C, H, W] float32 / batch.y [B] int64
  // (and batch.cond / cond_len for a model with condition features)
  // (CPU, pinned for an asynchronous copy, or already on the device).
  // With train.accumulate = N the batch holds the step's N micro-batches,
  // rows [k B/N, (k + 1) B/N) the k-th (B not a multiple of N: UsageError):
  // N forward and backward passes, one update.
  // No host sync, except the one-off capture after the warm-up steps.
  void step(const data::Batch& batch);
  int64_t steps_done() const { return steps_done_; }

  // Means of the loss terms since the last call (one host sync).
  WindowStats take_window();

  // "captured at step 4" / "eager: <reason>" / "eager: warming up".
  const std::string& graph_status() const { return graph_status_; }
  bool graph_active() const;
  // Whether the backward runs its weight gradients on a second stream
  // (fused kernels without recompute, and ops::weight_grad_stream_for's rule,
  // speed.weight_grad_stream; turned off at the first step for a model that
  // uses a weight twice, and the note says so: "" otherwise).
  bool weight_grad_stream() const;
  const std::string& weight_grad_note() const;
  // Data parallel: how the gradients are all-reduced (distributed::GradBuckets::describe()); "" in one process.
  std::string data_parallel_note() const;

  // Gradient health (health.monitor_every > 0; train/grad_monitor.h): the
  // statistics of the monitored steps whose copy to the host has finished
  // (wait: all of them), step = runner step. A note when monitored steps
  // could not be captured ("" otherwise).
  std::vector<observe::GradHealthSample> take_grad_health(bool wait = false);
  const std::string& monitor_note() const;
  // Re-runs the batch of runner step `step` (one of the last log.every + 1)
  // eagerly on the plain modules, from the generator state that step began
  // with and the current weights (with nan_policy stop, those the step saw:
  // every update after it was skipped), checking every module's output and
  // every gradient (train/nan_locator.h). found = false, with the reason in
  // detail, when that batch is no longer kept or nothing went non-finite.
  NonFiniteSite locate_nonfinite(int64_t step);

  // fp8 (train.precision = fp8): the linears' scaling states (null
  // otherwise), and a line for the log and report: how many linears run fp8
  // products, and which ran ops::linear (shapes not multiples of 16 on CUDA).
  const models::Fp8States* fp8_states() const;
  models::Fp8States* fp8_states();
  std::string fp8_note() const;

  // Optimizer state for checkpoints, named as AdamW::state() names it; with
  // fp8 the scaling states too, as "fp8.<layer>.<tensor>" and
  // "fp8.history_len" (load_optimizer_state refuses a state with them when
  // this run is not fp8, or without them when it is: UsageError).
  // With distributed.shard_optimizer a collective (every rank calls it): the whole
  // state gathered on rank 0 (host copies), empty on the other ranks; loading
  // takes each rank's own parameters' part of a whole state.
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;
  void load_optimizer_state(const std::vector<std::pair<std::string, at::Tensor>>& state);
  // distributed.shard_optimizer: "optimizer state sharded over N ranks: ... here of ..."; "" when not sharded.
  std::string optimizer_sharding() const;
  // A resumed run's global step: where the LR schedule stands (it follows
  // the global step, skipped steps too) and the host path's count of
  // updates for the EMA schedule.
  void set_global_step(int64_t step);

 private:
  int opts_warmup() const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t steps_done_ = 0;
  std::string graph_status_;
};

}  // namespace perftrain::train
