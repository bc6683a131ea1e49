#include "train/step_runner.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "base/error.h"
#include "base/scope.h"
#include "diffusion/ddpm.h"
#include "diffusion/flow.h"
#include "diffusion/objective.h"
#include "compat/compat.h"
#include "ops/compute_weights.h"
#include "ops/cublaslt_workspace.h"
#include "ops/weight_grad_stream.h"
#include "train/adamw.h"
#include "distributed/grad_buckets.h"
#include "distributed/group.h"
#include "train/device_optimizer.h"
#include "train/ema.h"
#include "train/fp8_training.h"
#include "train/grad_clip.h"
#include "train/grad_monitor.h"
#include "train/lr_schedule.h"
#include "train/sharded_optimizer.h"
#include "train/speed.h"

namespace perftrain::train {

struct StepRunner::Impl {
  models::DiffusionModel& model;
  TrainConfig cfg;
  StepOptions opts;
  at::Device device;
  at::Generator gen;
  std::optional<at::ScalarType> autocast;  // bf16 / fp16, or fp32 without autocast
  models::DiTExecution execution;          // how the model's blocks run
  // train.precision = fp8: the linears' scaling states (execution.fp8 points here).
  std::unique_ptr<models::Fp8States> fp8;
  std::vector<at::Tensor> params, ema_params;
  // Data parallel: the gradients' buckets, all-reduced as backward fills them.
  std::unique_ptr<distributed::GradBuckets> buckets;

  // The optimizer: on the device (capturable), or ATen's AdamW with a host LR.
  std::unique_ptr<DeviceOptimizer> device_optimizer;
  ops::ComputeWeights compute_weights;  // its bf16 parameter copies, read by the fused ops
  std::unique_ptr<AdamW> adamw;
  // ZeRO-1 (distributed.shard_optimizer): the optimizer updates this rank's
  // parameters only, then the owners' weights go to every rank.
  std::unique_ptr<OptimizerShards> shards;
  // Host path: updates taken (the EMA schedule) and steps taken, skipped
  // ones too (the LR schedule's position, as the device optimizer's).
  int64_t updates = 0, schedule_step = 0;
  kernels::LrSchedule lr_schedule;
  kernels::EmaSchedule ema_schedule;
  at::Tensor host_grad_norm;

  diffusion::GaussianDiffusion ddpm;
  std::unique_ptr<diffusion::RectifiedFlow> flow;

  at::Tensor loss_sum, mse_sum, vb_sum, aux_sum;  // device accumulators of the window
  int64_t window = 0;

  // Whether the backward runs weight gradients on their own stream: the
  // fused ops only (DiT uses each weight once per step; --recompute's nested
  // backward is left on one stream). The first step's graph is checked for a
  // weight used twice, which turns it off (weight_grad_note says why).
  bool weight_grad_stream = false;
  bool weight_uses_checked = false;
  std::string weight_grad_note;

  // Training health (docs/guide/health.md). The gradient statistics of every
  // health.monitor_every-th step are computed inside that step; with the
  // graph, by a second captured graph of the same step plus the monitor
  // (sharing the first one's memory pool), so the other steps replay
  // exactly what runs without monitoring.
  std::unique_ptr<GradMonitor> monitor;
  bool monitoring = false;  // this body() monitors
  std::unique_ptr<at::cuda::CUDAGraph> monitored_graph;
  std::string monitor_note;  // why monitored steps are not captured
  // The non-finite guard: a step whose loss or gradient norm is inf/NaN
  // skips its update (the device optimizer's skip_nonfinite; the host path
  // checks on the host) and stays out of the window's means. health: float32
  // [3] on the device: steps run, the first non-finite one (-1: none),
  // non-finite steps in the window. nan_policy stop: every step after a
  // non-finite one is skipped too, so the weights stay those it saw.
  bool guard = false, halt_after_bad = false;
  at::Tensor health, last_bad;
  struct Recent {
    int64_t step;
    data::Batch batch;
    at::Tensor gen_state;
  };
  std::deque<Recent> recent;  // the last batches, for the eager re-run
  size_t recent_max = 0;

  // 1, or NaN when the loss is non-finite or (stop) an earlier step was: the
  // loss is multiplied by it, so such a step's gradient norm is NaN.
  at::Tensor nonfinite_gate(const at::Tensor& loss) {
    at::NoGradGuard no_grad;
    at::Tensor ok = at::isfinite(loss.detach());
    if (halt_after_bad) ok = at::logical_and(ok, health.select(0, 1) < 0);
    return at::where(ok, 1.0, std::numeric_limits<double>::quiet_NaN()).to(loss.scalar_type());
  }

