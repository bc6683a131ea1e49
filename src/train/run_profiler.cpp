#include "train/run_profiler.h"

#include "base/fs.h"
#include "compat/compat.h"
#include "io/atomic_file.h"
#include "observe/bench/environment.h"
#include "observe/bench/gpu_sampler.h"
#include "observe/profile/memory.h"
#include "observe/profile/step_profiler.h"
#include "observe/profile/window_report.h"
#include "train/step_runner.h"

namespace perftrain::train {

namespace op = observe::profile;

op::RunFacts run_facts(const TrainConfig& cfg, const std::string& precision) {
  op::RunFacts f;
  f.precision = precision;
  f.graph = cfg.speed.graph;
  f.fused_kernels = cfg.speed.fused_kernels;
  f.recompute = cfg.speed.recompute;
  f.gelu_recompute = cfg.speed.gelu_recompute;
  f.prefetch = cfg.data.prefetch;
  const auto& m = cfg.model;
  f.train_flops_per_step = 3 * m.forward_flops_per_sample() * static_cast<double>(cfg.optim.step_batch());
  f.matrix_dims = {{"hidden", m.hidden},
                   {"MLP width", 4 * m.hidden},
                   {"batch x tokens", cfg.optim.batch_size * m.tokens()},
                   {"patch input (patch^2 x channels)", m.patch * m.patch * m.in_channels},
                   {"final output (patch^2 x out channels)", m.patch * m.patch * m.out_channels()}};
  if (m.heads > 0) f.head_dims = {{"head dim", m.hidden / m.heads}};
  return f;
}

RunProfiler::RunProfiler(const std::string& schedule, const TrainConfig& cfg, const std::string& precision,
                         at::Device device, const std::string& run_dir, const StepRunner& runner, std::ostream& log,
                         bool scopes_only)
    : runner_(runner), log_(log), device_(device), facts_(run_facts(cfg, precision)) {
  op::ProfilerOptions o;
  o.schedule = op::parse_schedule(schedule, "--profile");
  o.dir = fs::join(run_dir, "profile");
  o.cuda = device.is_cuda();
  o.cuda_device = device.is_cuda() ? device.index() : 0;
  o.profile_memory = true;
  o.scopes_only = scopes_only;
  o.sync = [device] { compat::synchronize(device); };
  o.metadata["model"] = cfg.model.name;
  o.metadata["batch"] = std::to_string(cfg.optim.batch_size);
  o.metadata["precision"] = precision;
  o.metadata["ops_recorded"] = scopes_only ? "false: perftrain scopes only (--profile-scopes-only)" : "true";
  profiler_ = std::make_unique<op::StepProfiler>(o);
  profiler_->on_saved = [this](const std::string& trace, int window) { saved(trace, window); };
  log_ << "profile: schedule " << op::to_string(o.schedule) << " (steps counted from this run's first), traces in "
       << o.dir << "\n";
}

RunProfiler::~RunProfiler() = default;

void RunProfiler::begin_step(int64_t index) {
  profiler_->set_metadata("step_mode", runner_.graph_status());
  profiler_->set_metadata("captured", runner_.graph_active() ? "true: each step is one CUDA graph launch" : "false");
  profiler_->begin_step(index);
  if (profiler_->recording() && !sampler_)
    sampler_ = std::make_unique<observe::bench::GpuSampler>(observe::bench::nvidia_smi_id(device_));
}

void RunProfiler::end_step(int64_t index) { profiler_->end_step(index); }

void RunProfiler::finish() { profiler_->finish(); }

void RunProfiler::saved(const std::string& trace, int window) {
  op::RunFacts facts = facts_;
  facts.measured = profiler_->window_timing(window);  // profiled steps, and the unprofiled ones just before
  if (sampler_) facts.gpu = sampler_->stop();
  sampler_.reset();
  const auto mem = op::allocator_stats(device_.is_cuda() ? device_.index() : 0);
  if (mem.valid) {
    facts.alloc_retries = mem.alloc_retries;
    facts.peak_reserved_gib = mem.peak_reserved_gib;
    facts.memory_total_gib = mem.total_gib;
  }
  op::WindowReportOptions o;
  o.title = "Window " + std::to_string(window) + " (" + runner_.graph_status() + ")";
  try {
    const auto r = op::report_trace(trace, facts, o);
    std::string md = r.markdown;
    if (mem.valid) md += "\nAllocator: " + op::describe(mem) + "\n";
    std::string base = trace.substr(0, trace.find(".json"));
    io::write_text_atomic(base + ".md", md);
    log_ << "profile: window " << window << ": " << trace << ", " << base << ".md; "
         << (r.findings.empty() ? "nothing stands out" : r.findings.front().title) << "\n";
  } catch (const std::exception& e) {  // a report that fails leaves the run and its trace alone
    log_ << "profile: window " << window << ": " << trace << " (no report: " << compat::error_message(e) << ")\n";
  }
}

}  // namespace perftrain::train
