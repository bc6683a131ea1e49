#include "train/profile/profile_driver.h"

#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/fs.h"
#include "base/scope.h"
#include "compat/compat.h"
#include "data/batch_loader.h"
#include "data/dataset.h"
#include "io/atomic_file.h"
#include "models/diffusion_model.h"
#include "observe/bench/environment.h"
#include "observe/bench/gpu_sampler.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/report.h"
#include "observe/bench/stats.h"
#include "observe/bench/step_timer.h"
#include "observe/profile/memory.h"
#include "observe/profile/step_profiler.h"
#include "observe/profile/window_report.h"
#include "train/run_profiler.h"
#include "train/speed.h"
#include "train/step_runner.h"

namespace perftrain::train::profile {
namespace {

namespace ob = observe::bench;
namespace op = observe::profile;

// A dataset that takes `ms` per batch: what a slow loader (decoding,
// augmentation, a network file system) looks like to the step.
class SlowDataset : public data::Dataset {
 public:
  SlowDataset(std::unique_ptr<data::Dataset> base, double ms) : base_(std::move(base)), ms_(ms) {}
  int64_t size() const override { return base_->size(); }
  std::array<int64_t, 3> sample_shape() const override { return base_->sample_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  std::string describe() const override { return base_->describe() + ", slowed to " + std::to_string(ms_) + " ms a batch"; }
  std::array<int64_t, 2> cond_shape() const override { return base_->cond_shape(); }
  void gather(const int64_t* idx, int64_t n, float* x, int64_t* y) const override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
    base_->gather(idx, n, x, y);
  }
  void gather_cond(const int64_t* idx, int64_t n, float* cond, int64_t* len) const override {
    base_->gather_cond(idx, n, cond, len);
  }

 protected:
  int64_t read(int64_t i, float* out) const override {
    int64_t label = 0;
    base_->gather(&i, 1, out, &label);
    return label;
  }

