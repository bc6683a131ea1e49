#include "train/trainer.h"

#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <ctime>
#include <memory>
#include <optional>

#include "base/error.h"
#include "base/fs.h"
#include "data/batch_loader.h"
#include "dist/group.h"
#include "dist/launch_env.h"
#include "io/atomic_file.h"
#include "models/diffusion_model.h"
#include "compat/compat.h"
#include "observe/plot/svg_plot.h"
#include "observe/tensorboard/event_writer.h"
#include "observe/tensorboard/health_events.h"
#include "ops/cublaslt_workspace.h"
#include "train/checkpoint.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/run_directory.h"
#include "train/memory_estimate.h"
#include "train/sampling.h"
#include "train/signals.h"
#include "train/speed.h"
#include "train/step_runner.h"
#include "base/scope.h"
#include "train/run_profiler.h"
#include "observe/grad_health.h"
#include "train/nan_locator.h"

namespace perftrain::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

at::Device resolve_device(const std::string& want) {
  const bool have = compat::cuda_available();
  if (want == "cuda" && !have) throw UsageError("train.device = cuda but no CUDA GPU is visible");
  return (want == "cuda" || (want == "auto" && have)) ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

std::unique_ptr<data::Dataset> open_dataset(const TrainConfig& cfg) {
  const auto& d = cfg.data;
  if (d.source == "fashion-mnist") return data::open_fashion_mnist(d.path, /*train=*/true);
  if (d.source == "latents") return data::open_latent_shards(d.path);
  if (cfg.model.single_stream() && cfg.model.cond_dim > 0)  // synthetic features for the synthetic latents
    return data::with_synthetic_cond(
        data::make_synthetic(d.synthetic_size, {cfg.model.in_channels, cfg.model.image_size, cfg.model.image_size},
                             cfg.model.num_classes, cfg.optim.seed + 12345),
        cfg.model.cond_tokens, cfg.model.cond_dim, cfg.optim.seed + 54321);
  return data::make_synthetic(d.synthetic_size,
                              {cfg.model.in_channels, cfg.model.image_size, cfg.model.image_size},
                              cfg.model.num_classes, cfg.optim.seed + 12345);
}

void check_dataset_fits(const data::Dataset& ds, const TrainConfig& cfg) {
  const auto s = ds.sample_shape();
  const auto& m = cfg.model;
  if (s[0] != m.in_channels || s[1] != m.image_size || s[2] != m.image_size)
    throw UsageError("dataset " + ds.describe() + " has samples of " + std::to_string(s[0]) + "x" +
                     std::to_string(s[1]) + "x" + std::to_string(s[2]) + " but the model expects " +
                     std::to_string(m.in_channels) + "x" + std::to_string(m.image_size) + "x" +
                     std::to_string(m.image_size) + "; set model.in_channels and model.image_size");
  if (ds.num_classes() > m.num_classes)
    throw UsageError("dataset has labels up to " + std::to_string(ds.num_classes() - 1) +
                     " but model.num_classes = " + std::to_string(m.num_classes));
  const auto c = ds.cond_shape();
  const bool wants = m.single_stream() && m.cond_dim > 0;
  if (wants && (c[0] != m.cond_tokens || c[1] != m.cond_dim))
    throw UsageError("model " + m.name + " takes condition features " + std::to_string(m.cond_tokens) + "x" +
                     std::to_string(m.cond_dim) + " (model.cond_tokens x model.cond_dim) but dataset " +
                     ds.describe() + (c[0] == 0 ? " has none" : " has " + std::to_string(c[0]) + "x" + std::to_string(c[1])));
}

std::string default_run_name(const TrainConfig& cfg) {
  std::string model = cfg.model.name;
  for (char& c : model)
    if (c == '/') c = '-';
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return model + "-" + cfg.data.source + "-" + stamp;
}

// One line on how the matrix products' algorithms were chosen in the
// warm-up steps (nothing on the CPU, where none are tuned).
void log_gemm_tuning(std::ostream& log) {
  const auto records = ops::gemm_tune_records();
  if (records.empty()) return;
  size_t changed = 0;
  for (const auto& r : records) changed += r.chosen != 0;
  log << "matrix products: " << records.size() << " shapes tuned on first use, " << changed
      << " on a faster algorithm than cuBLASLt's first pick (speed.gemm_tune = 0: no tuning)\n";
}

}  // namespace

