// perftrain bench: training-step variants side by side in this one process
// (each optimisation on and off), optionally against the same step in plain
// PyTorch (bench/reference_dit.py, or reference_single_stream.py for the
// single-stream family, in subprocesses), with medians, confidence
// intervals, MFU against the bf16 matrix peak measured here, peak memory and
// time to first step. Writes bench.json and bench.md into the run directory.
// Data parallel (--nproc-per-node N, or one rank of torchrun's group): the
// trainer's multi-process step per rank, each (batch, variant) beside the
// same one timed by rank 0 alone; against torch's DistributedDataParallel.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <thread>

#include "base/error.h"
#include "base/fs.h"
#include "cli/command.h"
#include "cli/launcher.h"
#include "cli/out_dir.h"
#include "data/dataset.h"
#include "dist/group.h"
#include "dist/launch_env.h"
#include "models/diffusion_model.h"
#include "observe/bench/environment.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/report.h"
#include "observe/bench/stats.h"
#include "observe/bench/step_timer.h"
#include "io/atomic_file.h"
#include "observe/profile/kernel_breakdown.h"
#include "observe/bench/torch_reference.h"
#include "observe/bench/variants.h"
#include "compat/compat.h"
#include "ops/attention_paths.h"
#include "ops/cublaslt_workspace.h"
#include "train/config.h"
#include "train/speed.h"
#include "train/step_runner.h"