 private:
  std::unique_ptr<data::Dataset> base_;
  double ms_;
};

// The anchors' step (bench's) with the variant, then --graph / --fused, then --set.
TrainConfig profile_config(const ProfileOptions& o, bool cuda, const ob::Variant& v, int64_t batch) {
  TrainConfig cfg = bench::anchor_config(o.step, cuda);
  cfg.data.synthetic_size = std::min<int64_t>(std::max<int64_t>(8 * batch, 256), data::kMaxSyntheticSize);
  cfg.optim.batch_size = batch;
  cfg.optim.precision = v.precision;
  cfg.speed.fused_kernels = v.fused_kernels;
  cfg.speed.fused_optimizer = v.fused_optimizer;
  cfg.speed.graph = v.graph;
  if (!o.graph.empty()) cfg.speed.graph = o.graph == "on";
  if (!o.fused.empty()) cfg.speed.fused_kernels = cfg.speed.fused_optimizer = o.fused == "on";
  for (const auto& s : o.step.overrides) apply_override(cfg, s);
  // The CPU runs fp32, or fp8 on the ops' references.
  if (!cuda && cfg.optim.precision != "fp32" && cfg.optim.precision != "fp8") cfg.optim.precision = "fp32";
  cfg.validate();
  bench::check_one_micro_batch(cfg);
  return cfg;
}

// A finite schedule of at most kMaxScheduleSteps steps.
op::Schedule bounded_schedule(const std::string& text) {
  const op::Schedule s = op::parse_schedule(text, "--schedule");
  const int64_t steps = op::steps_to_last_window(s);
  if (steps < 0)
    throw UsageError("--schedule: repeat=0 (windows for as long as a run lasts) is for train --profile; "
                     "perftrain profile takes a count of windows");
  if (steps > kMaxScheduleSteps)
    throw UsageError("--schedule: " + op::to_string(s) + " runs " + std::to_string(steps) +
                     " steps; perftrain profile runs at most " + std::to_string(kMaxScheduleSteps) +
                     " (train --profile profiles a longer run)");
  return s;
}

// The synthetic data of train (condition features for a single-stream model
// with model.cond_dim > 0), optionally slowed down.
std::unique_ptr<data::Dataset> make_dataset(const TrainConfig& cfg, double slow_data_ms) {
  const auto& m = cfg.model;
  std::unique_ptr<data::Dataset> ds = data::make_synthetic(
      cfg.data.synthetic_size, {m.in_channels, m.image_size, m.image_size}, m.num_classes, cfg.optim.seed + 12345);
  if (m.single_stream() && m.cond_dim > 0)
    ds = data::with_synthetic_cond(std::move(ds), m.cond_tokens, m.cond_dim, cfg.optim.seed + 54321);
  if (slow_data_ms > 0) ds = std::make_unique<SlowDataset>(std::move(ds), slow_data_ms);
  return ds;
}

struct Pass {
  std::vector<std::string> traces;
  std::vector<op::MeasuredStep> timings;  // per window trace (traces[i], before the memory snapshot)
  double measured_ms = 0;
  std::string step_mode;
  ob::GpuSamples gpu;
  op::AllocatorStats memory;  // invalid on the CPU
};

// The median step as it runs without the profiler (data wait included, as in training).
double time_unprofiled(const std::function<void()>& step, at::Device device, int64_t steps) {
  ob::StepTimer timer(device, steps);
  for (int64_t i = 0; i < steps; ++i) {
    timer.begin(i);
    step();
    timer.end(i);
  }
  return ob::summarize(timer.elapsed_ms()).median;
}

op::ProfilerOptions profiler_options(const ProfilePlan& p, const TrainConfig& cfg, at::Device device,
                                     const std::string& tag, const std::string& step_mode, bool captured) {
  const ProfileOptions& o = p.options;
  op::ProfilerOptions po;
  po.schedule = p.schedule;
  po.dir = o.step.out;
  po.tag = tag;
  po.cuda = device.is_cuda();  // on the CPU, no CUDA activity is asked of the profiler
  po.cuda_device = device.is_cuda() ? device.index() : 0;
  po.record_shapes = o.record_shapes;
  po.profile_memory = o.profile_memory;
  po.with_stack = o.with_stack;
  po.gzip = o.gzip;
  po.scopes_only = o.scopes_only;
  po.sync = [device] { compat::synchronize(device); };
  po.metadata = {{"model", cfg.model.name},
                 {"batch", std::to_string(cfg.optim.batch_size)},
                 {"precision", cfg.optim.precision},
                 {"step_mode", step_mode},
                 {"ops_recorded", o.scopes_only ? "false: perftrain scopes only (--profile-scopes-only)" : "true"},
                 {"captured", captured ? "true: each step is one CUDA graph launch; its kernels are not "
                                         "split by phase (perftrain profile --profile-uncaptured)"
                                       : "false"}};
  return po;
}

// Allocations recorded during the profiled steps (CUDA only): a snapshot that
// fails costs the snapshot, not the profile.
class MemorySnapshot {
 public:
  MemorySnapshot(bool on, bool with_stack) : on_(on) {
    guarded([&] { op::start_memory_history(with_stack); });
  }
  // Saves it as <dir>/<tag>memory_snapshot.pickle into traces.
  void save(const std::string& dir, const std::string& tag, std::vector<std::string>& traces) {
    const std::string path = fs::join(dir, tag + "memory_snapshot.pickle");
    guarded([&] {
      if (op::save_memory_snapshot(path)) traces.push_back(path);
    });
    guarded([&] { op::stop_memory_history(); });
    if (on_ && !error_.empty()) std::cerr << "perftrain profile: no memory snapshot: " << error_ << "\n";
  }