  void record_step(const at::Tensor& loss, const at::Tensor& grad_norm) {
    at::NoGradGuard no_grad;
    at::Tensor bad = at::logical_not(at::isfinite(loss.detach()));
    // fp16: an inf/NaN gradient alone is the loss scale's overflow, which the scale handles.
    if (grad_norm.defined() && cfg.optim.precision != "fp16")
      bad = at::logical_or(bad, at::logical_not(at::isfinite(grad_norm.to(device))));
    if (halt_after_bad) bad = at::logical_or(bad, health.select(0, 1) >= 0);
    at::Tensor steps = health.select(0, 0), first = health.select(0, 1), count = health.select(0, 2);
    steps.add_(1);
    first.copy_(at::where(at::logical_and(bad, first < 0), steps, first));
    count.add_(bad.to(at::kFloat));
    last_bad = bad;
  }

  // The whole-step graph and its static inputs. The batch goes pinned host ->
  // staging (side stream, overlapping the previous replay) -> static (a
  // device copy on the main stream right before the replay).
  bool graph_wanted = false;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> copy_stream, capture_stream;
  at::cuda::CUDAEvent staged_ready, staged_consumed;
  at::Tensor x_static, y_static, x_stage, y_stage;
  // Condition features and lengths (a model with cond_dim > 0): the same way.
  at::Tensor cond_static, len_static, cond_stage, len_stage;

  Impl(models::DiffusionModel& m, const TrainConfig& c, const StepOptions& o, at::Device d, at::Generator g)
      : model(m), cfg(c), opts(o), device(d), gen(std::move(g)) {}

  // The step's random draws, in training_loss's order (label dropout, then
  // timesteps, then noise), for every row of the global step: all ranks'
  // rows (data parallel) of all micro-batches (train.accumulate), this
  // rank's rows kept. So one process, N ranks and N micro-batches all train
  // on the draws one big batch of the same rows takes.
  struct Draws {
    at::Tensor drop;  // bool [rows], label dropout (undefined without)
    at::Tensor t, noise;
    Draws rows(int64_t start, int64_t n) const {
      auto part = [&](const at::Tensor& v) { return v.defined() ? v.narrow(0, start, n) : v; };
      return Draws{part(drop), part(t), part(noise)};
    }
  };
  Draws draw(const at::Tensor& x0) {
    PERFTRAIN_SCOPE("loss");
    const int64_t b = x0.size(0), rows = opts.group != nullptr ? b * opts.group->world_size() : b;
    auto mine = [&](const at::Tensor& all) {
      return opts.group != nullptr ? all.narrow(0, b * opts.group->rank(), b) : all;
    };
    Draws d;
    if (cfg.model.class_dropout > 0) {  // label dropout: train the null class for guidance
      const at::Tensor u = at::rand({rows}, gen, at::TensorOptions().device(device).dtype(at::kFloat));
      d.drop = mine(u) < cfg.model.class_dropout;
    }
    std::vector<int64_t> shape = x0.sizes().vec();
    shape[0] = rows;
    d.t = mine(flow ? flow->sample_time(rows, gen, x0.options()) : ddpm.sample_timesteps(rows, gen, x0.device()));
    d.noise = mine(at::randn(shape, gen, x0.options().dtype(at::kFloat)));
    return d;
  }

  // The loss of rows x0 with their draws.
  diffusion::LossTerms loss_at(const Draws& d, const at::Tensor& x0, const at::Tensor& y_in, const at::Tensor& cond,
                               const at::Tensor& cond_len_in) {
    at::Tensor y = y_in, cond_len = cond_len_in;
    // Scopes (base/scope.h) name a step's phases in profiler traces; "loss"
    // holds the label dropout, noise draws and loss terms around the forward.
    PERFTRAIN_SCOPE("loss");
    if (d.drop.defined()) {
      y = at::where(d.drop, cfg.model.num_classes, y);
      // Condition features: the null condition is length 0 (all masked).
      if (cond_len.defined()) cond_len = at::where(d.drop, at::zeros_like(cond_len), cond_len);
    }
    at::Tensor aux;  // the model's auxiliary loss (a looped model's routers'), weighted
    diffusion::ModelFn forward = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& yy) {
      PERFTRAIN_SCOPE("forward");
      compat::AutocastGuard guard(device.type(), autocast.value_or(at::kBFloat16), autocast.has_value());
      models::ForwardOutput o = model.forward_train(x, t, models::Condition{yy, cond, cond_len}, execution);
      aux = o.aux_loss;
      return o.out;
    };
    diffusion::LossTerms terms = flow ? flow->training_loss_at(forward, x0, y, d.t, d.noise)
                                      : ddpm.training_loss_at(forward, x0, y, d.t, d.noise, cfg.model.learn_sigma);
    if (aux.defined()) {
      terms.aux = aux.detach().to(at::kFloat);
      terms.loss = terms.loss + aux.to(terms.loss.scalar_type());
    }
    return terms;
  }

