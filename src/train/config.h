// Everything a training run is configured by, as plain structs. Resolution
// order: defaults for the device (GPU: DiT-S/2 on Fashion-MNIST; CPU: a small
// DiT-T/4 that trains in minutes), then a TOML file, then "section.key=value"
// overrides from the command line. The resolved config is written to the run
// directory as config.toml and is itself a valid input.
// (The CPU default trains with rectified flow; see default_config.)
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "models/dit_config.h"
#include "ops/cublaslt_workspace.h"

namespace perftrain::train {

struct DataConfig {
  std::string source = "fashion-mnist";  // fashion-mnist | latents | images | synthetic
  // images: an image folder or a tar shard pattern (data/image_set.h)
  std::string path = "/usr/share/datasets/fashion-mnist";
  int64_t synthetic_size = 8192;
  int64_t prefetch = 3;  // batches prepared ahead by the loader thread
  int64_t workers = 4;   // threads that read (decode) each batch's samples
  bool flip = true;      // images: random horizontal flip (data::LoaderOptions)
};

struct OptimConfig {
  int64_t steps = 5000;
  int64_t batch_size = 256;  // the micro-batch: each optimizer step takes accumulate of them
  int64_t accumulate = 1;    // micro-batches per optimizer step (gradient accumulation)
  double lr = 1e-4;          // the peak learning rate
  double weight_decay = 0.0;
  bool decay_all = false;    // false: weight decay on matrix weights only (train/weight_decay.h)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t warmup_steps = 0;  // linear LR warm-up from 0
  // After the warm-up (train/lr_schedule.h): constant | cosine | linear |
  // wsd (warm-up, stable, then the last decay_fraction of the steps decay).
  std::string lr_schedule = "constant";
  double lr_min = 0.0;         // the floor cosine, linear and wsd decay to
  double decay_fraction = 0.2;  // wsd: the fraction of train.steps that decays
  double grad_clip = 0.0;    // max global gradient norm; 0 = off
  double ema_decay = 0.9999;
  bool ema_warmup = true;  // decay min(ema_decay, (1+s)/(10+s)): an EMA useful early on
  int64_t ema_start = 0;   // optimizer steps before this one copy the weights into the EMA

