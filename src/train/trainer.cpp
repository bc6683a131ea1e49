#include "train/trainer.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <ctime>
#include <memory>

#include "base/error.h"
#include "base/fs.h"
#include "data/batch_loader.h"
#include "diffusion/ddpm.h"
#include "diffusion/flow.h"
#include "io/atomic_file.h"
#include "models/dit.h"
#include "ops/compat.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/ema.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/run_directory.h"
#include "train/sampling.h"

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

}  // namespace

TrainSummary run_training(const TrainConfig& cfg_in, const TrainOptions& opts, std::ostream& log) {
  TrainConfig cfg = cfg_in;
  cfg.validate();
  const at::Device device = resolve_device(cfg.optim.device);
  if (cfg.optim.precision == "bf16" && !device.is_cuda())
    throw UsageError("train.precision = bf16 needs a CUDA device; use fp32 (or auto) on the CPU");
  const bool bf16 = device.is_cuda() && cfg.optim.precision != "fp32";
  if (device.is_cuda()) {
    // TF32 for any fp32 matrix product left outside autocast.
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setBenchmarkCuDNN(true);
  }

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
  RunDirectory run(run_path, !resume_dir.empty());
  io::write_text_atomic(run.file("config.toml"), cfg.to_toml());

  models::DiT model(cfg.model, cfg.optim.seed);
  models::DiT ema(cfg.model, cfg.optim.seed);
  model.transform([&](const std::string&, const at::Tensor& t) { return t.to(device); });
  ema.transform([&](const std::string&, const at::Tensor& t) { return t.to(device); });
  for (auto& p : ema.parameters()) p.set_requires_grad(false);
  const auto params = model.parameters();
  const auto ema_params = ema.parameters();

  AdamW optimizer(model.named_parameters(),
                  {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay});
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);

  TrainerState state;
  if (!resume_dir.empty()) {
    state = load_checkpoint(resume_dir, model, ema, optimizer, gen);
    log << "resumed from " << resume_dir << " at step " << state.step << "\n";
  }
  if (state.step >= cfg.optim.steps)
    throw UsageError("the run is already at step " + std::to_string(state.step) +
                     "; raise train.steps to continue it");

  diffusion::GaussianDiffusion ddpm;
  ddpm.to(device);
  diffusion::FlowOptions flow_opts;
  flow_opts.time_sampling = diffusion::parse_time_sampling(cfg.diffusion.time_sampling);
  diffusion::RectifiedFlow flow(flow_opts);
  const bool use_flow = cfg.diffusion.objective == "flow";

  diffusion::ModelFn forward = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
    compat::AutocastGuard autocast(device.type(), at::kBFloat16, bf16);
    return model.forward(x, t, y);
  };

  log << "perftrain: " << cfg.model.name << " (" << model.parameter_count(true) << " trainable parameters) on "
      << compat::device_description(device) << ", " << (bf16 ? "bf16 autocast" : "fp32") << "\n"
      << "data: " << dataset->describe() << "\n"
      << "run: " << run.path() << "\n";

  data::BatchLoader loader(*dataset, cfg.optim.batch_size, cfg.optim.seed, state.position,
                           device.is_cuda(), static_cast<int>(cfg.data.prefetch));
  Progress progress(log, cfg.optim.steps, opts.interactive);
  SampleOptions sample_opts{cfg.log.sample_classes, cfg.log.sample_per_class, cfg.diffusion.sample_steps,
                            cfg.diffusion.cfg_scale, cfg.optim.seed, bf16};

  TrainSummary summary;
  summary.run_dir = run.path();
  summary.first_step = state.step + 1;
  const auto opts_f = at::TensorOptions().device(device).dtype(at::kFloat);
  at::Tensor loss_sum = at::zeros({}, opts_f), mse_sum = at::zeros({}, opts_f), vb_sum = at::zeros({}, opts_f);
  int64_t window = 0;
  Clock::time_point window_start = Clock::now(), loop_start = Clock::now();
  double wait_at_window_start = 0;
  compat::reset_peak_memory(device);

  auto save = [&]() {
    summary.last_checkpoint = save_checkpoint(run.ckpt_dir(), cfg, state, model, ema, optimizer, gen,
                                              cfg.log.keep_checkpoints);
  };
  auto samples = [&]() {
    char name[64];
    std::snprintf(name, sizeof name, "/step_%08lld.png", static_cast<long long>(state.step));
    summary.last_samples = run.samples_dir() + name;
    write_sample_grid(summary.last_samples, ema, cfg, sample_opts, device);
  };

  while (state.step < cfg.optim.steps) {
    const int64_t step = state.step + 1;
    data::Batch batch = loader.next();
    at::Tensor x = batch.x.to(device, /*non_blocking=*/true);
    at::Tensor y = batch.y.to(device, /*non_blocking=*/true);
    if (cfg.model.class_dropout > 0) {  // label dropout: train the null class for guidance
      auto drop = at::rand({y.size(0)}, gen, opts_f) < cfg.model.class_dropout;
      y = at::where(drop, cfg.model.num_classes, y);
    }
    diffusion::LossTerms terms = use_flow ? flow.training_loss(forward, x, y, gen)
                                          : ddpm.training_loss(forward, x, y, gen, cfg.model.learn_sigma);
    terms.loss.backward();
    at::Tensor grad_norm;
    if (cfg.optim.grad_clip > 0) grad_norm = clip_grad_norm_(params, cfg.optim.grad_clip);
    else if (step % cfg.log.every == 0) grad_norm = global_grad_norm(params);
    const double lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps);
    optimizer.step(lr);
    ema_update_(ema_params, params, ema_decay_at(step - 1, cfg.optim.ema_decay, cfg.optim.ema_warmup));
    state.step = step;
    state.position = loader.position();

    loss_sum += terms.loss.detach();
    mse_sum += terms.mse;
    if (terms.vb.defined()) vb_sum += terms.vb;
    ++window;
    if (step == summary.first_step) {
      compat::synchronize(device);
      summary.first_step_s = std::chrono::duration<double>(Clock::now() - opts.process_start).count();
      loop_start = window_start = Clock::now();
      wait_at_window_start = loader.wait_seconds();
      loss_sum.zero_(), mse_sum.zero_(), vb_sum.zero_();  // the first step is timed apart
      window = 0;
      log << "first step done " << summary.first_step_s << " s after start\n";
    }
    if (window > 0 && (step % cfg.log.every == 0 || step == cfg.optim.steps)) {
      const double loss = loss_sum.item<double>() / window;  // the one host sync per window
      if (!std::isfinite(loss))
        throw RuntimeError("loss became " + std::to_string(loss) + " in the steps up to " + std::to_string(step) +
                           "; lower train.lr or set train.grad_clip");
      const double secs = seconds_since(window_start);
      const double steps_per_s = window / secs;
      const double img_per_s = steps_per_s * cfg.optim.batch_size;
      if (summary.first_loss == 0) summary.first_loss = loss;
      summary.final_loss = loss;
      nlohmann::json rec = {{"step", step},
                            {"loss", loss},
                            {"mse", mse_sum.item<double>() / window},
                            {"lr", lr},
                            {"images_per_s", img_per_s},
                            {"steps_per_s", steps_per_s},
                            {"data_wait_s", loader.wait_seconds() - wait_at_window_start},
                            {"elapsed_s", seconds_since(loop_start)},
                            {"epoch", state.position.epoch}};
      if (terms.vb.defined()) rec["vb"] = vb_sum.item<double>() / window;
      if (grad_norm.defined()) rec["grad_norm"] = grad_norm.item<double>();
      if (device.is_cuda()) rec["peak_memory_gib"] = compat::peak_memory_bytes(device) / double(1 << 30);
      run.log_metrics(rec);
      progress.report(step, loss, img_per_s, steps_per_s);
      loss_sum.zero_(), mse_sum.zero_(), vb_sum.zero_();
      window = 0;
      window_start = Clock::now();
      wait_at_window_start = loader.wait_seconds();
    }
    const bool last = step == cfg.optim.steps;
    const auto pause_start = Clock::now();
    if (last || (cfg.log.sample_every > 0 && step % cfg.log.sample_every == 0)) samples();
    if (last || (cfg.log.checkpoint_every > 0 && step % cfg.log.checkpoint_every == 0)) save();
    const auto paused = Clock::now() - pause_start;  // keep samples and checkpoints out of the speed
    window_start += paused;
    loop_start += paused;
  }
  progress.finish();
  compat::synchronize(device);
  summary.last_step = state.step;
  const double loop_s = seconds_since(loop_start);
  summary.steps_per_s = summary.last_step > summary.first_step ? (summary.last_step - summary.first_step) / loop_s : 0;
  summary.peak_memory_gib = compat::peak_memory_bytes(device) / double(1 << 30);
  write_report(run.file("report.md"), cfg, summary, compat::device_description(device), bf16,
               model.parameter_count(true), dataset->describe());
  return summary;
}

}  // namespace perftrain::train