  // The loss of a whole batch, drawn as a step draws it.
  diffusion::LossTerms objective(const at::Tensor& x0, const at::Tensor& y, const at::Tensor& cond,
                                 const at::Tensor& cond_len) {
    return loss_at(draw(x0), x0, y, cond, cond_len);
  }

  // Data parallel: every rank's gradients replaced by their mean, before
  // the gradient norm, clipping and the update see them. The buckets leave
  // during backward as their gradients arrive (distributed/grad_buckets.h); the
  // end of backward sends the rest and joins.
  void begin_averaging() {
    if (buckets) buckets->begin();
  }
  void average_gradients() {
    if (!buckets) return;
    PERFTRAIN_SCOPE("allreduce");
    buckets->finish();
  }

  // One micro-batch's backward: its loss scaled by 1/accumulate (so the
  // summed gradients are the mean over the step's rows) and by the fp16
  // loss scale. Weight gradients go to the second stream in the first
  // micro-batch only: later ones add into existing gradients on the current
  // stream, which must not read a gradient before the streams join. Data
  // parallel: the buckets are armed for the last backward only, so the
  // gradients are averaged once per optimizer step.
  void backward(const at::Tensor& micro_loss, bool first, bool last) {
    at::Tensor loss = micro_loss;
    if (guard) loss = loss * nonfinite_gate(micro_loss);
    if (cfg.optim.accumulate > 1) loss = loss / static_cast<double>(cfg.optim.accumulate);
    const bool fused_step = device_optimizer != nullptr;
    if (fused_step && cfg.optim.precision == "fp16") loss = loss * device_optimizer->loss_scale();
    if (fused_step && weight_grad_stream && !weight_uses_checked) check_weight_uses(loss);
    // Weight gradients on a second stream beside the input gradients,
    // joined before the optimizer reads them (ops/weight_grad_stream.h).
    PERFTRAIN_SCOPE("backward");
    const ops::WeightGradStream overlap(fused_step && weight_grad_stream && first, device);
    if (last) begin_averaging();
    loss.backward();
  }

  // One step: train.accumulate micro-batches (the batch's rows in order),
  // each forward and backward, then the optimizer, EMA and loss
  // accumulation once. The body is the same eager and captured; nothing in
  // it syncs with the host when the device optimizer is used.
  void body(const at::Tensor& x, const at::Tensor& y, const at::Tensor& cond = {},
            const at::Tensor& cond_len = {}) {
    const ops::ComputeWeightsScope weights(&compute_weights);
    const int64_t n = cfg.optim.accumulate, rows = x.size(0) / n;
    const Draws draws = draw(x);
    diffusion::LossTerms step;  // the micro-batches' mean loss terms (detached)
    for (int64_t k = 0; k < n; ++k) {
      auto part = [&](const at::Tensor& t) { return n == 1 || !t.defined() ? t : t.narrow(0, k * rows, rows); };
      const diffusion::LossTerms terms =
          loss_at(n == 1 ? draws : draws.rows(k * rows, rows), part(x), part(y), part(cond), part(cond_len));
      backward(terms.loss, k == 0, k == n - 1);
      add_mean(step, terms, n);
    }
    average_gradients();
    if (fp8) {  // the next step's scales from this step's amax (all ranks'): after backward, before the optimizer
      PERFTRAIN_SCOPE("fp8_scaling");
      if (opts.group != nullptr && opts.group->world_size() > 1) reduce_fp8_amax(*fp8, *opts.group);
      fp8->update();
    }
    update(step.loss);
    at::NoGradGuard no_grad;
    if (guard) {  // a non-finite step stays out of the window's means
      loss_sum.add_(at::where(last_bad, 0.0, step.loss));
      mse_sum.add_(at::where(last_bad, 0.0, step.mse));
      if (step.vb.defined()) vb_sum.add_(at::where(last_bad, 0.0, step.vb));
      if (step.aux.defined()) aux_sum.add_(at::where(last_bad, 0.0, step.aux));
    } else {
      loss_sum.add_(step.loss);
      mse_sum.add_(step.mse);
      if (step.vb.defined()) vb_sum.add_(step.vb);
      if (step.aux.defined()) aux_sum.add_(step.aux);
    }
  }

