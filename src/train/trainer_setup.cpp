// The Trainer's set-up (trainer.h): everything a user can get wrong is
// checked before anything is allocated or created, then the parts are made
// in the order they depend on each other.
#include <ATen/Context.h>

#include <algorithm>
#include <ctime>

#include "base/error.h"
#include "base/fs.h"
#include "base/text.h"
#include "compat/compat.h"
#include "data/batch_loader.h"
#include "distributed/group.h"
#include "observe/log/logger.h"
#include "observe/log/wandb_logger.h"
#include "train/init_from.h"
#include "train/memory_estimate.h"
#include "train/progress.h"
#include "train/run_directory.h"
#include "train/run_loggers.h"
#include "train/run_profiler.h"
#include "train/speed.h"
#include "train/trainer.h"
#include "train/vae.h"
#include "train/eval/evaluation.h"

namespace perftrain::train {
namespace {

at::Device resolve_device(const std::string& want) {
  const bool have = compat::cuda_available();
  if (want == "cuda" && !have) throw UsageError("train.device = cuda but no CUDA GPU is visible");
  return (want == "cuda" || (want == "auto" && have)) ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

std::unique_ptr<data::Dataset> make_dataset(const TrainConfig& cfg) {
  const auto& d = cfg.data;
  if (d.source == "fashion-mnist") return data::open_fashion_mnist(d.path, /*train=*/true);
  if (d.source == "latents") return data::open_latent_shards(d.path);
  if (d.source == "images") return data::open_images(d.path, cfg.model.image_size);
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

observe::HealthThresholds health_thresholds(const HealthConfig& h) {
  observe::HealthThresholds t;
  t.vanish_norm = h.vanish_norm;
  t.patience = h.patience;
  t.explode_factor = h.explode_factor;
  t.median_window = h.median_window;
  t.median_min = std::min<int64_t>(5, h.median_window);
  return t;
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, const TrainOptions& opts, std::ostream& log)
    : cfg_(cfg), opts_(opts), log_(log), detectors_(health_thresholds(cfg.health)) {
  check_config();
  choose_device();
  check_memory();
  check_loggers();
  // From here a first SIGINT/SIGTERM stops the run after its current step.
  if (opts_.save_on_signal) stop_signals_.emplace();
  if (launch_.distributed())
    group_ = std::make_unique<distributed::Group>(launch_, device_,
                                           distributed::GroupOptions{cfg_.distributed.timeout_s, cfg_.distributed.bucket_mb});
  open_dataset();
  open_image_decoder();
  open_evaluator();
  open_run_directory();
  build_model_and_runner();
  resume();
  start_outputs();
  log_start();
  start_loop();
}

Trainer::~Trainer() = default;

// The config's values, the [speed] settings, and (data parallel:
// docs/guide/multi-gpu.md, torchrun's variables say which rank this is)
// train.batch_size as the global batch.
void Trainer::check_config() {
  cfg_.validate();
  apply_speed_settings(cfg_.speed);
  launch_ = distributed::launch_env();
  if (launch_.distributed() && cfg_.optim.batch_size % launch_.world_size != 0)
    throw UsageError("train.batch_size = " + std::to_string(cfg_.optim.batch_size) +
                     " is the global batch and must divide by WORLD_SIZE = " + std::to_string(launch_.world_size));
}

void Trainer::choose_device() {
  const at::Device d = resolve_device(cfg_.optim.device);
  device_ = d.is_cuda() && launch_.distributed()
                ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(launch_.local_rank))
                : d;
  if ((cfg_.optim.precision == "bf16" || cfg_.optim.precision == "fp16") && !device_.is_cuda())
    throw UsageError("train.precision = " + cfg_.optim.precision + " needs a CUDA device; use fp32 (or auto) on the CPU");
  precision_ = cfg_.optim.precision == "auto" ? (device_.is_cuda() ? "bf16" : "fp32") : cfg_.optim.precision;
}

// Before anything is allocated or created: a batch that cannot fit is a
// usage error that says what would fit.
void Trainer::check_memory() const {
  TrainConfig per_rank = cfg_;  // what one process holds
  per_rank.optim.batch_size /= launch_.world_size;
  check_memory_fits(per_rank, device_.is_cuda(), precision_, memory_available_for_training(device_.is_cuda()),
                    cfg_.distributed.shard_optimizer ? launch_.world_size : 1);
}

// log.mlflow's directory, and log.wandb's sidecar with its wandb import
// (rank 0, which logs), before anything is created.
void Trainer::check_loggers() {
  if (launch_.rank == 0) wandb_ = train::check_loggers(cfg_.log, log_);
}

void Trainer::open_dataset() {
  dataset_ = make_dataset(cfg_);
  check_dataset_fits(*dataset_, cfg_);
}

// A resumed run continues in the directory it came from. Under the run's
// lock from here on; config.toml and metrics.jsonl are only written once the
// checkpoint has loaded (start_outputs), so that a failed resume leaves the
// run as it was. Data parallel: rank 0 alone holds it; the others read the
// checkpoint once rank 0 has taken the lock and cleared interrupted saves.
void Trainer::open_run_directory() {
  if (!opts_.resume.empty()) {
    resume_dir_ = resolve_checkpoint_dir(opts_.resume);
    run_path_ = fs::parent_path(fs::parent_path(resume_dir_));
  } else {
    if (cfg_.run.name.empty()) cfg_.run.name = default_run_name(cfg_);
    run_path_ = cfg_.run.dir + "/" + cfg_.run.name;
  }
  if (launch_.rank == 0) run_ = std::make_unique<RunDirectory>(run_path_, !resume_dir_.empty(), log_);
  if (group_) group_->barrier();
  if (!resume_dir_.empty()) resume_dir_ = resolve_checkpoint_dir(opts_.resume);  // latest, read under the lock
  if (run_) run_path_ = run_->path();
}

void Trainer::build_model_and_runner() {
  built_ = models::build_diffusion_model_and_ema(cfg_.model, cfg_.optim.seed, device_);
  gen_ = at::globalContext().defaultGenerator(device_).clone();
  gen_.set_current_seed(cfg_.optim.seed);
  StepOptions step_opts;
  step_opts.precision = precision_;
  step_opts.group = group_.get();
  runner_ = std::make_unique<StepRunner>(*built_.model, built_.ema.get(), cfg_, step_opts, device_, gen_);
}

// The checkpoint's weights, optimizer state, generator and data position;
// data parallel: every rank from the same checkpoint, and rank 0's weights
// everywhere.
void Trainer::resume() {
  models::DiffusionModel& model = *built_.model;
  models::DiffusionModel& ema = *built_.ema;
  if (!resume_dir_.empty()) {
    state_ = load_checkpoint(
        resume_dir_, model, ema, [&](const io::NamedTensors& t) { runner_->load_optimizer_state(t); }, gen_);
    runner_->set_global_step(state_.step);
    log_ << "resumed from " << resume_dir_ << " at step " << state_.step << "\n";
  } else if (!opts_.init_from.empty()) {
    log_ << init_from_weights(opts_.init_from, model, ema) << "\n";
  }
  if (state_.step >= cfg_.optim.steps)
    throw UsageError("the run is already at step " + std::to_string(state_.step) +
                     "; raise train.steps to continue it");
  if (!group_) return;
  const double step = static_cast<double>(state_.step);
  if (group_->allreduce_max(step) != -group_->allreduce_max(-step))
    throw RuntimeError(launch_.describe() + ": the ranks resumed from different checkpoints (this one at step " +
                       std::to_string(state_.step) + ")");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> weights = model.parameters();
  for (const auto& p : ema.parameters()) weights.push_back(p);
  group_->broadcast(weights, 0);
}

// config.toml and metrics.jsonl (RunDirectory::start), the run's earlier
// segments, the loggers (train/run_loggers.h) told the resolved config: the
// values each log window already read back go to them, TensorBoard's weight
// histograms every log.histogram_every steps, the sample grids.
// eval.vae: the latents' VAE decoder, loaded once on rank 0 (which samples),
// for the sample grids (images, not latent channels) and eval.every.
void Trainer::open_image_decoder() {
  if (cfg_.eval.vae.empty() || launch_.rank != 0) return;
  image_decoder_ = vae_image_decoder(cfg_.eval.vae, cfg_, device_, log_, "eval.vae");
}

// eval.every: the networks and reference statistics loaded once (rank 0,
// which samples), every file checked before anything is written.
void Trainer::open_evaluator() {
  const EvalConfig& e = cfg_.eval;
  if (e.every == 0 || launch_.rank != 0) return;
  using Path = std::pair<const char*, std::string>;
  for (const auto& [key, path] :
       {Path{"eval.features", e.features}, Path{"eval.inception", e.inception}, Path{"eval.ref_stats", e.ref_stats}})
    if (!path.empty() && !fs::is_regular_file(path))
      throw UsageError(std::string(key) + " " + base::printable(path) + " is not a file");
  eval::EvalOptions o;
  o.samples = e.samples;
  o.batch_size = std::min<int64_t>(e.samples, 256);
  o.sample = SampleOptions{cfg_.log.sample_classes, cfg_.log.sample_per_class, cfg_.diffusion.sample_steps,
                           cfg_.diffusion.cfg_scale, cfg_.optim.seed, samples_in_bf16(), {}};
  o.inception = e.inception;
  o.ref_stats = e.ref_stats;
  o.features = e.features;
  o.sample.decoder = image_decoder_;
  o.vae = e.vae;
  evaluator_ = std::make_unique<eval::Evaluator>(o, device_);
  evaluator_->check_model(cfg_);
}

void Trainer::start_outputs() {
  if (!run_) return;
  run_->start(cfg_.to_toml(), resume_dir_.empty() ? -1 : state_.step);
  if (!resume_dir_.empty()) earlier_segments_ = read_run_segments(run_->file("segments.jsonl"), state_.step);
  loggers_ = open_loggers(cfg_, *run_, std::move(wandb_), log_);
  observe::log::RunStart start;
  start.run_dir = run_->path();
  start.run_name = run_->path().substr(run_->path().find_last_of('/') + 1);
  start.params = config_params(cfg_);
  start.config_toml = cfg_.to_toml();
  start.resume_step = resume_dir_.empty() ? -1 : state_.step;
  start.metric_tags = {"train/loss"};
  loggers_->start(start);
}

void Trainer::log_start() const {
  const models::DiffusionModel& model = *built_.model;
  log_ << "perftrain: " << cfg_.model.name << " (" << model.parameter_count(true) << " trainable parameters) on "
       << compat::device_description(device_) << ", " << precision_
       << (device_.is_cuda() ? std::string(cfg_.speed.fused_kernels && model.has_fused_path() ? ", fused kernels" : ", unfused") +
                                   (cfg_.speed.recompute ? ", recompute" : "") +
                                   (cfg_.speed.gelu_recompute ? ", GELU recomputed in backward" : "") +
                                   (cfg_.speed.attention == "cudnn"   ? ", cuDNN attention"
                                    : cfg_.speed.attention == "tiled" ? ", tiled attention forward"
                                                                      : "") +
                                   (runner_->weight_grad_stream() ? ", weight gradients on a second stream" : "")
                             : std::string())
       << "\n"
       << "data: " << dataset_->describe() << "\n"
       << "run: " << run_path_ << "\n";
  if (loggers_) log_ << "logging to: " << loggers_->names() << "\n";
  if (group_)
    log_ << "data parallel: " << launch_.world_size << " processes (master " << launch_.master_addr << ":"
         << launch_.master_port << "), global batch " << cfg_.optim.batch_size << " = " << launch_.world_size << " x "
         << cfg_.optim.batch_size / launch_.world_size << "; rank 0 writes the run directory\n";
  if (cfg_.optim.accumulate > 1)
    log_ << "gradient accumulation: " << cfg_.optim.accumulate << " micro-batches of " << cfg_.optim.batch_size
         << " per step, " << cfg_.optim.step_batch() << " samples per optimizer step\n";
  if (!runner_->optimizer_sharding().empty()) log_ << runner_->optimizer_sharding() << "\n";
}

// The loader from the checkpoint's data position, the progress line, the
// sample options, the clocks, --profile's windows (data parallel: rank 0's
// steps) and the health summary's first line.
void Trainer::start_loop() {
  // A step's micro-batches come as one batch (the step runner splits it).
  loader_ = std::make_unique<data::BatchLoader>(*dataset_, cfg_.optim.step_batch(), cfg_.optim.seed, state_.position,
                                                device_.is_cuda(), static_cast<int>(cfg_.data.prefetch),
                                                data::LoaderShard{launch_.rank, launch_.world_size},
                                                data::LoaderOptions{static_cast<int>(cfg_.data.workers),
                                                                    cfg_.data.flip && cfg_.data.source == "images"});
  progress_ = std::make_unique<Progress>(log_, cfg_.optim.steps, opts_.interactive);
  sample_opts_ = SampleOptions{cfg_.log.sample_classes, cfg_.log.sample_per_class, cfg_.diffusion.sample_steps,
                               cfg_.diffusion.cfg_scale, cfg_.optim.seed, samples_in_bf16(), image_decoder_};
  summary_.run_dir = run_path_;
  summary_.first_step = state_.step + 1;
  window_start_ = loop_start_ = Clock::now();
  compat::reset_peak_memory(device_);
  if (!opts_.profile.empty() && run_)
    profiler_ = std::make_unique<RunProfiler>(opts_.profile, cfg_, precision_, device_, run_->path(), *runner_, log_,
                                              opts_.profile_scopes_only);
  summary_.health_monitor = cfg_.health.monitor_every > 0
                                ? "gradient statistics every " + std::to_string(cfg_.health.monitor_every) + " steps"
                                : "off (health.monitor_every = 0)";
}

}  // namespace perftrain::train
