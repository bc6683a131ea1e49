#include "train/bench/bench_driver.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "base/build_info.h"
#include "base/error.h"
#include "base/fs.h"
#include "distributed/group.h"
#include "observe/bench/environment.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/report.h"
#include "observe/bench/torch_reference.h"
#include "ops/cublaslt_workspace.h"
#include "compat/compat.h"
#include "train/memory_estimate.h"
#include "train/speed.h"

namespace perftrain::train::bench {
namespace {

namespace ob = observe::bench;

// The anchors' step with --recompute / --gelu-recompute and the --set
// overrides (e.g. speed.attention=cudnn, or a single-stream model's
// model.cond_tokens and model.cond_dim), timed without gradient monitoring
// unless --set health.monitor_every=N; each variant sets graph,
// fused_kernels and fused_optimizer itself.
TrainConfig bench_config(const BenchOptions& o, bool cuda) {
  TrainConfig cfg = anchor_config(o.step, cuda);
  cfg.speed.recompute = o.recompute;
  cfg.speed.gelu_recompute = o.gelu_recompute;
  cfg.health.monitor_every = 0;
  finish_config(cfg, o.step);
  return cfg;
}

// Each batch against the device's memory for the leanest variant (a variant
// that needs more is a row with its out-of-memory error): the batch pool is
// allocated for all of them.
void check_batches_fit(const BenchPlan& p) {
  const int shards = p.base.distributed.shard_optimizer ? p.launch.world_size : 1;
  for (int64_t b : p.batches) {
    const TrainConfig* leanest = nullptr;
    std::vector<TrainConfig> configs;
    for (const auto& v : p.variants) configs.push_back(variant_config(p.base, v, b));
    double least = 0;
    for (const auto& c : configs) {
      const double bytes = estimate_training_memory(c, p.cuda, c.optim.precision, shards).total_bytes();
      if (leanest == nullptr || bytes < least) leanest = &c, least = bytes;
    }
    check_batch_fits(*leanest, p.cuda, shards);
  }
}

ob::BenchSettings bench_settings(const BenchPlan& p) {
  const BenchOptions& o = p.options;
  const TrainConfig& base = p.base;
  const auto& m = base.model;
  ob::BenchSettings s;
  s.model = m.name;
  s.family = m.family;
  if (m.single_stream()) {
    s.cond_tokens = m.cond_tokens, s.cond_dim = m.cond_dim;
    s.condition = s.cond_dim > 0 ? "features " + std::to_string(s.cond_tokens) + "x" + std::to_string(s.cond_dim) +
                                       ", synthetic lengths in [1, " + std::to_string(s.cond_tokens) +
                                       "] (the rest masked as keys)"
                                 : std::to_string(s.cond_tokens) + " learned tokens per class";
  } else {
    s.condition = "class label (adaLN)";
  }
  s.image_tokens = m.tokens(), s.sequence_tokens = m.sequence_tokens();
  s.depth = m.depth, s.hidden = m.hidden, s.heads = m.heads, s.patch = m.patch;
  s.image_size = m.image_size, s.in_channels = m.in_channels;
  s.num_classes = m.num_classes;
  s.learn_sigma = m.learn_sigma;
  s.class_dropout = m.class_dropout;
  s.objective = base.diffusion.objective;
  s.parameters = m.parameter_count(/*trainable_only=*/true);
  s.train_flops_per_image = 3 * m.forward_flops_per_sample();
  s.batches = p.batches;
  for (const auto& v : p.variants) s.variants.push_back(v.name);
  s.precision = o.step.precision;
  s.speed = config_fields(base, "speed");
  s.steps = o.timing.steps, s.warmup = o.timing.warmup, s.repeats = o.timing.repeats;
  s.device = p.cuda ? "cuda" : "cpu";
  s.data_pool = kPoolBatches;
  char optim[160];
  char ema[32] = "no EMA";
  if (o.timing.ema) std::snprintf(ema, sizeof ema, "EMA %g", base.optim.ema_decay);
  std::snprintf(optim, sizeof optim, "AdamW lr %g, betas (%g, %g), eps %g, weight decay %g, no clipping; %s",
                base.optim.lr, base.optim.beta1, base.optim.beta2, base.optim.eps, base.optim.weight_decay, ema);
  s.optimizer = optim;
  s.cooldown_s = o.cooldown_s;
  s.against_torch = o.against_torch;
  s.torch_modes = p.torch_modes;
  s.torch_python = p.torch_python;
  s.torch_cache_dir = p.torch_cache_dir;
  if (p.data_parallel()) s.world_size = p.launch.world_size, s.dist_backend = p.cuda ? "nccl" : "gloo";
  return s;
}

// What runs where, and the matrix peak the MFU column divides by (measured here).
void print_header(const BenchPlan& p, ob::BenchReport& report, at::Device device) {
  const auto& s = report.settings;
  std::cout << "perftrain bench: " << s.model << " (" << s.parameters << " trainable parameters, "
            << ob::format_number(s.train_flops_per_image / 1e9, 2) << " GFLOP per image per step; "
            << s.image_tokens << " image tokens, condition: " << s.condition << ") on " << report.environment.device
            << ", torch " << report.environment.torch << ", commit " << report.environment.commit << "\n";
  if (p.data_parallel())
    std::cout << "data parallel: " << p.launch.world_size << (p.launch.world_size == 1 ? " rank" : " ranks")
              << " over " << s.dist_backend << " (master " << p.launch.master_addr << ":" << p.launch.master_port
              << "), batch per rank; each (batch, variant) first by rank 0 alone\n";
  report.matmul_peak = ob::measure_matmul_peak(device);
  std::cout << "bf16 matmul peak: "
            << (report.matmul_peak.tflops ? ob::format_number(report.matmul_peak.tflops, 1) + " TFLOP/s (" +
                                                report.matmul_peak.note + ")"
                                          : report.matmul_peak.note)
            << "\n"
            << std::flush;
}

// Every timed window starts from a GPU at rest: a power-bound step runs at a
// higher clock on a cooler GPU, so back to back the later runs would be timed
// on a hotter one than the earlier.
void cool_down(const BenchPlan& p, at::Device device) {
  if (p.options.cooldown_s <= 0) return;
  compat::synchronize(device);
  std::this_thread::sleep_for(std::chrono::duration<double>(p.options.cooldown_s));
}

// One (batch, variant) data parallel: rank 0 alone first (the others wait,
// their GPUs idle), then all ranks; rank 0 adds both rows to the report.
void measure_data_parallel(const BenchPlan& p, ob::BenchReport& report, const ob::Variant& v,
                           const std::vector<data::Batch>& pool, at::Device device, distributed::Group& group) {
  const auto& launch = p.launch;
  if (p.lead()) {
    cool_down(p, device);
    report.single_process.push_back(run_variant(p.options.timing, p.base, v, pool, device, report.matmul_peak.tflops));
    std::cout << ob::format_row_line(report.single_process.back(), ", 1 process") << std::flush;
  }
  group.barrier();
  cool_down(p, device);
  ob::BenchRow row = run_variant(p.options.timing, p.base, v, pool, device, report.matmul_peak.tflops, &group);
  std::vector<double> mine(static_cast<size_t>(launch.world_size), 0.0);
  mine[static_cast<size_t>(launch.rank)] = row.ms ? *row.ms : -1.0;
  row.rank_ms = group.allreduce_sum(mine);  // every rank's median (-1: none)
  if (!p.lead()) return;
  const double slowest = *std::max_element(row.rank_ms.begin(), row.rank_ms.end());
  if (row.ms && std::all_of(row.rank_ms.begin(), row.rank_ms.end(), [](double x) { return x > 0; }))
    row.images_per_s_total = static_cast<double>(launch.world_size * row.batch) / (slowest / 1e3);
  const ob::BenchRow& one = report.single_process.back();
  if (row.ms && one.ok() && one.ms) {
    row.scaling_efficiency = *one.ms / *row.ms;
    row.exposed_comm_ms = *row.ms - *one.ms;
  }
  report.rows.push_back(row);
  std::cout << ob::format_row_line(row, ", " + std::to_string(launch.world_size) +
                                            (launch.world_size == 1 ? " rank" : " ranks"))
            << "    " << ob::data_parallel_line(report, row) << "\n"
            << std::flush;
}

// Every (batch, variant), in order, into the report.
void measure_all(const BenchPlan& p, ob::BenchReport& report, at::Device device, distributed::Group* group) {
  for (int64_t b : p.batches) {
    const auto pool = make_pool(p.base, b, p.cuda);
    for (const auto& v : p.variants) {
      if (group != nullptr) {
        measure_data_parallel(p, report, v, pool, device, *group);
        continue;
      }
      cool_down(p, device);
      report.rows.push_back(run_variant(p.options.timing, p.base, v, pool, device, report.matmul_peak.tflops));
      std::cout << ob::format_row_line(report.rows.back()) << std::flush;
    }
  }
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

// A looped model's structure as bench/reference_looped.py's flags.
std::vector<std::pair<std::string, std::string>> looped_reference_flags(const models::DiTConfig& m) {
  auto number = [](double v) {
    std::ostringstream o;
    o.precision(17);
    o << v;
    return o.str();
  };
  std::vector<std::pair<std::string, std::string>> f = {
      {"--loop-block", m.loop_block},
      {"--prelude", std::to_string(m.prelude)},
      {"--coda", std::to_string(m.coda)},
      {"--shared-group", std::to_string(m.shared_group)},
      {"--loops", std::to_string(m.loops)},
      {"--reinject", m.reinject},
      {"--lora-rank", std::to_string(m.lora_rank)},
      {"--lora-alpha", number(m.lora_alpha)},
      {"--lora-targets", m.lora_targets},
      {"--route-capacity", number(m.route_capacity)},
      {"--route-capacity-end", number(m.route_capacity_end)},
      {"--router-aux-weight", number(m.router_aux_weight)}};
  if (m.lora_bias) f.emplace_back("--lora-bias", "");
  return f;
}

ob::TorchBenchRequest torch_request(const BenchPlan& p, int64_t batch, const std::string& mode) {
  const auto& m = p.base.model;
  ob::TorchBenchRequest r;
  r.model = m.name;
  r.family = m.family;
  r.cond_tokens = m.cond_tokens, r.cond_dim = m.cond_dim;
  r.depth = m.depth, r.hidden = m.hidden, r.heads = m.heads;
  r.patch = m.patch;
  r.image_size = m.image_size, r.in_channels = m.in_channels;
  r.num_classes = m.num_classes;
  r.class_dropout = m.class_dropout;
  r.batch = batch, r.steps = p.options.timing.steps, r.warmup = p.options.timing.warmup, r.mode = mode;
  r.ema_decay = p.options.timing.ema ? p.base.optim.ema_decay : 0.0;
  r.device = p.cuda ? "cuda" : "cpu";
  r.nproc = p.data_parallel() ? p.launch.world_size : 0;  // DistributedDataParallel over as many processes
  r.cache_dir = p.torch_cache_dir;
  if (m.looped()) r.model_flags = looped_reference_flags(m);
  return r;
}

// The same step in plain PyTorch, each (batch, mode) in a subprocess; a
// failure is a row.
void run_torch_reference(const BenchPlan& p, ob::BenchReport& report, at::Device device) {
  const std::string script = ob::reference_script(p.source_dir, p.base.model.family);
  report.settings.torch_cache_files = ob::count_files(p.torch_cache_dir);  // torch makes the folder when it compiles
  const std::string& out = p.options.step.out;
  const auto& launch = p.launch;
  for (int64_t b : p.batches) {
    for (const auto& mode : p.torch_modes) {
      const ob::TorchBenchRequest r = torch_request(p, b, mode);
      cool_down(p, device);
      if (p.data_parallel() && launch.local_world_size != launch.world_size) {  // several hosts: this one only
        ob::TorchRow row;
        row.model = r.model, row.batch = b, row.mode = mode, row.world_size = launch.world_size;
        row.error = "the DDP reference runs on one host; WORLD_SIZE " + std::to_string(launch.world_size) +
                    " spans several (LOCAL_WORLD_SIZE " + std::to_string(launch.local_world_size) + ")";
        report.torch.push_back(row);
        continue;
      }
      std::cout << "  torch batch " << b << " " << mode << " ..." << std::flush;
      auto row = ob::run_torch_bench(p.torch_python, script, r,
                                     fs::join(out, "torch-b" + std::to_string(b) + "-" + mode + ".log"));
      ob::fill_rates(row, report.matmul_peak.tflops);
      std::cout << " " << (row.ok() ? ob::format_number(row.ms, 2) + " ms, first step " +
                                          ob::format_number(row.first_step_s, 1) + " s" +
                                          (row.torch_cache.empty() ? "" : ", cache " + row.torch_cache)
                                    : "error: " + row.error)
                << "\n";
      report.torch.push_back(row);
    }
  }
}

// The summary, bench.json and bench.md; RuntimeError when no variant ran.
void finish_report(const BenchPlan& p, ob::BenchReport& report) {
  const std::string& out = p.options.step.out;
  report.summary = ob::summarize_batches(report.rows, report.torch);
  ob::write_report_files(out, report);
  std::cout << "\n" << ob::format_table(report) << "\nwrote " << fs::join(out, "bench.json") << " and "
            << fs::join(out, "bench.md") << "\n";
  const bool any = std::any_of(report.rows.begin(), report.rows.end(), [](const ob::BenchRow& r) { return r.ok(); });
  if (!any) throw RuntimeError("no variant ran (the errors are in " + fs::join(out, "bench.md") + ")");
}

// The ranks' group (null for one process); on the CPU the ranks of a host
// share its cores, each its share (the one-process rows too).
std::unique_ptr<distributed::Group> join_group(const BenchPlan& p, at::Device device) {
  if (!p.data_parallel()) return nullptr;
  if (!p.cuda)
    at::set_num_threads(
        std::max(1, static_cast<int>(std::thread::hardware_concurrency() / p.launch.local_world_size)));
  return std::make_unique<distributed::Group>(p.launch, device,
                                       distributed::GroupOptions{p.base.distributed.timeout_s, p.base.distributed.bucket_mb});
}

// --against-torch: the modes, the Python (--python, checked, else the
// build's) and the torch cache folder (--torch-cache, else the default).
void plan_torch_reference(BenchPlan& p) {
  const BenchOptions& o = p.options;
  p.torch_modes = ob::parse_torch_modes(
      o.torch_modes.empty() ? (p.cuda ? "eager-bf16,compile,reduce-overhead" : "eager-fp32") : o.torch_modes);
  if (!o.python.empty()) ob::check_python(o.python);
  p.torch_python = o.python.empty() ? ob::reference_python(base::build_python(), p.source_dir) : o.python;
  p.torch_cache_dir = o.torch_cache.empty() ? ob::default_torch_cache_dir() : o.torch_cache;
  if (!p.torch_cache_dir.empty()) ob::check_torch_cache_dir(p.torch_cache_dir);
}

}  // namespace

BenchPlan plan_bench(const BenchOptions& options) {
  BenchPlan p;
  p.options = options;
  p.cuda = use_cuda(options.step.device);
  // Data parallel: this process is a rank when torchrun's variables are set
  // (by torchrun, Slurm, or bench --nproc-per-node in the parent).
  p.launch = distributed::launch_env();
  p.source_dir = ob::find_source_dir(base::build_source_dir());
  p.batches = parse_batch_sizes(options.step.batch_sizes);
  const std::string variants =
      options.variants.empty() ? (p.cuda ? "eager-fp32,eager-bf16,fused,graph,all" : "eager-fp32") : options.variants;
  p.base = bench_config(options, p.cuda);
  p.variants = ob::parse_variants(variants, mixed_precision(options.step, p.base));
  p.options.step.precision = mixed_precision(options.step, p.base);
  if (options.against_torch) plan_torch_reference(p);
  check_batches_fit(p);
  if (options.step.out.empty()) throw UsageError("bench: no output directory");
  p.options.timing.profile_dir = options.step.out;
  if (p.lead() && fs::exists(fs::join(options.step.out, "bench.json")))
    throw UsageError(options.step.out + " already holds a bench.json; choose another --out");
  return p;
}

void run_bench(const BenchPlan& p) {
  apply_speed_settings(p.base.speed);
  const at::Device device =
      p.cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(p.data_parallel() ? p.launch.local_rank : 0))
             : at::Device(at::kCPU);
  std::unique_ptr<distributed::Group> group = join_group(p, device);
  if (p.lead()) fs::create_directories(p.options.step.out);

  ob::BenchReport report;
  if (p.lead()) report.environment = ob::collect_environment(device, p.source_dir, base::build_commit());
  report.settings = bench_settings(p);
  if (p.lead()) print_header(p, report, device);
  measure_all(p, report, device, group.get());
  if (group) {  // the ranks are done; rank 0 goes on alone (the torch reference needs every GPU)
    group->barrier();
    group.reset();
  }
  if (!p.lead()) return;
  report_gemm_tuning(report);
  if (p.options.against_torch) run_torch_reference(p, report, device);
  finish_report(p, report);
}

}  // namespace perftrain::train::bench