namespace perftrain::cli {
namespace {

namespace ob = observe::bench;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string model = "DiT-S/2", batches = "32,256", variants, torch_modes, precision = "bf16";
  std::string out, device = "auto";
  int64_t steps = 30, warmup = 6, repeats = 1;
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  uint64_t seed = 0;
  bool against_torch = false, recompute = false, gelu_recompute = false;
  bool ema = false;         // an EMA update each step, here and in the torch reference
  double cooldown_s = 0;    // the GPU idle this long before each variant and torch run
  std::string profile;      // variant to profile after its timing ("" none)
  std::string profile_dir;  // where its breakdown goes (the run directory)
  std::vector<std::string> overrides;  // --set section.key=value, over the bench's config
  int nproc = 0;                       // --nproc-per-node: start this many ranks here (0: this process)
};

constexpr int64_t kPoolBatches = 8;  // distinct batches, reused round-robin

std::vector<int64_t> parse_batches(const std::string& list) {
  std::vector<int64_t> out;
  for (const auto& item : ob::split_list(list)) {
    size_t used = 0;
    long long b = 0;
    try {
      b = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || b < 1)
      throw UsageError("--batch takes positive integers separated by commas (got '" + item + "')");
    out.push_back(b);
  }
  if (out.empty()) throw UsageError("--batch is empty");
  return out;
}

// The anchors' benchmark config: DiT as in facebookresearch/DiT with
// learn_sigma off, label dropout 0.1, DDPM eps-MSE, AdamW (lr 1e-4, no weight
// decay, no clipping, no LR warm-up); with --ema also an EMA at 0.9999. Then
// --recompute / --gelu-recompute and the --set overrides (e.g.
// speed.attention=cudnn, or a single-stream model's model.cond_tokens and
// model.cond_dim); each variant sets graph, fused_kernels and
// fused_optimizer itself. Either family (--model DiT-* or SS-*).
train::TrainConfig bench_config(const BenchArgs& a, bool cuda) {
  train::TrainConfig cfg;
  cfg.model = models::model_config(a.model);  // UsageError listing the known names
  cfg.model.image_size = a.image_size;
  cfg.model.in_channels = a.in_channels;
  cfg.model.num_classes = a.num_classes;
  cfg.model.learn_sigma = false;
  cfg.model.class_dropout = 0.1;
  cfg.data.source = "synthetic";
  cfg.diffusion.objective = "ddpm";
  cfg.optim.device = cuda ? "cuda" : "cpu";
  cfg.optim.lr = 1e-4;
  cfg.optim.weight_decay = 0;
  cfg.optim.grad_clip = 0;
  cfg.optim.warmup_steps = 0;
  cfg.optim.seed = a.seed;
  cfg.speed.recompute = a.recompute;
  cfg.speed.gelu_recompute = a.gelu_recompute;
  cfg.health.monitor_every = 0;  // timed without gradient monitoring unless --set health.monitor_every=N
  for (const auto& o : a.overrides) train::apply_override(cfg, o);
  cfg.validate();
  return cfg;
}

// The config of one (batch, variant): the variant's precision and step shape.
train::TrainConfig variant_config(const train::TrainConfig& base, const ob::Variant& v, int64_t batch) {
  train::TrainConfig cfg = base;
  cfg.optim.batch_size = batch;
  cfg.optim.precision = v.precision;
  cfg.speed.fused_kernels = v.fused_kernels;
  cfg.speed.fused_optimizer = v.fused_optimizer;
  cfg.speed.graph = v.graph;
  return cfg;
}

// kPoolBatches synthetic batches of `batch`, in pinned memory on a GPU
// machine so the runner's copies are asynchronous as in training. A model
// with condition features (model.cond_dim > 0) gets synthetic ones, as
// train's synthetic data: lengths in [1, cond_tokens], the rest masked.
std::vector<data::Batch> make_pool(const train::TrainConfig& cfg, int64_t batch, bool cuda) {
  const auto& m = cfg.model;
  auto ds = data::make_synthetic(kPoolBatches * batch, {m.in_channels, m.image_size, m.image_size}, m.num_classes,
                                 cfg.optim.seed + 12345);
  const bool features = m.single_stream() && m.cond_dim > 0;
  if (features) ds = data::with_synthetic_cond(std::move(ds), m.cond_tokens, m.cond_dim, cfg.optim.seed + 54321);
  std::vector<data::Batch> pool;
  for (int64_t k = 0; k < kPoolBatches; ++k) {
    data::Batch b;
    b.x = at::empty({batch, m.in_channels, m.image_size, m.image_size}, at::TensorOptions().pinned_memory(cuda));
    b.y = at::empty({batch}, at::TensorOptions().dtype(at::kLong).pinned_memory(cuda));
    std::vector<int64_t> idx(batch);
    for (int64_t i = 0; i < batch; ++i) idx[i] = k * batch + i;
    ds->gather(idx.data(), batch, b.x.data_ptr<float>(), b.y.data_ptr<int64_t>());
    if (features) {
      b.cond = at::empty({batch, m.cond_tokens, m.cond_dim}, at::TensorOptions().pinned_memory(cuda));
      b.cond_len = at::empty({batch}, at::TensorOptions().dtype(at::kLong).pinned_memory(cuda));
      ds->gather_cond(idx.data(), batch, b.cond.data_ptr<float>(), b.cond_len.data_ptr<int64_t>());
    }
    pool.push_back(b);
  }
  return pool;
}

void fill_timing(ob::BenchRow& row, const std::vector<double>& all_ms) {
  const auto s = ob::summarize(all_ms);
  row.ms = s.median;
  row.ms_p10 = s.p10;
  row.ms_p90 = s.p90;
  row.ms_min = s.min;
  row.ms_max = s.max;
  row.ms_mean = s.mean;
  row.ms_ci_low = s.ci.low;
  row.ms_ci_high = s.ci.high;
  row.ci_coverage = s.ci.coverage;
  row.rel_iqr = s.rel_iqr;
  row.run_to_run = ob::run_to_run_spread(row.repeat_median_ms);
}

// One (batch, variant): a fresh model, EMA and runner; the first step timed
// from the start of the build; warm-up; `repeats` windows of `steps` timed
// steps. Everything it allocated is freed when it returns.
void measure_variant(ob::BenchRow& row, const BenchArgs& a, const train::TrainConfig& cfg,
                     const std::vector<data::Batch>& pool, at::Device device, std::optional<double> peak,
                     dist::Group* group) {
  train::StepOptions so;
  so.precision = cfg.optim.precision;
  so.group = group;  // data parallel: the trainer's step over the ranks
  // The step torch's reference times: no gradient norm (it does not clip),
  // an EMA only where both sides keep one (then it is built here too, and
  // counts in the peak memory).
  so.grad_norm = false;
  // The capture happens at step so.warmup_steps + 1; time from one replay after.
  const int64_t warmup = std::max<int64_t>({a.warmup, 1, cfg.speed.graph ? so.warmup_steps + 2 : 0});
  row.warmup = warmup;

  compat::reset_peak_memory(device);
  const bool cuda = device.is_cuda();
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); };
  if (cuda) row.held_gib_before = gib(compat::allocated_bytes(device));
  const auto t0 = Clock::now();
  models::DiffusionModelAndEma built;
  if (a.ema)
    built = models::build_diffusion_model_and_ema(cfg.model, cfg.optim.seed, device);
  else
    built.model = models::build_diffusion_model(cfg.model, cfg.optim.seed, device);
  models::DiffusionModel& model = *built.model;
  compat::synchronize(device);
  row.build_s = std::chrono::duration<double>(Clock::now() - t0).count();
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);
  train::StepRunner runner(model, built.ema.get(), cfg, so, device, gen);
  ops::reset_attention_paths();

  size_t next = 0;
  auto step = [&] { runner.step(pool[next++ % pool.size()]); };
  step();
  compat::synchronize(device);
  row.first_step_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int64_t i = 1; i < warmup; ++i) step();
  if (cuda) {  // the warm-up's peak (capture included) apart from the steady state's
    compat::synchronize(device);
    row.peak_gib_warmup = gib(compat::peak_memory_bytes(device));
    compat::reset_peak_memory(device);
  }

  std::vector<double> all_ms;
  ob::GpuSampler sampler(ob::nvidia_smi_id(device));
  for (int64_t r = 0; r < a.repeats; ++r) {
    ob::StepTimer timer(device, a.steps);
    for (int64_t i = 0; i < a.steps; ++i) {
      timer.begin(i);
      step();
      timer.end(i);
    }
    const auto ms = timer.elapsed_ms();  // waits for the device
    row.repeat_median_ms.push_back(ob::summarize(ms).median);
    all_ms.insert(all_ms.end(), ms.begin(), ms.end());
  }
  if (cuda) row.peak_gib_steady = gib(compat::peak_memory_bytes(device));
  row.gpu = sampler.stop();
  row.step_ms = all_ms;
  fill_timing(row, all_ms);
  if (a.profile == row.variant && device.is_cuda() && group == nullptr) {  // where the time goes, kernel by kernel
    const int n = 5;
    const std::string name = "b" + std::to_string(row.batch) + "-" + row.variant;
    auto b = observe::profile_kernels([&] { for (int i = 0; i < n; ++i) step(); }, n,
                                      fs::join(a.profile_dir, "trace-" + name + ".json"));
    const std::string md = "# Kernel time of " + cfg.model.name + " batch " + std::to_string(row.batch) + ", " +
                           row.variant + "\n\n" + observe::to_markdown(b);
    io::write_text_atomic(fs::join(a.profile_dir, "profile-" + name + ".md"), md);
    std::cout << md << std::flush;
  }
  const auto w = runner.take_window();  // one host sync, after the timing
  row.loss = w.loss;
  row.graph_status = runner.graph_status();
  row.attention = ops::attention_paths_used();
  row.weight_grad_stream = runner.weight_grad_stream();
  if (cuda) row.peak_gib = std::max(*row.peak_gib_warmup, gib(compat::peak_memory_bytes(device)));
  ob::fill_rates(row, 3 * cfg.model.forward_flops_per_sample() * static_cast<double>(row.batch), peak);
  if (!std::isfinite(w.loss))
    row.error = "the loss is not finite (" + std::to_string(w.loss) + "): timings kept in step_ms";
}