  // mean += terms / n (detached); with n = 1 the terms themselves.
  static void add_mean(diffusion::LossTerms& mean, const diffusion::LossTerms& terms, int64_t n) {
    at::NoGradGuard no_grad;
    auto add = [&](at::Tensor& sum, const at::Tensor& t) {
      if (!t.defined()) return;
      const at::Tensor part = n == 1 ? t.detach() : t.detach() / static_cast<double>(n);
      sum = sum.defined() ? sum + part : part;
    };
    add(mean.loss, terms.loss);
    add(mean.mse, terms.mse);
    add(mean.vb, terms.vb);
    add(mean.aux, terms.aux);
  }

  // The optimizer step on the summed gradients: clipping, AdamW, the EMA
  // (device: one pass; host: ATen's AdamW with the schedules evaluated here).
  void update(const at::Tensor& loss) {
    if (device_optimizer) {
      if (monitoring)
        monitor->before_update(cfg.optim.precision == "fp16" ? device_optimizer->loss_scale() : at::Tensor());
      {
        PERFTRAIN_SCOPE("optimizer");  // clipping, AdamW and the EMA in one pass
        device_optimizer->step();
      }
      if (shards) {
        PERFTRAIN_SCOPE("weight_broadcast");
        shards->broadcast_weights();
        device_optimizer->follow_others();  // the EMA and bf16 copies of the others' parameters
      }
      if (monitoring) monitor->after_update();
      if (guard) record_step(loss, device_optimizer->grad_norm());
      return;
    }
    if (monitoring) monitor->before_update();
    at::Tensor norm;
    if (cfg.optim.grad_clip > 0) {
      PERFTRAIN_SCOPE("clip");
      norm = host_grad_norm = clip_grad_norm_(params, cfg.optim.grad_clip);
    } else if (guard) norm = host_grad_norm = global_grad_norm(params);  // for the log too
    // The host optimizer's guard reads the norm on the host (a sync per
    // step on this path; the device optimizer's does not).
    const bool skip = guard && !(std::isfinite(loss.item<double>()) && std::isfinite(norm.item<double>()));
    if (guard) record_step(loss, norm);
    ++schedule_step;
    if (skip) {
      for (auto& p : params) p.mutable_grad() = at::Tensor();
    } else {
      ++updates;
      {
        PERFTRAIN_SCOPE("optimizer");
        adamw->step(lr_at(schedule_step, lr_schedule));
      }
      if (shards) {
        PERFTRAIN_SCOPE("weight_broadcast");
        for (auto& p : params) p.mutable_grad() = at::Tensor();  // the others' (AdamW cleared its own)
        shards->broadcast_weights();
      }
      if (!ema_params.empty()) {
        PERFTRAIN_SCOPE("ema");
        ema_update_(ema_params, params, ema_decay_at(updates - 1, ema_schedule));
      }
    }
    if (monitoring) monitor->after_update();
  }

  // The side stream needs each weight used once per step (ops/weight_grad_stream.h);
  // a model that shares weights runs its backward on one stream.
  void check_weight_uses(const at::Tensor& loss) {
    weight_uses_checked = true;
    const auto shared = ops::leaves_used_more_than_once(loss, model.named_parameters());
    if (shared.empty()) return;
    weight_grad_stream = false;
    weight_grad_note = "weight gradients on one stream: " + shared[0] +
                       (shared.size() > 1 ? " and " + std::to_string(shared.size() - 1) + " more" : "") +
                       " used more than once per step";
  }

  bool fits_static(const data::Batch& b) const {
    return x_static.defined() && b.x.sizes() == x_static.sizes() && b.y.sizes() == y_static.sizes() &&
           b.cond.defined() == cond_static.defined() && (!b.cond.defined() || b.cond.sizes() == cond_static.sizes());
  }

  // Puts the batch into the static buffers, ordered on the current stream.
  void stage(const data::Batch& b) {
    PERFTRAIN_SCOPE("h2d");
    if (!x_static.defined()) {
      x_static = at::empty(b.x.sizes(), b.x.options().device(device).pinned_memory(false));
      y_static = at::empty(b.y.sizes(), b.y.options().device(device).pinned_memory(false));
      x_stage = at::empty_like(x_static);
      y_stage = at::empty_like(y_static);
      if (b.cond.defined()) {
        cond_static = at::empty(b.cond.sizes(), b.cond.options().device(device).pinned_memory(false));
        len_static = at::empty(b.cond_len.sizes(), b.cond_len.options().device(device).pinned_memory(false));
        cond_stage = at::empty_like(cond_static);
        len_stage = at::empty_like(len_static);
      }
    }
    const bool has_cond = b.cond.defined();
    auto main = at::cuda::getCurrentCUDAStream();
    if (b.x.is_cuda()) {
      x_static.copy_(b.x, /*non_blocking=*/true);
      y_static.copy_(b.y, /*non_blocking=*/true);
      if (has_cond) cond_static.copy_(b.cond, true), len_static.copy_(b.cond_len, true);
      return;
    }
    {
      c10::cuda::CUDAStreamGuard on_copy(*copy_stream);
      staged_consumed.block(*copy_stream);  // the previous batch has left the staging buffers
      x_stage.copy_(b.x, /*non_blocking=*/true);
      y_stage.copy_(b.y, /*non_blocking=*/true);
      if (has_cond) cond_stage.copy_(b.cond, true), len_stage.copy_(b.cond_len, true);
      staged_ready.record(*copy_stream);
    }
    staged_ready.block(main);
    x_static.copy_(x_stage, /*non_blocking=*/true);
    y_static.copy_(y_stage, /*non_blocking=*/true);
    if (has_cond) cond_static.copy_(cond_stage, true), len_static.copy_(len_stage, true);
    staged_consumed.record(main);
  }