 private:
  void guarded(const std::function<void()>& f) {
    if (!on_ || !error_.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      error_ = compat::error_message(e);
    }
  }
  bool on_;
  std::string error_;
};

// The schedule's windows under the profiler, each window's timing with the
// unprofiled median beside it.
void record_windows(Pass& pass, const ProfilePlan& p, op::StepProfiler& profiler, at::Device device,
                    const std::function<void()>& step) {
  ob::GpuSampler sampler(ob::nvidia_smi_id(device));
  const int64_t steps = op::steps_to_last_window(p.schedule);
  for (int64_t i = 0; i < steps; ++i) {
    profiler.begin_step(i);
    step();
    profiler.end_step(i);
    if (profiler.done_after(i)) break;
  }
  profiler.finish();
  pass.gpu = sampler.stop();
  pass.traces = profiler.traces();
  for (size_t w = 0; w < pass.traces.size(); ++w) {
    // The unprofiled step: the timed steps just before (more of them than the
    // schedule's wait steps, the same step function).
    op::MeasuredStep m = profiler.window_timing(static_cast<int>(w));
    m.unprofiled_ms = pass.measured_ms;
    m.unprofiled_steps = static_cast<int>(p.options.timed_steps);
    m.unprofiled_what = "timed just before the profiler started";
    pass.timings.push_back(m);
  }
}

// One runner: warm-up, a timed window without the profiler, then the
// schedule's windows under it.
Pass run_pass(const ProfilePlan& p, const TrainConfig& cfg, models::DiffusionModel& model,
              models::DiffusionModel* ema, data::BatchLoader& loader, at::Device device, const std::string& tag) {
  Pass pass;
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);
  StepOptions so;
  so.precision = cfg.optim.precision;
  StepRunner runner(model, ema, cfg, so, device, gen);
  const std::function<void()> step = [&] {
    data::Batch batch;
    {
      PERFTRAIN_SCOPE("data_wait");
      batch = loader.next();
    }
    runner.step(batch);
  };
  const int warmup = cfg.speed.graph && device.is_cuda() ? so.warmup_steps + 2 : 2;
  for (int i = 0; i < warmup; ++i) step();
  compat::synchronize(device);
  pass.measured_ms = time_unprofiled(step, device, p.options.timed_steps);
  pass.step_mode = runner.graph_status();

  op::StepProfiler profiler(profiler_options(p, cfg, device, tag, pass.step_mode, runner.graph_active()));
  MemorySnapshot snapshot(p.options.memory_snapshot && device.is_cuda(), p.options.with_stack);
  record_windows(pass, p, profiler, device, step);
  snapshot.save(p.options.step.out, tag, pass.traces);
  if (device.is_cuda()) pass.memory = op::allocator_stats(device.index());
  runner.take_window();
  return pass;
}

// The bf16 matrix peak measured here and the SM clock it ran at: the
// denominator of the matrix-throughput finding (CUDA only).
ob::MatmulPeak measure_peak(op::RunFacts& facts, at::Device device) {
  ob::GpuSampler s(ob::nvidia_smi_id(device));
  ob::MatmulPeak peak = ob::measure_matmul_peak(device);
  const auto g = s.stop();
  facts.peak_tflops = peak.tflops;
  facts.peak_clock_mhz = g.sm_clock_mhz_median;
  return peak;
}

std::string header_markdown(const ProfilePlan& p, const data::Dataset& ds, const op::RunFacts& facts,
                            const ob::MatmulPeak& peak, at::Device device) {
  const TrainConfig& cfg = p.config;
  std::ostringstream md;
  md << "# perftrain profile: " << cfg.model.name << ", batch " << cfg.optim.batch_size << ", " << p.variant.name
     << "\n\n";
  md << "- device: " << compat::device_description(device) << "\n- precision " << cfg.optim.precision
     << "; [speed] ";
  for (const auto& [k, val] : config_fields(cfg, "speed")) md << k << " = " << val << ", ";
  md << "data.prefetch = " << cfg.data.prefetch << "\n- data: " << ds.describe() << "\n- schedule: "
     << op::to_string(p.schedule)
     << (p.options.scopes_only ? "; --profile-scopes-only: the perftrain scopes are recorded, not each ATen op" : "")
     << "\n";
  if (p.cuda)
    md << "- bf16 matmul peak measured in this run: "
       << (peak.tflops ? ob::format_number(peak.tflops, 1) + " TFLOP/s" : peak.note)
       << (facts.peak_clock_mhz ? " at " + ob::format_number(facts.peak_clock_mhz, 0) + " MHz" : std::string())
       << "\n";
  else
    md << "- on the CPU: host time only (the op table's shares are of CPU time; kernel tables and the "
          "allocator's statistics are for CUDA runs)\n";
  return md.str();
}

std::string pass_markdown(const ProfilePlan& p, const std::string& tag, const Pass& pass, op::RunFacts& facts) {
  std::ostringstream md;
  facts.gpu = pass.gpu;
  if (pass.memory.valid) {
    facts.alloc_retries = pass.memory.alloc_retries;
    facts.peak_reserved_gib = pass.memory.peak_reserved_gib;
    facts.memory_total_gib = pass.memory.total_gib;
  }
  md << "\n# " << (tag.empty() ? "The step" : "The same step, uncaptured (eager)") << ": " << pass.step_mode << "\n\n";
  md << "Measured without the profiler: " << ob::format_number(pass.measured_ms, 3) << " ms per step (median of "
     << p.options.timed_steps << ", data wait included).";
  if (p.cuda) md << " GPU while profiled: " << ob::describe(pass.gpu) << ". Allocator: " << op::describe(pass.memory) << ".";
  md << "\n\n";
  for (size_t w = 0; w < pass.traces.size(); ++w) {
    const std::string& t = pass.traces[w];
    if (t.find(".pickle") != std::string::npos) {
      md << "Memory snapshot (open at pytorch.org/memory_viz): `" << t << "`\n\n";
      continue;
    }
    op::WindowReportOptions o;
    o.group_by = p.group_by;
    o.top = static_cast<size_t>(p.options.top);
    facts.measured = w < pass.timings.size() ? pass.timings[w] : op::MeasuredStep{};
    o.title = t.substr(t.find_last_of('/') + 1) + " (`" + t + "`)";
    md << op::report_trace(t, facts, o).markdown << "\n";
  }
  return md.str();
}

}  // namespace