// group: data parallel, the pool's batch per rank (the runner's config holds
// the global batch, as the trainer's).
ob::BenchRow run_variant(const BenchArgs& a, const train::TrainConfig& base, const ob::Variant& v,
                         const std::vector<data::Batch>& pool, at::Device device, std::optional<double> peak,
                         dist::Group* group = nullptr) {
  const int64_t per_rank = pool.front().x.size(0);
  const train::TrainConfig cfg = variant_config(base, v, per_rank * (group ? group->world_size() : 1));
  ob::BenchRow row;
  row.model = cfg.model.name;
  row.batch = per_rank;
  row.data_parallel = group != nullptr;
  row.world_size = group ? group->world_size() : 1;
  row.variant = v.name;
  row.precision = cfg.optim.precision;
  row.fused_kernels = cfg.speed.fused_kernels;
  row.fused_optimizer = cfg.speed.fused_optimizer;
  row.graph = cfg.speed.graph;
  row.recompute = cfg.speed.recompute;
  row.gelu_recompute = cfg.speed.gelu_recompute;
  row.steps = a.steps;
  row.repeats = a.repeats;
  try {
    measure_variant(row, a, cfg, pool, device, peak, group);
  } catch (const std::exception& e) {  // out of memory, an unsupported switch: a row, and on
    row.error = compat::error_message(e);
  }
  try {  // the next variant starts from an empty cache
    compat::synchronize(device);
    compat::empty_cuda_cache();
  } catch (const std::exception& e) {
    if (row.error.empty()) row.error = compat::error_message(e);
  }
  return row;
}