  // Runs f on the capture stream, ordered after and before the main stream's
  // work (the warm-up steps run there too, as CUDA graphs want).
  template <typename F>
  void on_capture_stream(F&& f) {
    auto main = at::cuda::getCurrentCUDAStream();
    at::cuda::CUDAEvent main_done, side_done;
    main_done.record(main);
    main_done.block(*capture_stream);
    {
      c10::cuda::CUDAStreamGuard guard(*capture_stream);
      f();
    }
    side_done.record(*capture_stream);
    side_done.block(main);
  }

  // Captures body() on the static buffers. Returns "" or why it failed; a
  // failed capture leaves the model as it was (a capture runs nothing).
  std::string capture(bool monitored = false) {
    std::string error;
    const bool was_monitoring = monitoring;
    monitoring = monitored;
    // The warm-up's cached blocks would otherwise sit beside the graph's own
    // pool: hand them back so that a large model's capture fits (DiT-XL/2
    // b256 ran out of memory capturing with 83 GiB cached but unused).
    compat::synchronize(device);
    compat::empty_cuda_cache();
    on_capture_stream([&] {
      compat::set_autocast_cache_enabled(false);
      auto g = std::make_unique<at::cuda::CUDAGraph>();
      try {
        g->register_generator_state(gen);
        if (monitored) g->capture_begin(graph->pool());  // the two graphs never run at once
        else g->capture_begin();
        try {
          body(x_static, y_static, cond_static, len_static);
        } catch (...) {
          try {
            g->capture_end();
          } catch (...) {
          }
          throw;
        }
        g->capture_end();
        (monitored ? monitored_graph : graph) = std::move(g);
      } catch (const std::exception& e) {
        error = compat::error_message(e);
      }
      compat::set_autocast_cache_enabled(true);
    });
    monitoring = was_monitoring;
    if (!error.empty()) {
      for (auto& p : params) p.mutable_grad() = at::Tensor();
      // The failed capture left the generators registered with it marked as
      // capturing: ours, and the device's default one (every capture registers it).
      compat::renew_generator_state(gen);
      at::Generator device_default = at::globalContext().defaultGenerator(device);
      compat::renew_generator_state(device_default);
    }
    return error;
  }

  // Replays the step's graph: the monitored one on a monitored step
  // (captured on first use; when that capture fails, the plain one, and
  // monitor_note says so).
  void replay() {
    PERFTRAIN_SCOPE("graph_replay");
    if (monitoring && !monitored_graph && monitor_note.empty()) {
      const std::string error = capture(true);
      if (!error.empty()) {
        monitor_note = "gradient monitoring off: its graph failed to capture: " + error;
        // The plain graph holds the generator state the failed capture spoilt
        // (and gradients it no longer sees): capture it again.
        graph.reset();
        const std::string again = capture(false);
        if (!again.empty())
          throw RuntimeError("the step's CUDA graph could not be captured again after " + monitor_note + ": " + again +
                             "; set health.monitor_every = 0 or speed.graph = false");
      }
    }
    if (monitoring && monitored_graph) monitored_graph->replay();
    else graph->replay();
  }
};