  // The rows one optimizer step takes: every micro-batch's, all ranks'.
  int64_t step_batch() const { return batch_size * accumulate; }
  uint64_t seed = 0;
  std::string device = "auto";     // auto | cpu | cuda
  // auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32 | fp8 (the blocks'
  // big linears as fp8 products, bf16 autocast elsewhere on CUDA, fp32 on the CPU)
  std::string precision = "auto";
  // fp8's delayed scaling: the steps of amax each scale is taken from, and
  // the power-of-two headroom below fp8's largest value (models/fp8_states.h).
  int64_t fp8_amax_history = 16;  // a few dozen steps' spikes are seen
  int64_t fp8_margin = 0;
};

// How a step runs on the GPU (docs/guide/speed.md): each key is a choice a
// user may want, the defaults are the fast path. graph, fused_kernels,
// fused_optimizer, recompute and gelu_recompute shape the step runner's
// step; attention, weight_grad_stream and gemm_tune are process-wide and set
// by apply_speed_settings (train/speed.h) before a run or bench starts.
struct SpeedConfig {
  bool graph = true;            // capture the whole step in one CUDA graph and replay it
  bool fused_kernels = true;    // DiT blocks through the fused ops (adaLN LayerNorm, epilogues, ...)
  bool fused_optimizer = true;  // clip + AdamW + EMA + LR on the device, no host sync
  bool recompute = false;       // recompute each block's activations in backward (less memory)
  bool gelu_recompute = false;  // keep only the MLPs' pre-activations, GELU again in backward (less memory, slower)
  // auto: our whole-head kernels where they apply, elsewhere per shape our tiled kernels or cuDNN's, whichever timed
  // faster | whole_head: the whole-head kernels where they apply, cuDNN's elsewhere | tiled: our tiled kernels
  // wherever they apply | cudnn: cuDNN's fused
  std::string attention = "auto";
  std::string weight_grad_stream = "auto";  // weight gradients on a second stream: auto (by size) | on | off
  int64_t gemm_tune = ops::kDefaultGemmTuneCandidates;  // cuBLASLt candidates timed per product, 0..64 (0: first pick)
};

struct DiffusionConfig {
  std::string objective = "ddpm";         // ddpm (eps-prediction) | flow (rectified flow)
  std::string time_sampling = "uniform";  // flow only: uniform | logit-normal
  int64_t sample_steps = 50;              // DDIM / Euler steps for samples
  double cfg_scale = 4.0;                 // classifier-free guidance scale
};

struct LogConfig {
  int64_t every = 50;               // steps between metrics lines
  int64_t sample_every = 1000;      // steps between sample grids (0: only at the end)
  int64_t checkpoint_every = 1000;  // steps between checkpoints (0: only at the end)
  int64_t keep_checkpoints = 3;
  int64_t sample_per_class = 8;
  int64_t sample_classes = 10;  // the first N classes, one row each
  bool tensorboard = true;          // TensorBoard event files in tb/ of the run directory
  int64_t histogram_every = 1000;   // steps between weight histograms in them (0: only at the end)
  std::string mlflow;               // MLflow's tracking directory (a local file store, e.g. mlruns); empty: off
  std::string mlflow_experiment = "Default";  // the MLflow experiment the run goes into
  std::string wandb = "off";        // Weights & Biases: off | offline | online (a Python sidecar)
  std::string wandb_project = "perftrain";
};

// Training health (docs/guide/health.md): gradient monitoring inside the
// step, the detectors' thresholds, and what a non-finite loss or gradient does.
struct HealthConfig {
  int64_t monitor_every = 50;       // steps between gradient statistics (0: off, nothing added to the step)
  bool grad_histograms = true;      // monitored steps also take gradient histograms (TensorBoard grad/<module>)
  std::string nan_policy = "stop";  // stop: name the first non-finite module and exit | skip: skip the update, go on
  bool anomaly_mode = false;        // libtorch's anomaly mode in the eager re-run that locates a NaN
  double vanish_norm = 1e-7;        // a module's gradient norm under this for `patience` monitored steps: vanishing
  int64_t patience = 3;             // monitored steps in a row for vanishing and dead (all-zero) layers
  double explode_factor = 10;       // global gradient norm above this times its running median: exploding
  int64_t median_window = 20;       // monitored steps in that running median
};

// Data parallel over processes (docs/guide/multi-gpu.md): how long a rank
// waits for the others, and how gradients are bucketed for the all-reduce.
struct DistributedConfig {
  double timeout_s = 300;  // connecting to the master, and each collective; a dead rank is an error after this
  double bucket_mb = 25;   // gradients all-reduced together in flat buckets of this size
  // ZeRO-1: each rank keeps the AdamW moments of the parameters it owns only
  // (whole tensors, balanced by size) and sends its updated weights to the
  // others after each step (train/sharded_optimizer.h).
  bool shard_optimizer = false;
};

// Sample quality measured inside training (docs/guide/evaluation.md): every
// `every` steps, `samples` images from the EMA weights, between steps as the
// sample grids are, through the feature network (`features`) and/or the FID
// Inception network (`inception` with `ref_stats`).
struct EvalConfig {
  int64_t every = 0;        // steps between evaluations (0: off)
  int64_t samples = 1000;   // images sampled each time
  std::string features;     // a feature network file (perftrain eval --train-features)
  std::string inception;    // pytorch-fid's Inception weights as safetensors
  std::string ref_stats;    // .npz with mu and sigma of the reference images' pool3 features
  std::string vae;          // a latent model's VAE folder (diffusers AutoencoderKL): samples decoded to images
};

struct RunConfig {
  std::string dir = "runs";
  std::string name;  // empty: <model>-<dataset>-<date>
};

struct TrainConfig {
  models::DiTConfig model;
  DataConfig data;
  OptimConfig optim;
  DiffusionConfig diffusion;
  LogConfig log;
  RunConfig run;
  SpeedConfig speed;
  HealthConfig health;
  DistributedConfig distributed;
  EvalConfig eval;

  // Throws UsageError naming the key when a value cannot work.
  void validate() const;
  std::string to_toml() const;
};

// The most image tokens ((image_size / patch)^2) a config may ask for: a
// 256 x 256 grid of patches. TrainConfig::validate() refuses more, before
// anything is built from the config.
constexpr int64_t kMaxImageTokens = 65536;
// The most micro-batches one optimizer step may take (train.accumulate).
constexpr int64_t kMaxAccumulate = 4096;

// The bytes of the fp32 weights a model of this config holds (parameters and
// fixed tensors).
double model_weight_bytes(const models::DiTConfig& model);
// UsageError naming the model's size keys when its weights alone need more
// than available_bytes (train/memory_estimate.h: memory_available_for_training):
// what `sample` checks before building the model a checkpoint describes.
void check_model_fits(const models::DiTConfig& model, double available_bytes);

// The [speed] keys' part of TrainConfig::validate(): UsageError naming the key
// and its allowed values.
void validate_speed(const SpeedConfig& speed);

// Every key with its value, typed, in config.toml's order ("section.key"):
// what the run's loggers record as hparams and params (observe/log/logger.h).
struct ConfigValue {
  std::string key;
  std::variant<int64_t, uint64_t, double, bool, std::string> value;
};
std::vector<ConfigValue> config_values(const TrainConfig& cfg);

// The defaults for a machine with (cuda) or without a GPU.
TrainConfig default_config(bool cuda);
// Applies a TOML document (file contents) over cfg; unknown sections or keys
// and values of the wrong type are UsageErrors naming the key and the file.
void apply_toml(TrainConfig& cfg, const std::string& toml_text, const std::string& origin);
void apply_toml_file(TrainConfig& cfg, const std::string& path);
// Applies "section.key=value" (value parsed as TOML, bare strings allowed).
void apply_override(TrainConfig& cfg, const std::string& assignment);
// The keys of one section with their values as config.toml writes them
// (strings quoted), in config.toml's order: for reports, e.g. "speed".
std::vector<std::pair<std::string, std::string>> config_fields(const TrainConfig& cfg, const std::string& section);

}  // namespace perftrain::train