// What GEMM tuning (ops::gemm_tune_candidates) chose, into the report and
// printed where it beat cuBLASLt's first pick, so a speedup from it is
// visible and attributable.
void report_gemm_tuning(ob::BenchReport& report) {
  for (const auto& r : ops::gemm_tune_records())
    report.gemm_tuning.push_back({r.what, r.candidates, r.chosen, r.heuristic_ms, r.chosen_ms});
  if (report.gemm_tuning.empty()) return;
  size_t changed = 0;
  for (const auto& t : report.gemm_tuning) changed += t.chosen != 0;
  std::cout << "GEMM tuning (" << ops::gemm_tune_candidates() << " candidates): " << report.gemm_tuning.size()
            << " configurations timed, " << changed << " faster than cuBLASLt's first pick\n";
  for (const auto& t : report.gemm_tuning) {
    if (t.chosen == 0) continue;
    std::cout << "  " << t.what << ": " << ob::format_number(t.heuristic_ms, 3) << " -> "
              << ob::format_number(t.chosen_ms, 3) << " ms (candidate " << t.chosen << " of " << t.candidates
              << ")\n";
  }
  std::cout.flush();
}

void print_row(const ob::BenchRow& r, const std::string& label = "") {
  std::cout << "  batch " << r.batch << " " << r.variant << label << ": ";
  if (!r.ok() && !r.ms) std::cout << "error: " << r.error << "\n";
  else
    std::cout << ob::format_number(r.ms, 2) << " ms (p10 " << ob::format_number(r.ms_p10, 2) << ", p90 "
              << ob::format_number(r.ms_p90, 2) << "), " << ob::format_rate(r.tflops) << " TFLOP/s, peak "
              << ob::format_gib(r.peak_gib)
              << (r.peak_gib_steady ? " (steady " + ob::format_gib(r.peak_gib_steady) + ", held before " +
                                          ob::format_gib(r.held_gib_before) + ")"
                                    : std::string())
              << ", first step " << ob::format_number(r.first_step_s, 2)
              << " s (build " << ob::format_number(r.build_s, 2) << " s), " << ob::execution_note(r)
              << (r.gpu.count > 0 ? "; GPU " + ob::describe(r.gpu) : "") << (r.ok() ? "" : "; error: " + r.error)
              << "\n";
  std::cout.flush();
}