StepRunner::StepRunner(models::DiffusionModel& model, models::DiffusionModel* ema, const TrainConfig& cfg,
                       const StepOptions& opts, at::Device device, at::Generator gen)
    : impl_(std::make_unique<Impl>(model, cfg, opts, device, std::move(gen))) {
  Impl& s = *impl_;
  const bool cuda = device.is_cuda();
  if (!cuda && (opts.precision == "bf16" || opts.precision == "fp16"))
    throw UsageError("precision " + opts.precision + " needs a CUDA device; use fp32 on the CPU");
  const SpeedConfig& speed = cfg.speed;
  if (opts.precision == "fp16" && !speed.fused_optimizer)
    throw UsageError("precision fp16 keeps its loss scale in the device optimizer: leave speed.fused_optimizer on");
  s.cfg.optim.precision = opts.precision;
  const bool fp8 = opts.precision == "fp8";
  if (opts.precision == "bf16" || (fp8 && cuda)) s.autocast = at::kBFloat16;
  if (opts.precision == "fp16") s.autocast = at::kHalf;
  if (cuda) {
    at::globalContext().setAllowTF32CuBLAS(true);  // fp32 matrix products on TF32 Tensor Cores
    at::globalContext().setBenchmarkCuDNN(true);
  }
  s.execution = dit_execution(speed, cuda);
  if (!model.has_fused_path()) s.execution.fused_kernels = s.execution.gelu_recompute = false;
  if (fp8) s.fp8 = fp8_states_for(model, cfg, s.execution);
  // The products' rows: every token of this process's samples (a
  // single-stream model's condition tokens too; batch_size is the global
  // batch, of which each data-parallel rank holds 1/N).
  const int64_t rows_per_rank = cfg.optim.batch_size / (opts.group != nullptr ? opts.group->world_size() : 1);
  s.weight_grad_stream = s.execution.fused_kernels && !speed.recompute &&
                         ops::weight_grad_stream_for(rows_per_rank * cfg.model.sequence_tokens(), cfg.model.hidden);

  s.params = model.parameters();
  if (ema != nullptr) s.ema_params = ema->parameters();
  if (cfg.distributed.shard_optimizer && opts.group != nullptr)
    s.shards = std::make_unique<OptimizerShards>(*opts.group, model.named_parameters(), cfg.distributed.bucket_mb);
  if (opts.group != nullptr) {
    distributed::GradBucketOptions bo;
    bo.bucket_mb = cfg.distributed.bucket_mb;
    // A bucket's weight gradients may still be written on their own stream.
    bo.before_send = [] { ops::current_stream_waits_for_weight_grads(); };
    s.buckets = std::make_unique<distributed::GradBuckets>(*opts.group, s.params, bo);
  }
  s.lr_schedule = lr_schedule(cfg.optim);
  s.ema_schedule = ema_schedule(cfg.optim);
  if (cuda && speed.fused_optimizer) {
    DeviceOptimizerOptions o;
    ops::set_schedules(o, s.lr_schedule, s.ema_schedule);
    o.beta1 = cfg.optim.beta1, o.beta2 = cfg.optim.beta2, o.eps = cfg.optim.eps;
    o.weight_decay = cfg.optim.weight_decay, o.decay_all = cfg.optim.decay_all;
    o.grad_clip = cfg.optim.grad_clip;
    o.dynamic_loss_scale = opts.precision == "fp16";
    o.grad_norm = opts.grad_norm || o.grad_clip > 0 || o.dynamic_loss_scale;
    o.skip_nonfinite = opts.grad_norm && !o.dynamic_loss_scale;  // the non-finite guard
    // bf16 copies of the weights, rewritten by each update, for the fused ops
    // to multiply with (instead of a cast per product).
    o.bf16_shadows = (opts.precision == "bf16" || fp8) && s.execution.fused_kernels;
    s.device_optimizer = std::make_unique<DeviceOptimizer>(model.named_parameters(), s.ema_params, o,
                                                           s.shards ? s.shards->owned() : std::vector<bool>{});
    s.compute_weights = s.device_optimizer->compute_weights();
  } else {
    s.adamw = std::make_unique<AdamW>(s.shards ? s.shards->owned_params() : model.named_parameters(),
                                      AdamWOptions{cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps,
                                                   cfg.optim.weight_decay, cfg.optim.decay_all});
  }

  s.ddpm.to(device);
  if (cfg.diffusion.objective == "flow") {
    diffusion::FlowOptions fo;
    fo.time_sampling = diffusion::parse_time_sampling(cfg.diffusion.time_sampling);
    s.flow = std::make_unique<diffusion::RectifiedFlow>(fo);
  }
  const auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
  s.loss_sum = at::zeros({}, f32), s.mse_sum = at::zeros({}, f32), s.vb_sum = at::zeros({}, f32);
  s.aux_sum = at::zeros({}, f32);
  s.guard = opts.grad_norm;
  s.halt_after_bad = cfg.health.nan_policy == "stop";
  s.health = at::zeros({3}, f32);
  s.health.select(0, 1).fill_(-1);
  s.recent_max = s.guard ? static_cast<size_t>(std::max<int64_t>(cfg.log.every, 1)) + 1 : 0;
  if (cfg.health.monitor_every > 0)
    s.monitor = std::make_unique<GradMonitor>(model.named_parameters(), cfg.health.grad_histograms);

  if (!cuda) graph_status_ = "eager: CPU device";
  else if (!speed.graph) graph_status_ = "eager: graph off (speed.graph / --graph off)";
  else if (!speed.fused_optimizer) graph_status_ = "eager: the graph needs the device optimizer (speed.fused_optimizer)";
  else {
    s.graph_wanted = true;
    graph_status_ = "eager: warming up";
  }
  if (cuda) {
    s.copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    s.capture_stream = c10::cuda::getStreamFromPool(false, device.index());
  }
}

