#include "train/bench/measure_variant.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>

#include "base/fs.h"
#include "compat/compat.h"
#include "data/dataset.h"
#include "distributed/group.h"
#include "io/atomic_file.h"
#include "models/diffusion_model.h"
#include "observe/bench/environment.h"
#include "observe/bench/gpu_sampler.h"
#include "observe/bench/stats.h"
#include "observe/bench/step_timer.h"
#include "observe/profile/kernel_breakdown.h"
#include "ops/attention_paths.h"
#include "train/step_runner.h"

namespace perftrain::train::bench {
namespace {

namespace ob = observe::bench;
using Clock = std::chrono::steady_clock;

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

// The step torch's reference times: no gradient norm (it does not clip).
StepOptions step_options(const TrainConfig& cfg, distributed::Group* group) {
  StepOptions so;
  so.precision = cfg.optim.precision;
  so.group = group;  // data parallel: the trainer's step over the ranks
  so.grad_norm = false;
  return so;
}

// An EMA only where both sides keep one (then it is built here too, and
// counts in the peak memory).
models::DiffusionModelAndEma build_model(const TrainConfig& cfg, bool ema, at::Device device) {
  models::DiffusionModelAndEma built;
  if (ema) built = models::build_diffusion_model_and_ema(cfg.model, cfg.optim.seed, device);
  else built.model = models::build_diffusion_model(cfg.model, cfg.optim.seed, device);
  return built;
}

// `repeats` windows of `steps` timed steps: each window's median, and every step.
std::vector<double> timed_windows(ob::BenchRow& row, const Timing& t, at::Device device,
                                  const std::function<void()>& step) {
  std::vector<double> all_ms;
  for (int64_t r = 0; r < t.repeats; ++r) {
    ob::StepTimer timer(device, t.steps);
    for (int64_t i = 0; i < t.steps; ++i) {
      timer.begin(i);
      step();
      timer.end(i);
    }
    const auto ms = timer.elapsed_ms();  // waits for the device
    row.repeat_median_ms.push_back(ob::summarize(ms).median);
    all_ms.insert(all_ms.end(), ms.begin(), ms.end());
  }
  return all_ms;
}

// Where the time goes, kernel by kernel: 5 more steps under the PyTorch
// profiler, a Markdown table and a Chrome trace into the run directory.
void profile_kernels(const ob::BenchRow& row, const Timing& t, const TrainConfig& cfg,
                     const std::function<void()>& step) {
  const int n = 5;
  const std::string name = "b" + std::to_string(row.batch) + "-" + row.variant;
  auto b = observe::profile_kernels([&] { for (int i = 0; i < n; ++i) step(); }, n,
                                    fs::join(t.profile_dir, "trace-" + name + ".json"));
  const std::string md = "# Kernel time of " + cfg.model.name + " batch " + std::to_string(row.batch) + ", " +
                         row.variant + "\n\n" + observe::to_markdown(b);
  io::write_text_atomic(fs::join(t.profile_dir, "profile-" + name + ".md"), md);
  std::cout << md << std::flush;
}

// One (batch, variant): a fresh model, EMA and runner; the first step timed
// from the start of the build; warm-up; `repeats` windows of `steps` timed
// steps. Everything it allocated is freed when it returns.
void measure_variant(ob::BenchRow& row, const Timing& t, const TrainConfig& cfg, const std::vector<data::Batch>& pool,
                     at::Device device, std::optional<double> peak, distributed::Group* group) {
  const StepOptions so = step_options(cfg, group);
  // The capture happens at step so.warmup_steps + 1; time from one replay after.
  const int64_t warmup = std::max<int64_t>({t.warmup, 1, cfg.speed.graph ? so.warmup_steps + 2 : 0});
  row.warmup = warmup;

  compat::reset_peak_memory(device);
  const bool cuda = device.is_cuda();
  if (cuda) row.held_gib_before = gib(compat::allocated_bytes(device));
  const auto t0 = Clock::now();
  models::DiffusionModelAndEma built = build_model(cfg, t.ema, device);
  compat::synchronize(device);
  row.build_s = std::chrono::duration<double>(Clock::now() - t0).count();
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);
  StepRunner runner(*built.model, built.ema.get(), cfg, so, device, gen);
  ops::reset_attention_paths();

  size_t next = 0;
  const std::function<void()> step = [&] { runner.step(pool[next++ % pool.size()]); };
  step();
  compat::synchronize(device);
  row.first_step_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int64_t i = 1; i < warmup; ++i) step();
  if (cuda) {  // the warm-up's peak (capture included) apart from the steady state's
    compat::synchronize(device);
    row.peak_gib_warmup = gib(compat::peak_memory_bytes(device));
    compat::reset_peak_memory(device);
  }

  ob::GpuSampler sampler(ob::nvidia_smi_id(device));
  const std::vector<double> all_ms = timed_windows(row, t, device, step);
  if (cuda) row.peak_gib_steady = gib(compat::peak_memory_bytes(device));
  row.gpu = sampler.stop();
  row.step_ms = all_ms;
  ob::fill_timing(row, all_ms);
  if (t.profile == row.variant && cuda && group == nullptr) profile_kernels(row, t, cfg, step);
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

// The row's description of the step, before it runs.
ob::BenchRow describe_row(const TrainConfig& cfg, const Timing& t, const ob::Variant& v, int64_t per_rank,
                          distributed::Group* group) {
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
  row.steps = t.steps;
  row.repeats = t.repeats;
  return row;
}

}  // namespace

std::vector<data::Batch> make_pool(const TrainConfig& cfg, int64_t batch, bool cuda) {
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

TrainConfig variant_config(const TrainConfig& base, const ob::Variant& v, int64_t batch) {
  TrainConfig cfg = base;
  cfg.optim.batch_size = batch;
  cfg.optim.precision = v.precision;
  cfg.speed.fused_kernels = v.fused_kernels;
  cfg.speed.fused_optimizer = v.fused_optimizer;
  cfg.speed.graph = v.graph;
  return cfg;
}

ob::BenchRow run_variant(const Timing& t, const TrainConfig& base, const ob::Variant& v,
                         const std::vector<data::Batch>& pool, at::Device device, std::optional<double> peak_tflops,
                         distributed::Group* group) {
  const int64_t per_rank = pool.front().x.size(0);
  const TrainConfig cfg = variant_config(base, v, per_rank * (group ? group->world_size() : 1));
  ob::BenchRow row = describe_row(cfg, t, v, per_rank, group);
  try {
    measure_variant(row, t, cfg, pool, device, peak_tflops, group);
  } catch (const std::exception& e) {  // out of memory, an unsupported switch: a row, and on
    row.error = compat::error_message(e);
  }
  try {  // the next variant starts from an empty cache
    compat::synchronize(device);
    if (device.is_cuda()) compat::empty_cuda_cache();
  } catch (const std::exception& e) {
    if (row.error.empty()) row.error = compat::error_message(e);
  }
  return row;
}

}  // namespace perftrain::train::bench