void run(BenchArgs a) {
  if (a.device != "auto" && a.device != "cpu" && a.device != "cuda")
    throw UsageError("--device must be auto, cpu or cuda (got '" + a.device + "')");
  if (a.device == "cuda" && !compat::cuda_available()) throw UsageError("--device cuda but no CUDA GPU is visible");
  const bool cuda = a.device == "cuda" || (a.device == "auto" && compat::cuda_available());
  // Data parallel: this process is a rank when torchrun's variables are set
  // (by torchrun, Slurm, or this command's --nproc-per-node in the parent).
  const dist::LaunchEnv launch = dist::launch_env();
  if (a.nproc > 0 && launch.from_env)
    throw UsageError("--nproc-per-node starts the ranks itself: leave it out under torchrun or Slurm "
                     "(RANK, WORLD_SIZE, ... are set)");
  const bool dp = launch.from_env;
  const bool lead = launch.rank == 0;  // prints, measures the one-process rows and writes the report
  const at::Device device =
      cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dp ? launch.local_rank : 0)) : at::Device(at::kCPU);

  const auto batches = parse_batches(a.batches);
  const auto variants =
      ob::parse_variants(a.variants.empty() ? (cuda ? "eager-fp32,eager-bf16,fused,graph,all" : "eager-fp32")
                                            : a.variants,
                         a.precision);
  std::vector<std::string> torch_modes;
  if (a.against_torch)
    torch_modes = ob::parse_torch_modes(a.torch_modes.empty() ? (cuda ? "eager-bf16,compile,reduce-overhead"
                                                                      : "eager-fp32")
                                                              : a.torch_modes);
  const train::TrainConfig base = bench_config(a, cuda);
  train::apply_speed_settings(base.speed);

  const std::string out = a.out.empty() ? default_out_dir("bench", a.model) : a.out;
  a.profile_dir = out;
  if (lead && fs::exists(fs::join(out, "bench.json")))
    throw UsageError(out + " already holds a bench.json; choose another --out");
  if (a.nproc > 0) {  // the parent: start the ranks (checked above: usage errors once, before any starts)
    auto args = arguments_without_nproc();
    if (a.out.empty()) args.insert(args.end(), {"--out", out});  // one folder for every rank
    std::cout.flush();
    std::exit(launch_ranks(a.nproc, args));
  }
  const int64_t local_world = launch.local_world_size;
  // On the CPU the ranks share the cores: each its share, the one-process rows too.
  if (dp && !cuda)
    at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency() / local_world)));
  std::unique_ptr<dist::Group> group;
  if (dp)
    group = std::make_unique<dist::Group>(launch, device,
                                          dist::GroupOptions{base.dist.timeout_s, base.dist.bucket_mb});
  if (lead) fs::create_directories(out);

  const std::string source_dir = ob::find_source_dir();
  ob::BenchReport report;
  if (lead) report.environment = ob::collect_environment(device, source_dir);
  auto& s = report.settings;
  s.model = base.model.name;
  s.family = base.model.family;
  if (base.model.single_stream()) {
    s.cond_tokens = base.model.cond_tokens, s.cond_dim = base.model.cond_dim;
    s.condition = s.cond_dim > 0 ? "features " + std::to_string(s.cond_tokens) + "x" + std::to_string(s.cond_dim) +
                                       ", synthetic lengths in [1, " + std::to_string(s.cond_tokens) +
                                       "] (the rest masked as keys)"
                                 : std::to_string(s.cond_tokens) + " learned tokens per class";
  } else {
    s.condition = "class label (adaLN)";
  }
  s.image_tokens = base.model.tokens(), s.sequence_tokens = base.model.sequence_tokens();
  s.depth = base.model.depth, s.hidden = base.model.hidden, s.heads = base.model.heads, s.patch = base.model.patch;
  s.image_size = base.model.image_size, s.in_channels = base.model.in_channels;
  s.num_classes = base.model.num_classes;
  s.learn_sigma = base.model.learn_sigma;
  s.class_dropout = base.model.class_dropout;
  s.objective = base.diffusion.objective;
  s.parameters = base.model.parameter_count(/*trainable_only=*/true);
  s.train_flops_per_image = 3 * base.model.forward_flops_per_sample();
  s.batches = batches;
  for (const auto& v : variants) s.variants.push_back(v.name);
  s.precision = a.precision;
  s.speed = train::config_fields(base, "speed");
  s.steps = a.steps, s.warmup = a.warmup, s.repeats = a.repeats;
  s.device = cuda ? "cuda" : "cpu";
  s.data_pool = kPoolBatches;
  char optim[160];
  char ema[32] = "no EMA";
  if (a.ema) std::snprintf(ema, sizeof ema, "EMA %g", base.optim.ema_decay);
  std::snprintf(optim, sizeof optim, "AdamW lr %g, betas (%g, %g), eps %g, weight decay %g, no clipping; %s",
                base.optim.lr, base.optim.beta1, base.optim.beta2, base.optim.eps, base.optim.weight_decay, ema);
  s.optimizer = optim;
  s.cooldown_s = a.cooldown_s;
  s.against_torch = a.against_torch;
  s.torch_modes = torch_modes;
  if (a.against_torch) s.torch_python = ob::reference_python(source_dir);
  if (dp) s.world_size = launch.world_size, s.dist_backend = cuda ? "nccl" : "gloo";

  if (lead) {
    std::cout << "perftrain bench: " << s.model << " (" << s.parameters << " trainable parameters, "
              << ob::format_number(s.train_flops_per_image / 1e9, 2) << " GFLOP per image per step; "
              << s.image_tokens << " image tokens, condition: " << s.condition << ") on "
              << report.environment.device << ", torch " << report.environment.torch << ", commit "
              << report.environment.commit << "\n";
    if (dp)
      std::cout << "data parallel: " << launch.world_size << (launch.world_size == 1 ? " rank" : " ranks")
                << " over " << s.dist_backend << " (master " << launch.master_addr << ":" << launch.master_port
                << "), batch per rank; each (batch, variant) first by rank 0 alone\n";
    report.matmul_peak = ob::measure_matmul_peak(device);
    std::cout << "bf16 matmul peak: "
              << (report.matmul_peak.tflops ? ob::format_number(report.matmul_peak.tflops, 1) + " TFLOP/s (" +
                                                  report.matmul_peak.note + ")"
                                            : report.matmul_peak.note)
              << "\n";
    std::cout.flush();
  }

  // Every timed window starts from a GPU at rest: a power-bound step runs
  // at a higher clock on a cooler GPU, so back to back the later runs
  // would be timed on a hotter one than the earlier.
  auto cool_down = [&] {
    if (a.cooldown_s <= 0) return;
    compat::synchronize(device);
    std::this_thread::sleep_for(std::chrono::duration<double>(a.cooldown_s));
  };
  for (int64_t b : batches) {
    const auto pool = make_pool(base, b, cuda);
    for (const auto& v : variants) {
      if (!dp) {
        cool_down();
        report.rows.push_back(run_variant(a, base, v, pool, device, report.matmul_peak.tflops));
        print_row(report.rows.back());
        continue;
      }
      // Rank 0 alone first (the others wait, their GPUs idle), then all ranks.
      if (lead) {
        cool_down();
        report.single_process.push_back(run_variant(a, base, v, pool, device, report.matmul_peak.tflops));
        print_row(report.single_process.back(), ", 1 process");
      }
      group->barrier();
      cool_down();
      ob::BenchRow row = run_variant(a, base, v, pool, device, report.matmul_peak.tflops, group.get());
      std::vector<double> mine(static_cast<size_t>(launch.world_size), 0.0);
      mine[static_cast<size_t>(launch.rank)] = row.ms ? *row.ms : -1.0;
      row.rank_ms = group->allreduce_sum(mine);  // every rank's median (-1: none)
      if (!lead) continue;
      const double slowest = *std::max_element(row.rank_ms.begin(), row.rank_ms.end());
      if (row.ms && std::all_of(row.rank_ms.begin(), row.rank_ms.end(), [](double x) { return x > 0; }))
        row.images_per_s_total = static_cast<double>(launch.world_size * row.batch) / (slowest / 1e3);
      const ob::BenchRow& one = report.single_process.back();
      if (row.ms && one.ok() && one.ms) {
        row.scaling_efficiency = *one.ms / *row.ms;
        row.exposed_comm_ms = *row.ms - *one.ms;
      }
      report.rows.push_back(row);
      print_row(row, ", " + std::to_string(launch.world_size) + (launch.world_size == 1 ? " rank" : " ranks"));
      std::cout << "    " << ob::data_parallel_line(report, row) << "\n" << std::flush;
    }
  }
  if (group) {  // the ranks are done; rank 0 goes on alone (the torch reference needs every GPU)
    group->barrier();
    group.reset();
  }
  if (!lead) return;

  report_gemm_tuning(report);

  if (a.against_torch) {
    const std::string script = ob::reference_script(source_dir, base.model.family);
    for (int64_t b : batches) {
      for (const auto& mode : torch_modes) {
        ob::TorchBenchRequest r;
        r.model = base.model.name;
        r.family = base.model.family;
        r.cond_tokens = base.model.cond_tokens, r.cond_dim = base.model.cond_dim;
        r.depth = base.model.depth, r.hidden = base.model.hidden, r.heads = base.model.heads;
        r.patch = base.model.patch;
        r.image_size = base.model.image_size, r.in_channels = base.model.in_channels;
        r.num_classes = base.model.num_classes;
        r.class_dropout = base.model.class_dropout;
        r.batch = b, r.steps = a.steps, r.warmup = a.warmup, r.mode = mode;
        r.ema_decay = a.ema ? base.optim.ema_decay : 0.0;
        r.device = cuda ? "cuda" : "cpu";
        r.nproc = dp ? launch.world_size : 0;  // DistributedDataParallel over as many processes
        cool_down();
        if (dp && local_world != launch.world_size) {  // several hosts: the reference runs on this one only
          ob::TorchRow row;
          row.model = r.model, row.batch = b, row.mode = mode, row.world_size = launch.world_size;
          row.error = "the DDP reference runs on one host; WORLD_SIZE " + std::to_string(launch.world_size) +
                      " spans several (LOCAL_WORLD_SIZE " + std::to_string(local_world) + ")";
          report.torch.push_back(row);
          continue;
        }
        std::cout << "  torch batch " << b << " " << mode << " ..." << std::flush;
        auto row = ob::run_torch_bench(s.torch_python, script, r,
                                       fs::join(out, "torch-b" + std::to_string(b) + "-" + mode + ".log"));
        ob::fill_rates(row, report.matmul_peak.tflops);
        std::cout << " " << (row.ok() ? ob::format_number(row.ms, 2) + " ms" : "error: " + row.error) << "\n";
        report.torch.push_back(row);
      }
    }
  }

  report.summary = ob::summarize_batches(report.rows, report.torch);
  ob::write_report_files(out, report);
  std::cout << "\n" << ob::format_table(report) << "\nwrote " << fs::join(out, "bench.json") << " and "
            << fs::join(out, "bench.md") << "\n";
  const bool any = std::any_of(report.rows.begin(), report.rows.end(), [](const ob::BenchRow& r) { return r.ok(); });
  if (!any) throw RuntimeError("no variant ran (the errors are in " + fs::join(out, "bench.md") + ")");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "time training-step variants side by side (and against plain PyTorch)");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--model", a->model,
                  "model name (perftrain models lists them); SS-* models take their condition from --set "
                  "model.cond_tokens=N [--set model.cond_dim=D: features, synthetic lengths]");
  cmd->add_option("--batch", a->batches, "batch sizes, comma-separated (default 32,256)");
  cmd->add_option("--variants", a->variants,
                  "eager-fp32, eager-bf16, fused, graph, all, comma-separated (default: all five on a GPU, "
                  "eager-fp32 on the CPU)");
  cmd->add_option("--steps", a->steps, "timed steps per repeat")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "untimed steps first (graph variants: at least capture + 1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--repeats", a->repeats, "timed windows per variant (run-to-run spread)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--against-torch", a->against_torch,
                "also time bench/reference_dit.py or, for SS-* models, bench/reference_single_stream.py (plain "
                "PyTorch)");
  cmd->add_option("--torch-modes", a->torch_modes,
                  "eager-fp32, eager-bf16, compile, reduce-overhead (default: eager-bf16,compile,reduce-overhead "
                  "on a GPU, eager-fp32 on the CPU)");
  cmd->add_option("--image-size", a->image_size, "latent height = width")->check(CLI::PositiveNumber);
  cmd->add_option("--in-channels", a->in_channels, "latent channels")->check(CLI::PositiveNumber);
  cmd->add_option("--num-classes", a->num_classes, "classes")->check(CLI::PositiveNumber);
  cmd->add_option("--precision", a->precision, "bf16 | fp16: the mixed-precision variants' dtype");
  cmd->add_option("--out", a->out, "run directory (default runs/bench-<model>-<date>)");
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->add_flag("--recompute", a->recompute,
                "recompute block activations in backward (all variants; speed.recompute)");
  cmd->add_flag("--gelu-recompute", a->gelu_recompute,
                "keep only the MLPs' pre-activations, GELU again in backward (all variants; speed.gelu_recompute)");
  cmd->add_option("--set", a->overrides,
                  "override a config key for all variants: section.key=value, e.g. speed.attention=cudnn "
                  "(repeatable; the variants set speed.graph, fused_kernels and fused_optimizer)");
  cmd->add_flag("--ema", a->ema,
                "also update an EMA of the weights (decay 0.9999) every step, in every variant and in the torch "
                "reference (default: the anchors' step, AdamW only)");
  cmd->add_option("--cooldown", a->cooldown_s,
                  "seconds of idle GPU before each variant and each torch run, so that every timed window starts "
                  "from a GPU at rest (power-bound steps run at higher clocks on a cooler GPU); default 0: back "
                  "to back")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "model and data seed");
  cmd->add_option("--profile", a->profile,
                  "after timing this variant (e.g. all), record 5 steps with the PyTorch profiler: kernel time by "
                  "kind and the top kernels (profile-b<batch>-<variant>.md) and a Chrome trace");
  cmd->add_option("--nproc-per-node", a->nproc,
                  "data parallel: start this many ranks on this host (one per GPU) and time the trainer's "
                  "multi-process step, batch per rank, beside each variant run by one process alone; with "
                  "--against-torch the reference under DistributedDataParallel (docs/guide/multi-gpu.md). "
                  "Under torchrun leave it out: each process is a rank; 0: this process alone")
      ->check(CLI::Range(0, 1024).description(""))
      ->default_str("0");
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