StepRunner::~StepRunner() = default;

bool StepRunner::graph_active() const { return impl_->graph != nullptr; }

bool StepRunner::weight_grad_stream() const { return impl_->weight_grad_stream; }
const std::string& StepRunner::weight_grad_note() const { return impl_->weight_grad_note; }
std::string StepRunner::data_parallel_note() const {
  return impl_->buckets ? impl_->buckets->describe() : std::string();
}

void StepRunner::step(const data::Batch& batch) {
  PERFTRAIN_SCOPE("step");
  Impl& s = *impl_;
  const int64_t n = s.cfg.optim.accumulate;
  if (batch.x.dim() == 0 || batch.x.size(0) % n != 0)
    throw UsageError("a step's batch of " + std::to_string(batch.x.dim() ? batch.x.size(0) : 0) +
                     " rows does not split into train.accumulate = " + std::to_string(n) + " micro-batches");
  // The first step runs the products on cuBLASLt's first picks; the eager
  // warm-up steps after it tune them (before the capture).
  const ops::GemmTuningDeferred first_step_untuned(steps_done_ == 0);
  // The parameters may have been loaded since the copies were made (resume);
  // from here on every update rewrites them.
  if (steps_done_ == 0 && s.device_optimizer) s.device_optimizer->refresh_shadows();
  const int64_t this_step = steps_done_ + 1;
  s.monitoring = s.monitor && this_step % s.cfg.health.monitor_every == 0;
  if (s.recent_max > 0) {  // the batch and where the generator stood, for an eager re-run
    s.recent.push_back({this_step, batch, s.gen.get_state()});
    if (s.recent.size() > s.recent_max) s.recent.pop_front();
  }
  auto on_device = [&](const at::Tensor& t) { return t.defined() ? t.to(s.device, true) : t; };
  if (!s.device.is_cuda()) {
    s.body(batch.x.to(s.device), batch.y.to(s.device), on_device(batch.cond), on_device(batch.cond_len));
  } else if (!s.graph_wanted) {
    s.stage(batch);
    s.body(s.x_static, s.y_static, s.cond_static, s.len_static);
  } else if (s.graph && s.fits_static(batch)) {
    s.stage(batch);
    s.replay();
  } else if (s.graph) {  // a batch of another shape: the graph cannot take it
    s.body(on_device(batch.x), on_device(batch.y), on_device(batch.cond), on_device(batch.cond_len));
  } else {
    s.stage(batch);
    if (steps_done_ < opts_warmup()) {
      s.on_capture_stream([&] { s.body(s.x_static, s.y_static, s.cond_static, s.len_static); });
    } else {
      const std::string error = s.capture();
      if (error.empty()) {
        graph_status_ = "captured at step " + std::to_string(steps_done_ + 1);
        s.replay();
      } else {
        graph_status_ = "eager: capture failed: " + error;
        s.graph_wanted = false;
        s.body(s.x_static, s.y_static, s.cond_static, s.len_static);
      }
    }
  }
  if (steps_done_ == 0 && s.fp8) fp8_states_made(*s.fp8);
  if (s.monitoring && (s.monitored_graph || !s.graph)) s.monitor->queue_readback(this_step);
  s.monitoring = false;
  ++s.window;
  ++steps_done_;
}

int StepRunner::opts_warmup() const { return std::max(1, impl_->opts.warmup_steps); }

