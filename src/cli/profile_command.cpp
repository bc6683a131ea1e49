// perftrain profile: where one training step's time goes, and why. Builds the
// step `perftrain train` runs (model, batch, variant, [speed] keys), times it
// without the profiler, then records windows of it with the step-window
// profiler (observe/profile): prints the breakdown, the top kernels or ops and
// the diagnosis, and writes the traces and profile.md into --out.
#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/fs.h"
#include "base/scope.h"
#include "cli/command.h"
#include "cli/out_dir.h"
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
#include "observe/bench/variants.h"
#include "observe/profile/memory.h"
#include "observe/profile/step_profiler.h"
#include "observe/profile/window_report.h"
#include "train/config.h"
#include "train/run_profiler.h"
#include "train/speed.h"
#include "train/step_runner.h"

namespace perftrain::cli {
namespace {

namespace ob = observe::bench;
namespace op = observe::profile;

struct ProfileArgs {
  std::string model = "DiT-S/2", variant = "all", schedule = "wait=1,warmup=1,active=3,repeat=1";
  std::string graph, fused;  // on | off over the variant
  std::string out, device = "auto", group_by = "kernel";
  int64_t batch = 32, top = 15, timed_steps = 20;
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  uint64_t seed = 0;
  bool uncaptured = false, record_shapes = false, profile_memory = false, with_stack = false, gzip = false;
  bool memory_snapshot = false, scopes_only = false;
  double slow_data_ms = 0;
  std::vector<std::string> overrides;
};

// A dataset that takes `ms` per batch: what a slow loader (decoding,
// augmentation, a network file system) looks like to the step.
class SlowDataset : public data::Dataset {
 public:
  SlowDataset(std::unique_ptr<data::Dataset> base, double ms) : base_(std::move(base)), ms_(ms) {}
  int64_t size() const override { return base_->size(); }
  std::array<int64_t, 3> sample_shape() const override { return base_->sample_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  std::string describe() const override { return base_->describe() + ", slowed to " + std::to_string(ms_) + " ms a batch"; }
  void gather(const int64_t* idx, int64_t n, float* x, int64_t* y) const override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
    base_->gather(idx, n, x, y);
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

// The bench's step (the anchors' DiT settings) with the variant, then
// --graph / --fused, then --set.
train::TrainConfig profile_config(const ProfileArgs& a, bool cuda, ob::Variant& v) {
  train::TrainConfig cfg = train::default_config(cuda);
  cfg.model = models::dit_config(a.model);
  cfg.model.image_size = a.image_size;
  cfg.model.in_channels = a.in_channels;
  cfg.model.num_classes = a.num_classes;
  cfg.model.learn_sigma = false;
  cfg.model.class_dropout = 0.1;
  cfg.data.source = "synthetic";
  cfg.data.synthetic_size = std::max<int64_t>(8 * a.batch, 256);
  cfg.diffusion.objective = "ddpm";
  cfg.optim.device = cuda ? "cuda" : "cpu";
  cfg.optim.batch_size = a.batch;
  cfg.optim.lr = 1e-4, cfg.optim.weight_decay = 0, cfg.optim.grad_clip = 0, cfg.optim.warmup_steps = 0;
  cfg.optim.seed = a.seed;
  const auto vs = ob::parse_variants(a.variant);
  if (vs.size() != 1) throw UsageError("--variant takes one variant (got '" + a.variant + "')");
  v = vs[0];
  cfg.optim.precision = v.precision;
  cfg.speed.fused_kernels = v.fused_kernels;
  cfg.speed.fused_optimizer = v.fused_optimizer;
  cfg.speed.graph = v.graph;
  if (!a.graph.empty()) cfg.speed.graph = a.graph == "on";
  if (!a.fused.empty()) cfg.speed.fused_kernels = cfg.speed.fused_optimizer = a.fused == "on";
  for (const auto& o : a.overrides) train::apply_override(cfg, o);
  if (!cuda && cfg.optim.precision != "fp32") cfg.optim.precision = "fp32";  // the CPU runs fp32 only
  cfg.validate();
  return cfg;
}

struct Pass {
  std::vector<std::string> traces;
  std::vector<op::MeasuredStep> timings;  // per window trace (traces[i], before the memory snapshot)
  double measured_ms = 0;
  std::string step_mode;
  ob::GpuSamples gpu;
  op::AllocatorStats memory;
};

// One runner: warm-up, a timed window without the profiler, then the
// schedule's windows under it.
Pass run_pass(const ProfileArgs& a, const train::TrainConfig& cfg, models::DiffusionModel& model,
              models::DiffusionModel* ema, data::BatchLoader& loader, at::Device device, const std::string& out,
              const std::string& tag) {
  Pass p;
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(cfg.optim.seed);
  train::StepOptions so;
  so.precision = cfg.optim.precision;
  train::StepRunner runner(model, ema, cfg, so, device, gen);
  auto step = [&] {
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
  {  // the step as it runs without the profiler (data wait included, as in training)
    ob::StepTimer timer(device, a.timed_steps);
    for (int64_t i = 0; i < a.timed_steps; ++i) {
      timer.begin(i);
      step();
      timer.end(i);
    }
    p.measured_ms = ob::summarize(timer.elapsed_ms()).median;
  }
  p.step_mode = runner.graph_status();

  op::ProfilerOptions po;
  po.schedule = op::parse_schedule(a.schedule, "--schedule");
  po.dir = out;
  po.tag = tag;
  po.cuda = device.is_cuda();
  po.cuda_device = device.is_cuda() ? device.index() : 0;
  po.record_shapes = a.record_shapes;
  po.profile_memory = a.profile_memory;
  po.with_stack = a.with_stack;
  po.gzip = a.gzip;
  po.scopes_only = a.scopes_only;
  po.sync = [device] { compat::synchronize(device); };
  po.metadata = {{"model", cfg.model.name},
                 {"batch", std::to_string(cfg.optim.batch_size)},
                 {"precision", cfg.optim.precision},
                 {"step_mode", p.step_mode},
                 {"ops_recorded", a.scopes_only ? "false: perftrain scopes only (--profile-scopes-only)" : "true"},
                 {"captured", runner.graph_active() ? "true: each step is one CUDA graph launch; its kernels are not "
                                                      "split by phase (perftrain profile --profile-uncaptured)"
                                                    : "false"}};
  op::StepProfiler profiler(po);
  std::string snapshot_error;
  auto guarded = [&](const std::function<void()>& f) {  // a snapshot that fails costs the snapshot, not the profile
    if (!snapshot_error.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      snapshot_error = compat::error_message(e);
    }
  };
  if (a.memory_snapshot) guarded([&] { op::start_memory_history(a.with_stack); });
  ob::GpuSampler sampler(ob::nvidia_smi_id(device));
  const int64_t limit = 10000;
  for (int64_t i = 0; i < limit; ++i) {
    profiler.begin_step(i);
    step();
    profiler.end_step(i);
    if (profiler.done_after(i)) break;
  }
  profiler.finish();
  p.gpu = sampler.stop();
  p.traces = profiler.traces();
  for (size_t w = 0; w < p.traces.size(); ++w) {
    // The unprofiled step: the timed steps just before (more of them than the
    // schedule's wait steps, the same step function).
    op::MeasuredStep m = profiler.window_timing(static_cast<int>(w));
    m.unprofiled_ms = p.measured_ms;
    m.unprofiled_steps = static_cast<int>(a.timed_steps);
    m.unprofiled_what = "timed just before the profiler started";
    p.timings.push_back(m);
  }
  if (a.memory_snapshot) {
    const std::string path = fs::join(out, tag + "memory_snapshot.pickle");
    guarded([&] {
      if (op::save_memory_snapshot(path)) p.traces.push_back(path);
    });
    guarded([&] { op::stop_memory_history(); });
    if (!snapshot_error.empty()) std::cerr << "perftrain profile: no memory snapshot: " << snapshot_error << "\n";
  }
  p.memory = op::allocator_stats(device.is_cuda() ? device.index() : 0);
  runner.take_window();
  return p;
}

void run(const ProfileArgs& a) {
  if (a.device != "auto" && a.device != "cpu" && a.device != "cuda")
    throw UsageError("--device must be auto, cpu or cuda (got '" + a.device + "')");
  if (a.device == "cuda" && !compat::cuda_available()) throw UsageError("--device cuda but no CUDA GPU is visible");
  const bool cuda = a.device == "cuda" || (a.device == "auto" && compat::cuda_available());
  const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const op::GroupBy group_by = op::parse_group_by(a.group_by);
  op::parse_schedule(a.schedule, "--schedule");  // a bad schedule is a usage error before anything runs
  ob::Variant v;
  const train::TrainConfig cfg = profile_config(a, cuda, v);
  train::apply_speed_settings(cfg.speed);
  const std::string out = a.out.empty() ? default_out_dir("profile", a.model) : a.out;
  if (fs::exists(fs::join(out, "profile.md"))) throw UsageError(out + " already holds a profile.md; choose another --out");
  fs::create_directories(out);

  op::RunFacts facts = train::run_facts(cfg, cfg.optim.precision);
  ob::MatmulPeak peak;
  if (cuda) {  // the denominator of the matrix-throughput finding, and the clock it ran at
    ob::GpuSampler s(ob::nvidia_smi_id(device));
    peak = ob::measure_matmul_peak(device);
    const auto g = s.stop();
    facts.peak_tflops = peak.tflops;
    facts.peak_clock_mhz = g.sm_clock_mhz_median;
  }

  std::unique_ptr<data::Dataset> ds = data::make_synthetic(
      cfg.data.synthetic_size, {cfg.model.in_channels, cfg.model.image_size, cfg.model.image_size},
      cfg.model.num_classes, cfg.optim.seed + 12345);
  if (a.slow_data_ms > 0) ds = std::make_unique<SlowDataset>(std::move(ds), a.slow_data_ms);
  data::BatchLoader loader(*ds, cfg.optim.batch_size, cfg.optim.seed, {}, cuda, static_cast<int>(cfg.data.prefetch));
  auto built = models::build_diffusion_model_and_ema(cfg.model, cfg.optim.seed, device);

  std::ostringstream md;
  md << "# perftrain profile: " << cfg.model.name << ", batch " << cfg.optim.batch_size << ", " << v.name << "\n\n";
  md << "- device: " << compat::device_description(device) << "\n- precision " << cfg.optim.precision
     << "; [speed] ";
  for (const auto& [k, val] : train::config_fields(cfg, "speed")) md << k << " = " << val << ", ";
  md << "data.prefetch = " << cfg.data.prefetch << "\n- data: " << ds->describe() << "\n- schedule: "
     << op::to_string(op::parse_schedule(a.schedule))
     << (a.scopes_only ? "; --profile-scopes-only: the perftrain scopes are recorded, not each ATen op" : "") << "\n";
  if (cuda)
    md << "- bf16 matmul peak measured in this run: "
       << (peak.tflops ? ob::format_number(peak.tflops, 1) + " TFLOP/s" : peak.note)
       << (facts.peak_clock_mhz ? " at " + ob::format_number(facts.peak_clock_mhz, 0) + " MHz" : std::string()) << "\n";

  std::vector<std::pair<std::string, Pass>> passes;
  passes.push_back({"", run_pass(a, cfg, *built.model, built.ema.get(), loader, device, out, "")});
  const bool captured = passes[0].second.step_mode.rfind("captured", 0) == 0;
  if (a.uncaptured && captured) {  // the same step, eager: the same kernels, split by phase
    train::TrainConfig eager = cfg;
    eager.speed.graph = false;
    compat::synchronize(device);
    compat::empty_cuda_cache();
    passes.push_back({"uncaptured-", run_pass(a, eager, *built.model, built.ema.get(), loader, device, out, "uncaptured-")});
  }
  for (auto& [tag, p] : passes) {
    facts.gpu = p.gpu;
    if (p.memory.valid) {
      facts.alloc_retries = p.memory.alloc_retries;
      facts.peak_reserved_gib = p.memory.peak_reserved_gib;
      facts.memory_total_gib = p.memory.total_gib;
    }
    md << "\n# " << (tag.empty() ? "The step" : "The same step, uncaptured (eager)") << ": " << p.step_mode << "\n\n";
    md << "Measured without the profiler: " << ob::format_number(p.measured_ms, 3) << " ms per step (median of "
       << a.timed_steps << ", data wait included). GPU while profiled: " << ob::describe(p.gpu) << ". Allocator: "
       << op::describe(p.memory) << ".\n\n";
    for (size_t w = 0; w < p.traces.size(); ++w) {
      const std::string& t = p.traces[w];
      if (t.find(".pickle") != std::string::npos) {
        md << "Memory snapshot (open at pytorch.org/memory_viz): `" << t << "`\n\n";
        continue;
      }
      op::WindowReportOptions o;
      o.group_by = group_by;
      o.top = static_cast<size_t>(a.top);
      facts.measured = w < p.timings.size() ? p.timings[w] : op::MeasuredStep{};
      o.title = t.substr(t.find_last_of('/') + 1) + " (`" + t + "`)";
      md << op::report_trace(t, facts, o).markdown << "\n";
    }
  }
  const std::string text = md.str();
  io::write_text_atomic(fs::join(out, "profile.md"), text);
  std::cout << text << "\nwrote " << fs::join(out, "profile.md") << "\n";
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "profile a training step: breakdown, top kernels or ops, diagnosis, "
                                            "Chrome/Perfetto traces (docs/guide/profiling.md)");
  auto a = std::make_shared<ProfileArgs>();
  cmd->add_option("--model", a->model, "model name (perftrain models lists them)");
  cmd->add_option("--batch", a->batch, "batch size")->check(CLI::PositiveNumber);
  cmd->add_option("--variant", a->variant, "eager-fp32 | eager-bf16 | fused | graph | all (perftrain bench's)");
  cmd->add_option("--graph", a->graph, "on | off: capture the step in a CUDA graph (over the variant)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fused", a->fused, "on | off: fused kernels and the device optimizer (over the variant)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable; last word)");
  cmd->add_option("--schedule", a->schedule,
                  "which steps to record, as torch.profiler.schedule: skip_first, wait, warmup, active, repeat");
  cmd->add_flag("--profile-uncaptured", a->uncaptured,
                "when the step is captured (one graph launch), also profile the same step eagerly: the same "
                "kernels, split into forward, backward and optimizer");
  cmd->add_option("--top", a->top, "rows of the op table")->check(CLI::PositiveNumber);
  cmd->add_option("--group-by", a->group_by, "kernel | op | scope: the op table's rows");
  cmd->add_option("--timed-steps", a->timed_steps, "steps timed without the profiler first")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--record-shapes", a->record_shapes, "record each op's input shapes and dtypes");
  cmd->add_flag("--profile-memory", a->profile_memory, "record allocator events: peak memory per phase");
  cmd->add_flag("--with-stack", a->with_stack, "record call stacks (and C++ stacks in the memory snapshot)");
  cmd->add_flag("--gzip", a->gzip, "write the traces as .json.gz");
  cmd->add_flag("--profile-scopes-only", a->scopes_only,
                "record the perftrain scopes, not each ATen op (and no per-op CUPTI correlation): less profiler "
                "cost in eager steps; --group-by op is then empty");
  cmd->add_flag("--memory-snapshot", a->memory_snapshot,
                "record allocations during the profiled steps and write memory_snapshot.pickle "
                "(pytorch.org/memory_viz opens it)");
  cmd->add_option("--slow-data-ms", a->slow_data_ms,
                  "make the synthetic loader take this long per batch (to see a data-bound step)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--image-size", a->image_size, "latent height = width")->check(CLI::PositiveNumber);
  cmd->add_option("--in-channels", a->in_channels, "latent channels")->check(CLI::PositiveNumber);
  cmd->add_option("--num-classes", a->num_classes, "classes")->check(CLI::PositiveNumber);
  cmd->add_option("--out", a->out, "output directory (default runs/profile-<model>-<date>)");
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->add_option("--seed", a->seed, "model and data seed");
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