TrainSummary run_training(const TrainConfig& cfg_in, const TrainOptions& opts, std::ostream& log) {
  TrainConfig cfg = cfg_in;
  cfg.validate();
  apply_speed_settings(cfg.speed);
  // Data parallel (docs/guide/multi-gpu.md): torchrun's variables say which
  // rank this is; train.batch_size is the global batch.
  const dist::LaunchEnv launch = dist::launch_env();
  if (launch.distributed() && cfg.optim.batch_size % launch.world_size != 0)
    throw UsageError("train.batch_size = " + std::to_string(cfg.optim.batch_size) +
                     " is the global batch and must divide by WORLD_SIZE = " + std::to_string(launch.world_size));
  const bool writer = launch.rank == 0;  // rank 0 alone writes the run directory
  const at::Device device = [&] {
    const at::Device d = resolve_device(cfg.optim.device);
    return d.is_cuda() && launch.distributed() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank))
                                               : d;
  }();
  if ((cfg.optim.precision == "bf16" || cfg.optim.precision == "fp16") && !device.is_cuda())
    throw UsageError("train.precision = " + cfg.optim.precision + " needs a CUDA device; use fp32 (or auto) on the CPU");
  const std::string precision =
      cfg.optim.precision == "auto" ? (device.is_cuda() ? "bf16" : "fp32") : cfg.optim.precision;
  // Before anything is allocated or created: a batch that cannot fit is a
  // usage error that says what would fit.
  {
    TrainConfig per_rank = cfg;  // what one process holds
    per_rank.optim.batch_size /= launch.world_size;
    check_memory_fits(per_rank, device.is_cuda(), precision, memory_available_for_training(device.is_cuda()),
                      cfg.dist.shard_optimizer ? launch.world_size : 1);
  }
  // From here a first SIGINT/SIGTERM stops the run after its current step.
  std::optional<StopSignals> stop_signals;
  if (opts.save_on_signal) stop_signals.emplace();

  std::unique_ptr<dist::Group> group;
  if (launch.distributed())
    group = std::make_unique<dist::Group>(launch, device, dist::GroupOptions{cfg.dist.timeout_s, cfg.dist.bucket_mb});

  auto dataset = open_dataset(cfg);
  check_dataset_fits(*dataset, cfg);

  // The run directory: a resumed run continues in the directory it came from.
  std::string run_path;
  std::string resume_dir;
  if (!opts.resume.empty()) {
    resume_dir = resolve_checkpoint_dir(opts.resume);
    run_path = fs::parent_path(fs::parent_path(resume_dir));
  } else {
    if (cfg.run.name.empty()) cfg.run.name = default_run_name(cfg);
    run_path = cfg.run.dir + "/" + cfg.run.name;
  }
  // Under the run's lock from here on; config.toml and metrics.jsonl are only
  // written once the checkpoint has loaded (run.start), so that a failed
  // resume leaves the run as it was.
  // Data parallel: rank 0 alone holds it; the others read the checkpoint
  // once rank 0 has taken the lock and cleared interrupted saves.
  std::optional<RunDirectory> run;
  if (writer) run.emplace(run_path, !resume_dir.empty(), log);
  if (group) group->barrier();
  if (!resume_dir.empty()) resume_dir = resolve_checkpoint_dir(opts.resume);  // latest, read under the lock
  if (run) run_path = run->path();

  auto built = models::build_diffusion_model_and_ema(cfg.model, cfg.optim.seed, device);
  models::DiffusionModel& model = *built.model;
  models::DiffusionModel& ema = *built.ema;

  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);
  StepOptions step_opts;
  step_opts.precision = precision;
  step_opts.group = group.get();
  StepRunner runner(model, &ema, cfg, step_opts, device, gen);

  TrainerState state;
  if (!resume_dir.empty()) {
    state = load_checkpoint(
        resume_dir, model, ema, [&](const io::NamedTensors& t) { runner.load_optimizer_state(t); }, gen);
    runner.set_updates_taken(state.step);
    log << "resumed from " << resume_dir << " at step " << state.step << "\n";
  }
  if (state.step >= cfg.optim.steps)
    throw UsageError("the run is already at step " + std::to_string(state.step) +
                     "; raise train.steps to continue it");
  if (group) {
    // Every rank from the same checkpoint, and rank 0's weights everywhere.
    if (group->allreduce_max(static_cast<double>(state.step)) != -group->allreduce_max(-static_cast<double>(state.step)))
      throw RuntimeError(launch.describe() + ": the ranks resumed from different checkpoints (this one at step " +
                         std::to_string(state.step) + ")");
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> weights = model.parameters();
    for (const auto& p : ema.parameters()) weights.push_back(p);
    group->broadcast(weights, 0);
  }
  if (run) run->start(cfg.to_toml(), resume_dir.empty() ? -1 : state.step);
  // TensorBoard: the values each log window already read back, weight
  // histograms every log.histogram_every steps, the sample grids.
  std::unique_ptr<observe::tensorboard::EventWriter> events;
  if (cfg.log.tensorboard && run) events = std::make_unique<observe::tensorboard::EventWriter>(run->file("tb"));
  std::optional<observe::GradHealthSample> flow_sample;  // the latest monitored step, for gradient_flow.svg

  log << "perftrain: " << cfg.model.name << " (" << model.parameter_count(true) << " trainable parameters) on "
      << compat::device_description(device) << ", " << precision
      << (device.is_cuda() ? std::string(cfg.speed.fused_kernels && model.has_fused_path() ? ", fused kernels" : ", unfused") +
                                 (cfg.speed.recompute ? ", recompute" : "") +
                                 (cfg.speed.gelu_recompute ? ", GELU recomputed in backward" : "") +
                                 (cfg.speed.attention == "cudnn" ? ", cuDNN attention" : "") +
                                 (runner.weight_grad_stream() ? ", weight gradients on a second stream" : "")
                           : std::string())
      << "\n"
      << "data: " << dataset->describe() << "\n"
      << "run: " << run_path << "\n";
  if (group)
    log << "data parallel: " << launch.world_size << " processes (master " << launch.master_addr << ":"
        << launch.master_port << "), global batch " << cfg.optim.batch_size << " = " << launch.world_size << " x "
        << cfg.optim.batch_size / launch.world_size << "; rank 0 writes the run directory\n";
  if (!runner.optimizer_sharding().empty()) log << runner.optimizer_sharding() << "\n";

  data::BatchLoader loader(*dataset, cfg.optim.batch_size, cfg.optim.seed, state.position,
                           device.is_cuda(), static_cast<int>(cfg.data.prefetch),
                           data::LoaderShard{launch.rank, launch.world_size});
  Progress progress(log, cfg.optim.steps, opts.interactive);
  SampleOptions sample_opts{cfg.log.sample_classes, cfg.log.sample_per_class, cfg.diffusion.sample_steps,
                            cfg.diffusion.cfg_scale, cfg.optim.seed, precision != "fp32"};

  TrainSummary summary;
  summary.run_dir = run_path;
  summary.first_step = state.step + 1;
  Clock::time_point window_start = Clock::now(), loop_start = Clock::now();
  double wait_at_window_start = 0;
  compat::reset_peak_memory(device);

  auto plots = [&]() {  // loss.svg, gradient_flow.svg (and .png with a converter) in the run directory
    try {
      observe::plot::write_loss_curve(run->file("metrics.jsonl"), run->file("loss.svg"));
      if (flow_sample) observe::plot::write_gradient_flow(*flow_sample, run->file("gradient_flow.svg"));
    } catch (const std::exception& e) {
      log << "warning: no plot: " << e.what() << "\n";
    }
  };
  auto save = [&]() {
    // dist.shard_optimizer: gathering the state is a collective (the whole state on rank 0).
    const io::NamedTensors optimizer_state = runner.optimizer_state();
    if (!run) return;  // data parallel: rank 0 saves
    PERFTRAIN_SCOPE("checkpoint");
    // Never a checkpoint from non-finite weights (the guard keeps them
    // finite; this is the last line of defence).
    for (const nn::Module* m : {static_cast<const nn::Module*>(&model), static_cast<const nn::Module*>(&ema)}) {
      const std::string bad = first_nonfinite_tensor(*m);
      if (bad.empty()) continue;
      const std::string msg = "no checkpoint at step " + std::to_string(state.step) + ": " +
                              (m == &model ? "" : "EMA ") + bad + " holds NaN/Inf";
      log << "warning: " << msg << "\n";
      summary.health_warnings.push_back(msg);
      return;
    }
    summary.last_checkpoint = save_checkpoint(run->ckpt_dir(), cfg, state, model, ema, optimizer_state, gen,
                                              cfg.log.keep_checkpoints);
    run->keep();
    plots();
  };
  auto samples = [&]() {
    if (!run) return;  // data parallel: rank 0 samples
    PERFTRAIN_SCOPE("sampling");
    char name[64];
    std::snprintf(name, sizeof name, "/step_%08lld.png", static_cast<long long>(state.step));
    summary.last_samples = run->samples_dir() + name;
    write_sample_grid(summary.last_samples, ema, cfg, sample_opts, device);
    if (events) events->add_png_file("samples", state.step, summary.last_samples);
  };

  // --profile: windows of this run under the profiler (train/run_profiler.h).
  std::unique_ptr<RunProfiler> profiler;
  if (!opts.profile.empty() && run)  // data parallel: rank 0's steps
    profiler = std::make_unique<RunProfiler>(opts.profile, cfg, precision, device, run->path(), runner, log,
                                             opts.profile_scopes_only);
  std::string graph_status;
  bool tuning_logged = false;
  // Training health (docs/guide/health.md): the detectors over the monitored
  // steps' gradient statistics; the eager re-run that names where a
  // non-finite value came from (every time with nan_policy stop, which then
  // ends the run; the first few times with skip).
  observe::HealthThresholds thresholds;
  thresholds.vanish_norm = cfg.health.vanish_norm;
  thresholds.patience = cfg.health.patience;
  thresholds.explode_factor = cfg.health.explode_factor;
  thresholds.median_window = cfg.health.median_window;
  thresholds.median_min = std::min<int64_t>(5, cfg.health.median_window);
  observe::HealthDetectors detectors(thresholds);
  summary.health_monitor = cfg.health.monitor_every > 0
                               ? "gradient statistics every " + std::to_string(cfg.health.monitor_every) + " steps"
                               : "off (health.monitor_every = 0)";
  bool monitor_noted = false;
  int64_t grad_histograms_at = 0;  // the multiple of log.histogram_every whose gradient histograms were written
  int64_t locates = 0;
  while (state.step < cfg.optim.steps) {
    const int64_t step = state.step + 1;
    if (profiler) profiler->begin_step(step - summary.first_step);
    data::Batch batch;
    {
      PERFTRAIN_SCOPE("data_wait");
      batch = loader.next();
    }
    runner.step(batch);
    state.step = step;
    state.position = loader.position();
    int stop = stop_signals ? stop_signals->received() : 0;  // then this step is the last
    // Data parallel: a signal on any rank stops every rank after this step.
    if (group) stop = static_cast<int>(group->allreduce_max(stop));
    if (runner.graph_status() != graph_status) {  // say once how the step runs, and when that changes
      graph_status = runner.graph_status();
      if (graph_status != "eager: warming up") log << "step: " << graph_status << "\n";
    }
    if (!monitor_noted && !runner.monitor_note().empty()) {
      monitor_noted = true;
      log << runner.monitor_note() << "\n";
      summary.health_monitor += "; " + runner.monitor_note();
    }

    if (step == summary.first_step) {
      runner.take_window();  // the first step is timed apart (one sync)
      summary.first_step_s = std::chrono::duration<double>(Clock::now() - opts.process_start).count();
      loop_start = window_start = Clock::now();
      wait_at_window_start = loader.wait_seconds();
      log << "first step done " << summary.first_step_s << " s after start\n";
      if (!runner.weight_grad_note().empty()) log << runner.weight_grad_note() << "\n";
    }
    if (group && step == summary.first_step + 1) log << runner.data_parallel_note() << "\n";  // after the observing step
    if (step > summary.first_step && (step % cfg.log.every == 0 || step == cfg.optim.steps || stop)) {
      PERFTRAIN_SCOPE("log_window");
      WindowStats w = runner.take_window();  // the one host sync per window
      if (group) {  // the ranks' means (each rank's loss is over its slice)
        const auto sums = group->allreduce_sum({w.loss, w.mse, w.vb});
        w.loss = sums[0] / launch.world_size, w.mse = sums[1] / launch.world_size, w.vb = sums[2] / launch.world_size;
      }
      const int64_t runner_offset = step - runner.steps_done();  // runner step + this = run step (resumed runs)
      std::vector<std::string> warnings_now;
      if (w.nonfinite_steps > 0) {
        const int64_t first_bad = w.first_nonfinite_step + runner_offset;
        std::string msg = "step " + std::to_string(first_bad) + ": non-finite loss or gradients; " +
                          std::to_string(w.nonfinite_steps) + " step(s) up to step " + std::to_string(step) +
                          " skipped their update";
        if (w.first_nonfinite_step > 0 && (cfg.health.nan_policy == "stop" || locates < 3)) {
          ++locates;
          const NonFiniteSite site = runner.locate_nonfinite(w.first_nonfinite_step);
          summary.nonfinite_site = "step " + std::to_string(first_bad) + ": " + site.message();
          msg += "\n" + site.message();
        }
        summary.nonfinite_steps += w.nonfinite_steps;
        log << "warning: " << msg << "\n";
        warnings_now.push_back(msg);
        summary.health_warnings.push_back(msg);
        if (cfg.health.nan_policy == "stop") {
          if (run) run->log_metrics({{"step", step},
                           {"nonfinite_steps", w.nonfinite_steps},
                           {"first_nonfinite_step", first_bad},
                           {"health_warnings", warnings_now}});
          progress.finish();
          summary.last_step = step;
          summary.step_mode = runner.graph_status();
          if (run)
            write_report(run->file("report.md"), cfg, summary, compat::device_description(device), precision,
                         model.parameter_count(true), dataset->describe());
          throw RuntimeError(msg + "\nstopped (health.nan_policy = stop): lower train.lr or set train.grad_clip; "
                                   "health.nan_policy = skip skips such steps and goes on");
        }
      }
      // The window's monitored steps (their copies finished: take_window synced).
      std::optional<observe::GradHealthSample> grad_health;
      for (auto& sample : runner.take_grad_health()) {
        sample.step += runner_offset;
        if (events) observe::tensorboard::add_grad_health(*events, sample);
        // Gradient histograms next to the weight ones: the first monitored
        // step at or after each multiple of log.histogram_every.
        if (events && cfg.log.histogram_every > 0 &&
            sample.step / cfg.log.histogram_every * cfg.log.histogram_every > grad_histograms_at) {
          observe::tensorboard::add_grad_histograms(*events, sample);
          grad_histograms_at = sample.step / cfg.log.histogram_every * cfg.log.histogram_every;
        }
        for (const auto& h : detectors.observe(sample)) {
          log << "warning: " << h.message << "\n";
          warnings_now.push_back(h.message);
          summary.health_warnings.push_back(h.message);
        }
        grad_health = std::move(sample);
      }
      if (!std::isfinite(w.loss) && w.nonfinite_steps == 0)
        throw RuntimeError("loss became " + std::to_string(w.loss) + " in the steps up to " + std::to_string(step) +
                           "; lower train.lr or set train.grad_clip");
      const double secs = seconds_since(window_start);
      const double steps_per_s = w.steps / secs;
      const double img_per_s = steps_per_s * cfg.optim.batch_size;
      if (!tuning_logged) log_gemm_tuning(log);  // the warm-up steps after the first one tuned
      tuning_logged = true;
      if (summary.first_loss == 0) summary.first_loss = w.loss;
      summary.final_loss = w.loss;
      nlohmann::json rec = {{"step", step},
                            {"loss", w.loss},
                            {"mse", w.mse},
                            {"lr", w.lr},
                            {"images_per_s", img_per_s},
                            {"steps_per_s", steps_per_s},
                            {"data_wait_s", loader.wait_seconds() - wait_at_window_start},
                            {"elapsed_s", seconds_since(loop_start)},
                            {"epoch", state.position.epoch}};
      if (cfg.model.learn_sigma) rec["vb"] = w.vb;
      if (w.grad_norm >= 0) rec["grad_norm"] = w.grad_norm;
      if (grad_health) {  // compact: the global values, then per module
        auto stats = [](const observe::GradStats& g) {
          return nlohmann::json{{"norm", g.norm},          {"mean_abs", g.mean_abs},
                                {"max_abs", g.max_abs},    {"zero_share", g.zero_share},
                                {"nonfinite", g.nonfinite}, {"update_ratio", g.update_ratio()}};
        };
        rec["grad"] = stats(grad_health->global);
        rec["grad"]["step"] = grad_health->step;
        nlohmann::json modules = nlohmann::json::object();
        for (const auto& m : grad_health->modules) modules[m.name] = stats(m.stats);
        rec["grad_modules"] = modules;
      }
      if (w.nonfinite_steps > 0) rec["nonfinite_steps"] = w.nonfinite_steps;
      if (!warnings_now.empty()) rec["health_warnings"] = warnings_now;
      if (precision == "fp16") {
        rec["loss_scale"] = w.loss_scale;
        rec["skipped_steps"] = w.skipped_steps;
      }
      if (device.is_cuda()) rec["peak_memory_gib"] = compat::peak_memory_bytes(device) / double(1 << 30);
      if (run) run->log_metrics(rec);
      if (events) {
        for (auto it = rec.begin(); it != rec.end(); ++it)
          if (it.key() != "step" && it.value().is_number()) events->add_scalar("train/" + it.key(), step, it.value());
        events->flush();
      }
      if (grad_health) flow_sample = grad_health;
      progress.report(step, w.loss, img_per_s, steps_per_s);
      window_start = Clock::now();
      wait_at_window_start = loader.wait_seconds();
    }
    const bool last = step == cfg.optim.steps;
    const auto pause_start = Clock::now();
    // Stopped by a signal: a checkpoint and the report, no samples (a
    // preemption's grace period is short).
    if (!stop && (last || (cfg.log.sample_every > 0 && step % cfg.log.sample_every == 0))) samples();
    if (last || stop || (cfg.log.checkpoint_every > 0 && step % cfg.log.checkpoint_every == 0)) save();
    if (events && (last || (cfg.log.histogram_every > 0 && step % cfg.log.histogram_every == 0))) {
      observe::tensorboard::add_histograms(*events, "weights", step, model.named_parameters());
      // log.histogram_every = 0: the last monitored step's gradient histograms, at the end.
      if (last && cfg.log.histogram_every == 0 && flow_sample)
        observe::tensorboard::add_grad_histograms(*events, *flow_sample);
      events->flush();
    }
    if (profiler) profiler->end_step(step - summary.first_step);  // a window's trace is written here
    const auto paused = Clock::now() - pause_start;  // keep samples and checkpoints out of the speed
    window_start += paused;
    loop_start += paused;
    if (stop) {
      summary.stop_signal = stop;
      break;
    }
  }
  progress.finish();
  if (profiler) profiler->finish();
  compat::synchronize(device);
  summary.last_step = state.step;
  const double loop_s = seconds_since(loop_start);
  summary.steps_per_s = summary.last_step > summary.first_step ? (summary.last_step - summary.first_step) / loop_s : 0;
  if (device.is_cuda()) summary.peak_memory_gib = compat::peak_memory_bytes(device) / double(1 << 30);
  summary.step_mode = runner.graph_status();
  if (run)
    write_report(run->file("report.md"), cfg, summary, compat::device_description(device), precision,
                 model.parameter_count(true), dataset->describe());
  if (group) group->barrier();  // rank 0's last checkpoint is written when any rank returns
  return summary;
}

}  // namespace perftrain::train