WindowStats StepRunner::take_window() {
  Impl& s = *impl_;
  WindowStats w;
  w.steps = s.window;
  int64_t finite_steps = s.window;
  if (s.guard) {
    const at::Tensor h = s.health.to(at::kCPU);  // the one host sync
    w.first_nonfinite_step = static_cast<int64_t>(h[1].item<float>());
    w.nonfinite_steps = static_cast<int64_t>(h[2].item<float>());
    finite_steps -= w.nonfinite_steps;
    s.health.select(0, 2).zero_();
    if (s.cfg.health.nan_policy == "skip") s.health.select(0, 1).fill_(-1);
  }
  if (finite_steps > 0) {
    w.loss = s.loss_sum.item<double>() / finite_steps;  // the one host sync without the guard
    w.mse = s.mse_sum.item<double>() / finite_steps;
    w.vb = s.vb_sum.item<double>() / finite_steps;
    w.aux = s.aux_sum.item<double>() / finite_steps;
  } else if (s.window > 0) {
    w.loss = w.mse = w.vb = w.aux = std::numeric_limits<double>::quiet_NaN();
  }
  if (s.device_optimizer) {
    if (s.device_optimizer->options().grad_norm) w.grad_norm = s.device_optimizer->grad_norm().item<double>();
    w.lr = s.device_optimizer->lr().item<double>();
    w.loss_scale = s.device_optimizer->loss_scale().item<double>();
    w.skipped_steps = static_cast<int64_t>(s.device_optimizer->skipped().item<double>());
  } else {
    if (s.host_grad_norm.defined()) w.grad_norm = s.host_grad_norm.item<double>();
    w.lr = lr_at(s.schedule_step, s.lr_schedule);
  }
  s.loss_sum.zero_(), s.mse_sum.zero_(), s.vb_sum.zero_(), s.aux_sum.zero_();
  s.window = 0;
  return w;
}

std::vector<std::pair<std::string, at::Tensor>> StepRunner::optimizer_state() const {
  auto local = impl_->device_optimizer ? impl_->device_optimizer->state() : impl_->adamw->state();
  auto out = impl_->shards ? impl_->shards->full_state(local) : local;
  if (impl_->fp8)
    for (const auto& [name, t] : impl_->fp8->named_tensors()) out.emplace_back(kFp8Prefix + name, t);
  return out;
}

const models::Fp8States* StepRunner::fp8_states() const { return impl_->fp8.get(); }
models::Fp8States* StepRunner::fp8_states() { return impl_->fp8.get(); }

std::string StepRunner::fp8_note() const {
  if (!impl_->fp8) return "";
  return describe_fp8(*impl_->fp8);
}

std::string StepRunner::optimizer_sharding() const {
  if (!impl_->shards) return "";
  return impl_->shards->describe(
      state_bytes(impl_->device_optimizer ? impl_->device_optimizer->state() : impl_->adamw->state()));
}

void StepRunner::load_optimizer_state(const std::vector<std::pair<std::string, at::Tensor>>& all) {
  const Fp8Split split = split_fp8_state(all, impl_->fp8 != nullptr);
  if (impl_->fp8) impl_->fp8->load(split.fp8);
  if (impl_->device_optimizer) impl_->device_optimizer->load_state(split.rest);
  else impl_->adamw->load_state(split.rest);
}

void StepRunner::set_global_step(int64_t step) {
  impl_->updates = impl_->schedule_step = step;
  if (impl_->device_optimizer) impl_->device_optimizer->set_schedule_step(step);
}

std::vector<observe::GradHealthSample> StepRunner::take_grad_health(bool wait) {
  if (!impl_->monitor) return {};
  std::vector<observe::GradHealthSample> samples = impl_->monitor->take_ready(wait);
  if (impl_->fp8 && !samples.empty()) {
    const std::vector<observe::Fp8LayerHealth> now = fp8_health(*impl_->fp8);
    for (auto& s : samples) s.fp8 = now;
  }
  return samples;
}

const std::string& StepRunner::monitor_note() const { return impl_->monitor_note; }

NonFiniteSite StepRunner::locate_nonfinite(int64_t step) {
  Impl& s = *impl_;
  NonFiniteSite none;
  const Impl::Recent* r = nullptr;
  for (const auto& e : s.recent)
    if (e.step == step) r = &e;
  if (r == nullptr) {
    none.detail = "the batch of step " + std::to_string(step) + " is no longer kept";
    return none;
  }
  compat::synchronize(s.device);
  // The same objective on the same batch and random draws, eagerly through
  // the plain modules (whose forwards fire the hooks), no optimizer step;
  // the training generator and execution plan are put back afterwards.
  struct Restore {
    Impl& s;
    at::Generator gen;
    models::DiTExecution execution;
    ~Restore() { s.gen = gen, s.execution = execution; }
  } restore{s, s.gen, s.execution};
  at::Generator replay_gen = s.gen.clone();
  replay_gen.set_state(r->gen_state);
  s.gen = replay_gen;
  s.execution = models::DiTExecution{};
  auto on_device = [&](const at::Tensor& t) { return t.defined() ? t.to(s.device) : t; };
  const data::Batch& b = r->batch;
  NonFiniteSite site = train::locate_nonfinite(
      s.model,
      [&] { return s.objective(on_device(b.x), on_device(b.y), on_device(b.cond), on_device(b.cond_len)).loss; },
      s.cfg.health.anomaly_mode);
  return site;
}

}  // namespace perftrain::train