ProfilePlan plan_profile(const ProfileOptions& options) {
  ProfilePlan p;
  p.options = options;
  p.cuda = bench::use_cuda(options.step.device);
  p.group_by = op::parse_group_by(options.group_by);
  p.schedule = bounded_schedule(options.schedule);
  if (!(options.slow_data_ms >= 0 && options.slow_data_ms <= kMaxSlowDataMs))  // NaN too
    throw UsageError("--slow-data-ms " + std::to_string(options.slow_data_ms) + " must be a number from 0 to " +
                     std::to_string(static_cast<int64_t>(kMaxSlowDataMs)));
  const auto batches = bench::parse_batch_sizes(options.step.batch_sizes);
  if (batches.size() != 1) throw UsageError("--batch-size takes one size in perftrain profile (got '" +
                                            options.step.batch_sizes + "')");
  const auto vs = ob::parse_variants(options.variant, options.step.precision);
  if (vs.size() != 1) throw UsageError("--variant takes one variant (got '" + options.variant + "')");
  p.variant = vs[0];
  p.config = profile_config(options, p.cuda, p.variant, batches[0]);
  bench::check_batch_fits(p.config, p.cuda);
  if (options.step.out.empty()) throw UsageError("profile: no output directory");
  if (fs::exists(fs::join(options.step.out, "profile.md")))
    throw UsageError(options.step.out + " already holds a profile.md; choose another --out");
  return p;
}

void run_profile(const ProfilePlan& p) {
  const TrainConfig& cfg = p.config;
  const std::string& out = p.options.step.out;
  apply_speed_settings(cfg.speed);
  const at::Device device = p.cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (!p.cuda) op::quiet_cpu_trace_writer();  // before the loader's thread starts
  fs::create_directories(out);

  op::RunFacts facts = run_facts(cfg, cfg.optim.precision);
  const ob::MatmulPeak peak = p.cuda ? measure_peak(facts, device) : ob::MatmulPeak{};
  const std::unique_ptr<data::Dataset> ds = make_dataset(cfg, p.options.slow_data_ms);
  data::BatchLoader loader(*ds, cfg.optim.batch_size, cfg.optim.seed, {}, p.cuda, static_cast<int>(cfg.data.prefetch));
  auto built = models::build_diffusion_model_and_ema(cfg.model, cfg.optim.seed, device);

  std::string md = header_markdown(p, *ds, facts, peak, device);
  const Pass first = run_pass(p, cfg, *built.model, built.ema.get(), loader, device, "");
  md += pass_markdown(p, "", first, facts);
  const bool captured = first.step_mode.rfind("captured", 0) == 0;
  if (p.options.uncaptured && captured) {  // the same step, eager: the same kernels, split by phase
    TrainConfig eager = cfg;
    eager.speed.graph = false;
    compat::synchronize(device);
    compat::empty_cuda_cache();
    const Pass again = run_pass(p, eager, *built.model, built.ema.get(), loader, device, "uncaptured-");
    md += pass_markdown(p, "uncaptured-", again, facts);
  }
  io::write_text_atomic(fs::join(out, "profile.md"), md);
  std::cout << md << "\nwrote " << fs::join(out, "profile.md") << "\n";
}

}  // namespace perftrain::train::profile
