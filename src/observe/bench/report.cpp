#include "observe/bench/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/fs.h"
#include "io/atomic_file.h"
#include "observe/bench/torch_reference.h"

namespace perftrain::observe::bench {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written, for people reading the file

template <class T>
Json opt(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

std::string percent(const std::optional<double>& v) {
  return v ? format_number(*v * 100, 1) + "%" : std::string("n/a");
}

std::string pad(const std::string& s, size_t width, bool left = false) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (auto x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

// Markdown table cells may not hold '|' or newlines.
std::string cell(std::string s) {
  for (auto& c : s)
    if (c == '\n') c = ' ';
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The [speed] values as JSON: a TOML literal string ('whole_head') without its
// quotes; booleans, numbers and basic strings read as JSON too; anything
// else stays the TOML text.
Json speed_json(const std::vector<std::pair<std::string, std::string>>& speed) {
  Json j = Json::object();
  for (const auto& [key, v] : speed) {
    if (v.size() >= 2 && v.front() == '\'' && v.back() == '\'') j[key] = v.substr(1, v.size() - 2);
    else j[key] = Json::accept(v) ? Json::parse(v) : Json(v);
  }
  return j;
}

// "graph = true, ..., gemm_tune = 8" or "n/a".
std::string speed_text(const std::vector<std::pair<std::string, std::string>>& speed) {
  std::string out;
  for (const auto& [key, value] : speed) out += (out.empty() ? "" : ", ") + key + " = " + value;
  return out.empty() ? "n/a" : out;
}

// "; cache warm (12 graphs found, 0 compiled)" for a compiled torch mode, "" for an eager one.
std::string torch_cache_note(const TorchRow& t) {
  if (t.torch_cache.empty()) return "";
  std::string note = "; cache " + t.torch_cache;
  if (t.torch_cache_hits && t.torch_cache_misses)
    note += " (" + std::to_string(*t.torch_cache_hits) + " graphs found, " + std::to_string(*t.torch_cache_misses) +
            " compiled)";
  return note;
}

// A row of ours or of torch's as the text tables show it.
struct TextRow {
  int64_t batch = 0;
  std::string name;  // "all", "torch compile"
  std::optional<double> ms, ms_p10, ms_p90, ms_ci_low, ms_ci_high, ms_min, images_per_s, tflops, mfu, peak_gib,
      first_step_s, speedup;
  bool torch = false;  // its first step counts from its process start
  std::string note;    // how it ran: the execution note, or torch's version
  std::string error;   // empty: it ran (torch's with where its log is)
  std::string cache_note;  // torch's: how warm its compile cache was
};

// A row's name in the tables: its variant, and with data parallel how
// many processes ran it ("all, 2 ranks"; the baseline "all, 1 process").
std::string row_name(const BenchRow& x, bool data_parallel) {
  if (!data_parallel) return x.variant;
  if (!x.data_parallel) return x.variant + ", 1 process";
  return x.variant + ", " + std::to_string(x.world_size) + (x.world_size == 1 ? " rank" : " ranks");
}

// Ours (data parallel: the one-process baselines first), then torch's.
std::vector<TextRow> text_rows(const BenchReport& r) {
  std::vector<TextRow> out;
  const bool dp = r.settings.world_size > 0;
  std::vector<const BenchRow*> ours;
  for (const auto& x : r.single_process) ours.push_back(&x);
  for (const auto& x : r.rows) ours.push_back(&x);
  for (const BenchRow* p : ours) {
    const BenchRow& x = *p;
    out.push_back({x.batch, row_name(x, dp), x.ms, x.ms_p10, x.ms_p90, x.ms_ci_low, x.ms_ci_high, x.ms_min, x.images_per_s,
                   x.tflops, x.mfu, x.peak_gib, x.first_step_s, x.speedup_vs_best_torch, false, execution_note(x),
                   x.error, ""});
  }
  for (const auto& t : r.torch)
    out.push_back({t.batch, "torch " + t.mode + (t.world_size > 1 ? " DDP x" + std::to_string(t.world_size) : ""), t.ms, t.ms_p10, t.ms_p90, {}, {}, {}, t.images_per_s, t.tflops, t.mfu,
                   t.peak_gib, t.first_step_s, {}, true, "torch " + t.torch_version,
                   t.ok() ? "" : t.error + " (log: " + t.log_path + ")", torch_cache_note(t)});
  return out;
}

std::string method_text(const BenchReport& r) {
  const auto& s = r.settings;
  std::ostringstream m;
  m << "Each (batch, variant) runs in this one process, one after another, on a freshly built model, EMA and "
       "step runner. Warm-up steps: "
    << s.warmup << " (variants with the CUDA graph run at least the runner's capture warm-up plus two, so "
                   "capture is never timed), then "
    << s.steps << " timed steps" << (s.repeats > 1 ? " x " + std::to_string(s.repeats) + " repeats" : "")
    << ", each bracketed by "
    << (s.device == "cuda" ? "CUDA events on the current stream (no host sync inside the window)" : "the host clock")
    << ". ms is the median of all timed steps, with p10/p90, min and a distribution-free 95% confidence interval "
       "of the median (order statistics); run_to_run is (max - min) / median of the per-repeat medians. TFLOP/s = "
       "3 x forward FLOPs (matrix products and attention) x batch / median step time; MFU = TFLOP/s / the bf16 "
       "matrix-product rate measured in this process ("
    << (r.matmul_peak.tflops ? format_number(r.matmul_peak.tflops, 1) + " TFLOP/s, " + r.matmul_peak.note
                             : r.matmul_peak.note)
    << "). Peak memory: the most the caching allocator held allocated from building the model to the last step "
       "(in the JSON also by phase: peak_gib_warmup up to and with the graph capture, peak_gib_steady over the "
       "timed steps, held_gib_before what the process held when the row started). "
       "first_step_s: wall time from starting to build the model to the end of the first step (synchronized). "
       "Data: "
    << s.data_pool
    << " distinct synthetic batches in pinned memory, reused round-robin (no data loading is timed). The step: "
       "DDPM eps-MSE, "
    << (s.cond_dim > 0 ? "condition dropout (to length 0) " : "label dropout ") << s.class_dropout << ", " << s.optimizer << ".";
  if (s.cooldown_s > 0)
    m << " Each variant" << (s.against_torch ? " and each PyTorch run" : "") << " started after "
      << format_number(s.cooldown_s, 1) << " s with the GPU idle.";
  if (s.against_torch)
    m << " PyTorch rows: bench/" << reference_script_name(s.family)
      << " bench in its own process per mode (same model, batch, objective "
         "and optimizer step; AdamW fused, bf16 autocast), its median of "
      << s.steps << " steps after " << s.warmup
      << " warm-up by CUDA events; its first_step_s counts from its process start (Python, torch import and "
         "compilation included). torch.compile's caches (Inductor's and Triton's) live in "
      << (s.torch_cache_dir.empty() ? std::string("torch's default folder") : s.torch_cache_dir) << " ("
      << s.torch_cache_files
      << " files when the PyTorch runs began), kept between calls: a compiled mode's cache is warm when every "
         "graph it compiled was found there (its first step then mostly loads them), cold when none was.";
  if (s.world_size > 0) {
    m << " Data parallel: " << s.world_size << (s.world_size == 1 ? " rank" : " ranks")
      << " (one process per " << (s.device == "cuda" ? "GPU" : "CPU process")
      << "), the trainer's step (the step runner with the group: each rank draws its rows of the global batch's "
         "timesteps and noise, gradients averaged over the ranks by all-reduce over "
      << s.dist_backend
      << " before the update), batch per rank; the rows' times, img/s and TFLOP/s are rank 0's, per "
      << (s.device == "cuda" ? "GPU" : "process")
      << ", rank_ms every rank's median, and the total img/s is world size x batch at the slowest rank's median. "
         "Before each multi-process row rank 0 times the same variant and batch alone, without the group "
         "(single_process; the other ranks wait), so both are timed in the same invocation. Scaling efficiency = "
         "the one-process ms / the multi-process ms (total img/s over world size x one process's img/s); exposed "
         "communication = the multi-process ms - the one-process ms: the time the ranks' step takes beyond "
         "compute, i.e. the all-reduce not hidden behind backward plus whatever else differs between the two "
         "steps (the rows' graph column says whether each was captured in a CUDA graph).";
    if (s.against_torch)
      m << " PyTorch rows under python -m torch.distributed.run --nproc-per-node " << s.world_size
        << ": DistributedDataParallel (" << (s.device == "cuda" ? "NCCL" : "Gloo")
        << "; torch.compile over the wrapped model), batch per rank, rank 0's times.";
  }
  return m.str();
}

}  // namespace

std::string format_number(const std::optional<double>& v, int digits) {
  if (!v) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, *v);
  return buf;
}

std::string format_rate(const std::optional<double>& v) {
  if (!v || *v >= 10) return format_number(v, 1);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", *v);
  return buf;
}

std::string format_gib(const std::optional<double>& v) {
  return v ? format_number(v, 2) + " GiB" : std::string("n/a");
}

std::string execution_note(const BenchRow& r) {
  return r.graph_status + (r.weight_grad_stream ? "; weight gradients on a second stream" : "");
}

std::string format_row_line(const BenchRow& r, const std::string& label) {
  std::ostringstream o;
  o << "  batch " << r.batch << " " << r.variant << label << ": ";
  if (!r.ok() && !r.ms) {
    o << "error: " << r.error << "\n";
    return o.str();
  }
  o << format_number(r.ms, 2) << " ms (p10 " << format_number(r.ms_p10, 2) << ", p90 " << format_number(r.ms_p90, 2)
    << "), " << format_rate(r.tflops) << " TFLOP/s, peak " << format_gib(r.peak_gib)
    << (r.peak_gib_steady
            ? " (steady " + format_gib(r.peak_gib_steady) + ", held before " + format_gib(r.held_gib_before) + ")"
            : std::string())
    << ", first step " << format_number(r.first_step_s, 2) << " s (build " << format_number(r.build_s, 2) << " s), "
    << execution_note(r) << (r.gpu.count > 0 ? "; GPU " + describe(r.gpu) : "")
    << (r.ok() ? "" : "; error: " + r.error) << "\n";
  return o.str();
}

nlohmann::ordered_json to_json(const BenchRow& r) {
  Json j = {{"model", r.model},
                      {"batch", r.batch},
                      {"variant", r.variant},
                      {"precision", r.precision},
                      {"fused_kernels", r.fused_kernels},
                      {"fused_optimizer", r.fused_optimizer},
                      {"graph", r.graph},
                      {"recompute", r.recompute},
                      {"gelu_recompute", r.gelu_recompute},
                      {"weight_grad_stream", r.weight_grad_stream},
                      {"warmup", r.warmup},
                      {"steps", r.steps},
                      {"repeats", r.repeats},
                      {"ms", opt(r.ms)},
                      {"ms_p10", opt(r.ms_p10)},
                      {"ms_p90", opt(r.ms_p90)},
                      {"ms_min", opt(r.ms_min)},
                      {"ms_max", opt(r.ms_max)},
                      {"ms_mean", opt(r.ms_mean)},
                      {"ms_ci95_low", opt(r.ms_ci_low)},
                      {"ms_ci95_high", opt(r.ms_ci_high)},
                      {"ci_coverage", opt(r.ci_coverage)},
                      {"rel_iqr", opt(r.rel_iqr)},
                      {"run_to_run", opt(r.run_to_run)},
                      {"repeat_median_ms", r.repeat_median_ms},
                      {"step_ms", r.step_ms},
                      {"images_per_s", opt(r.images_per_s)},
                      {"tflops", opt(r.tflops)},
                      {"mfu", opt(r.mfu)},
                      {"peak_gib", opt(r.peak_gib)},
                      {"peak_gib_warmup", opt(r.peak_gib_warmup)},
                      {"peak_gib_steady", opt(r.peak_gib_steady)},
                      {"held_gib_before", opt(r.held_gib_before)},
                      {"first_step_s", opt(r.first_step_s)},
                      {"build_s", opt(r.build_s)},
                      {"loss", opt(r.loss)},
                      {"graph_status", r.graph_status},
                      {"attention", r.attention},
                      {"data_parallel", r.data_parallel},
                      {"world_size", r.world_size},
                      {"rank_ms", r.rank_ms},
                      {"images_per_s_total", opt(r.images_per_s_total)},
                      {"scaling_efficiency", opt(r.scaling_efficiency)},
                      {"exposed_comm_ms", opt(r.exposed_comm_ms)},
                      {"gpu_during_timing",
                       {{"samples", r.gpu.count},
                        {"sm_clock_mhz_median", opt(r.gpu.sm_clock_mhz_median)},
                        {"sm_clock_mhz_min", opt(r.gpu.sm_clock_mhz_min)},
                        {"sm_clock_max_mhz", opt(r.gpu.sm_clock_max_mhz)},
                        {"power_w_mean", opt(r.gpu.power_w_mean)},
                        {"power_w_max", opt(r.gpu.power_w_max)},
                        {"power_limit_w", opt(r.gpu.power_limit_w)},
                        {"at_power_limit", opt(r.gpu.at_power_limit)},
                        {"temperature_c_max", opt(r.gpu.temperature_c_max)}}},
                      {"speedup_vs_best_torch", opt(r.speedup_vs_best_torch)},
                      {"error", r.ok() ? Json(nullptr) : Json(r.error)}};
  return j;
}

nlohmann::ordered_json to_json(const TorchRow& r) {
  return {{"model", r.model},
          {"batch", r.batch},
          {"mode", r.mode},
          {"ms", opt(r.ms)},
          {"ms_p10", opt(r.ms_p10)},
          {"ms_p90", opt(r.ms_p90)},
          {"images_per_s", opt(r.images_per_s)},
          {"tflops", opt(r.tflops)},
          {"mfu", opt(r.mfu)},
          {"peak_gib", opt(r.peak_gib)},
          {"first_step_s", opt(r.first_step_s)},
          {"torch_cache", r.torch_cache.empty() ? Json(nullptr) : Json(r.torch_cache)},
          {"torch_cache_hits", opt(r.torch_cache_hits)},
          {"torch_cache_misses", opt(r.torch_cache_misses)},
          {"torch", r.torch_version},
          {"device", r.device},
          {"log", r.log_path},
          {"world_size", r.world_size},
          {"images_per_s_total", opt(r.images_per_s_total)},
          {"error", r.ok() ? Json(nullptr) : Json(r.error)}};
}

nlohmann::ordered_json to_json(const SummaryRow& r) {
  return {{"model", r.model},
          {"batch", r.batch},
          {"variant", r.variant},
          {"ms", opt(r.ms)},
          {"images_per_s", opt(r.images_per_s)},
          {"tflops", opt(r.tflops)},
          {"mfu", opt(r.mfu)},
          {"peak_gib", opt(r.peak_gib)},
          {"first_step_s", opt(r.first_step_s)},
          {"graph_status", r.graph_status},
          {"best_torch_mode", r.best_torch_mode.empty() ? Json(nullptr) : Json(r.best_torch_mode)},
          {"best_torch_ms", opt(r.best_torch_ms)},
          {"best_torch_peak_gib", opt(r.best_torch_peak_gib)},
          {"best_torch_first_step_s", opt(r.best_torch_first_step_s)},
          {"best_torch_cache", r.best_torch_cache.empty() ? Json(nullptr) : Json(r.best_torch_cache)},
          {"speedup_vs_best_torch", opt(r.speedup_vs_best_torch)},
          {"error", r.error.empty() ? Json(nullptr) : Json(r.error)}};
}

nlohmann::ordered_json to_json(const BenchReport& r) {
  Json env = Json::object();
  for (const auto& [k, v] : environment_fields(r.environment)) env[k] = v;
  const auto& s = r.settings;
  Json config = {{"model", s.model},
                           {"family", s.family},
                           {"depth", s.depth},
                           {"hidden", s.hidden},
                           {"heads", s.heads},
                           {"patch", s.patch},
                           {"image_size", s.image_size},
                           {"in_channels", s.in_channels},
                           {"num_classes", s.num_classes},
                           {"cond_tokens", s.cond_tokens},
                           {"cond_dim", s.cond_dim},
                           {"condition", s.condition},
                           {"image_tokens", s.image_tokens},
                           {"sequence_tokens", s.sequence_tokens},
                           {"learn_sigma", s.learn_sigma},
                           {"class_dropout", s.class_dropout},
                           {"objective", s.objective},
                           {"parameters", s.parameters},
                           {"train_gflop_per_image", s.train_flops_per_image / 1e9},
                           {"batches", s.batches},
                           {"variants", s.variants},
                           {"precision", s.precision},
                           {"speed", speed_json(s.speed)},
                           {"steps", s.steps},
                           {"warmup", s.warmup},
                           {"repeats", s.repeats},
                           {"device", s.device},
                           {"data_pool_batches", s.data_pool},
                           {"optimizer", s.optimizer},
                           {"cooldown_s", s.cooldown_s},
                           {"against_torch", s.against_torch},
                           {"torch_modes", s.torch_modes},
                           {"torch_python", s.torch_python},
                           {"torch_cache_dir", s.torch_cache_dir},
                           {"torch_cache_files", s.torch_cache_files},
                           {"world_size", s.world_size},
                           {"data_parallel", s.world_size > 0},
                           {"dist_backend", s.dist_backend.empty() ? Json(nullptr) : Json(s.dist_backend)}};
  Json rows = Json::array(), torch = Json::array(), summary = Json::array();
  for (const auto& x : r.rows) rows.push_back(to_json(x));
  Json single = Json::array();
  for (const auto& x : r.single_process) single.push_back(to_json(x));
  for (const auto& x : r.torch) torch.push_back(to_json(x));
  for (const auto& x : r.summary) summary.push_back(to_json(x));
  Json tuning = Json::array();
  for (const auto& t : r.gemm_tuning) {
    tuning.push_back({{"what", t.what},
                      {"candidates", t.candidates},
                      {"chosen", t.chosen},
                      {"heuristic_ms", t.heuristic_ms},
                      {"chosen_ms", t.chosen_ms}});
  }
  return {{"environment", env},
          {"matmul_peak_tflops", opt(r.matmul_peak.tflops)},
          {"matmul_peak",
           {{"tflops", opt(r.matmul_peak.tflops)},
            {"tflops_min", r.matmul_peak.tflops ? Json(r.matmul_peak.tflops_min) : Json(nullptr)},
            {"tflops_max", r.matmul_peak.tflops ? Json(r.matmul_peak.tflops_max) : Json(nullptr)},
            {"ms_median", r.matmul_peak.tflops ? Json(r.matmul_peak.ms_median) : Json(nullptr)},
            {"note", r.matmul_peak.note}}},
          {"config", config},
          {"method", method_text(r)},
          {"rows", rows},
          {"single_process", single},
          {"torch", torch},
          {"summary", summary},
          {"gemm_tuning", tuning}};
}

std::string format_summary_line(const SummaryRow& s) {
  std::ostringstream o;
  o << s.model << " batch " << s.batch << ": ";
  if (!s.error.empty()) {
    o << s.error;
  } else {
    o << s.variant << " " << format_number(s.ms, 2) << " ms, " << format_rate(s.tflops) << " TFLOP/s ("
      << percent(s.mfu) << " MFU), peak " << format_gib(s.peak_gib) << ", first step "
      << format_number(s.first_step_s, 2) << " s";
  }
  if (!s.best_torch_mode.empty()) {
    o << " | best torch " << s.best_torch_mode << " " << format_number(s.best_torch_ms, 2) << " ms";
    if (s.best_torch_first_step_s)
      o << " (first step " << format_number(s.best_torch_first_step_s, 1) << " s"
        << (s.best_torch_cache.empty() ? "" : ", cache " + s.best_torch_cache) << ")";
    if (s.speedup_vs_best_torch) o << " | speedup " << format_number(s.speedup_vs_best_torch, 2) << "x";
  }
  return o.str();
}

namespace {

// The one-process row of the same batch and variant (null: none ran).
const BenchRow* alone(const BenchReport& r, const BenchRow& x) {
  for (const auto& y : r.single_process)
    if (y.batch == x.batch && y.variant == x.variant && y.ok() && y.ms) return &y;
  return nullptr;
}

std::string rank_ms_text(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += (out.empty() ? "" : ", ") + (x >= 0 ? format_number(x, 2) : std::string("n/a"));
  return out;
}

}  // namespace

std::string data_parallel_line(const BenchReport& r, const BenchRow& x) {
  std::ostringstream o;
  o << x.model << " batch " << x.batch << " per rank, " << x.variant << ", " << x.world_size
    << (x.world_size == 1 ? " rank: " : " ranks: ");
  if (!x.ok() || !x.ms) return o.str() + "error: " + x.error;
  const BenchRow* one = alone(r, x);
  o << format_number(x.ms, 2) << " ms (alone " << (one ? format_number(one->ms, 2) + " ms" : std::string("n/a"))
    << "), " << format_number(x.images_per_s, 1) << " img/s per " << (r.settings.device == "cuda" ? "GPU" : "rank")
    << ", " << format_number(x.images_per_s_total, 1) << " img/s total, scaling efficiency "
    << percent(x.scaling_efficiency) << ", exposed communication " << format_number(x.exposed_comm_ms, 2) << " ms";
  return o.str();
}

std::string format_table(const BenchReport& r) {
  std::ostringstream o;
  const auto rows = text_rows(r);
  size_t w = 22;  // the name column, wider for "torch max-autotune-no-cudagraphs"
  for (const auto& x : rows) w = std::max(w, x.name.size() + 2);
  o << pad("batch", 6) << "  " << pad("variant", w, true) << pad("ms", 10) << pad("p10-p90", 18) << pad("img/s", 11)
    << pad("TFLOP/s", 9) << pad("MFU", 8) << pad("peak GiB", 10) << pad("1st step s", 12) << "  graph\n";
  for (const auto& x : rows) {
    o << pad(std::to_string(x.batch), 6) << "  " << pad(x.name, w, true);
    if (!x.error.empty()) {
      o << "error: " << x.error << "\n";
      continue;
    }
    o << pad(format_number(x.ms, 2), 10) << pad(format_number(x.ms_p10, 2) + "-" + format_number(x.ms_p90, 2), 18)
      << pad(format_number(x.images_per_s, 1), 11) << pad(format_rate(x.tflops), 9) << pad(percent(x.mfu), 8)
      << pad(format_number(x.peak_gib, 2), 10) << pad(format_number(x.first_step_s, 2), 12) << "  "
      << (x.torch ? "(first step from process start" + x.cache_note + ")" : x.note) << "\n";
  }
  if (r.settings.world_size > 0) {
    o << "\n";
    for (const auto& x : r.rows) o << data_parallel_line(r, x) << "\n";
  }
  if (!r.summary.empty()) o << "\n";
  for (const auto& s : r.summary) o << format_summary_line(s) << "\n";
  return o.str();
}

std::string to_markdown(const BenchReport& r) {
  const auto& s = r.settings;
  std::ostringstream m;
  m << "# perftrain bench: " << s.model << "\n\n## Environment\n\n| | |\n|---|---|\n";
  for (const auto& [k, v] : environment_fields(r.environment)) m << "| " << k << " | " << cell(v) << " |\n";
  m << "| measured bf16 matmul peak | "
    << (r.matmul_peak.tflops ? format_number(r.matmul_peak.tflops, 1) + " TFLOP/s" : std::string("n/a")) << " ("
    << cell(r.matmul_peak.note) << ") |\n";

  m << "\n## Config\n\n| | |\n|---|---|\n"
    << "| model | " << s.model << " (depth " << s.depth << ", hidden " << s.hidden << ", heads " << s.heads
    << ", patch " << s.patch << "), " << s.parameters << " trainable parameters |\n"
    << "| input | " << s.in_channels << "x" << s.image_size << "x" << s.image_size << ", " << s.num_classes
    << " classes, learn_sigma " << (s.learn_sigma ? "on" : "off") << " |\n"
    << "| tokens | " << s.image_tokens << " image, " << s.sequence_tokens << " in the sequence; condition: "
    << cell(s.condition) << " |\n"
    << "| objective | " << s.objective << ", class dropout " << s.class_dropout << " |\n"
    << "| FLOPs | " << format_number(s.train_flops_per_image / 1e9, 2) << " GFLOP per image per training step |\n"
    << "| batches | " << join(s.batches) << " |\n"
    << "| variants | " << join(s.variants) << " (mixed precision: " << s.precision << ") |\n"
    << "| speed | " << cell(speed_text(s.speed)) << " (graph, fused_kernels, fused_optimizer: each variant's own) |\n"
    << "| steps | " << s.warmup << " warm-up, " << s.steps << " timed x " << s.repeats << " repeat(s) |\n"
    << "| device | " << s.device << " |\n"
    << "| optimizer | " << cell(s.optimizer) << " |\n";
  if (s.against_torch)
    m << "| torch modes | " << join(s.torch_modes) << " (" << cell(s.torch_python) << "; cache "
      << cell(s.torch_cache_dir.empty() ? "torch's default" : s.torch_cache_dir) << ", " << s.torch_cache_files
      << " files before) |\n";

  m << "\n## Method\n\n" << method_text(r) << "\n";

  m << "\n## Results\n\n| batch | variant | ms (median) | 95% CI | p10 / p90 | min | img/s | TFLOP/s | MFU | "
       "peak GiB | first step s | vs best torch | graph |\n"
       "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& x : text_rows(r)) {
    m << "| " << x.batch << " | " << x.name << " | ";
    if (!x.error.empty()) {
      m << "error: " << cell(x.error) << " | | | | | | | | | | |\n";
      continue;
    }
    m << format_number(x.ms, 2) << " | "
      << (x.ms_ci_low ? format_number(x.ms_ci_low, 2) + "-" + format_number(x.ms_ci_high, 2) : std::string("n/a"))
      << " | " << format_number(x.ms_p10, 2) << " / " << format_number(x.ms_p90, 2) << " | "
      << format_number(x.ms_min, 2) << " | " << format_number(x.images_per_s, 1) << " | " << format_rate(x.tflops)
      << " | " << percent(x.mfu) << " | " << format_number(x.peak_gib, 2) << " | " << format_number(x.first_step_s, 2)
      << (x.torch ? " (from process start) | " : " | ")
      << (x.speedup ? format_number(x.speedup, 2) + "x" : std::string(x.torch ? "" : "n/a")) << " | "
      << cell(x.note + x.cache_note) << " |\n";
  }

  bool attention = false;
  for (const auto& x : r.rows) attention |= !x.attention.empty();
  if (attention) {
    m << "\n## Attention kernels\n\nWhat each shape's attention ran, as noted by the ops on their first call "
         "(the backward runs the family of its forward).\n\n| batch | variant | kernel: shape |\n|---:|---|---|\n";
    for (const auto& x : r.rows)
      if (!x.attention.empty()) m << "| " << x.batch << " | " << x.variant << " | " << cell(join(x.attention, "; ")) << " |\n";
  }

  if (s.world_size > 0) {
    m << "\n## Data parallel\n\n" << s.world_size << (s.world_size == 1 ? " rank" : " ranks") << " over "
      << s.dist_backend << ", batch per rank; each row against the same variant and batch timed by rank 0 alone "
      << "just before it (Method). Exposed communication = ms - ms alone.\n\n"
      << "| batch per rank | variant | ranks | ms | ms alone | img/s per " << (s.device == "cuda" ? "GPU" : "rank")
      << " | img/s total | scaling efficiency | exposed comm ms | each rank's median ms | graph |\n"
      << "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
    for (const auto& x : r.rows) {
      m << "| " << x.batch << " | " << x.variant << " | " << x.world_size << " | ";
      if (!x.ok() || !x.ms) {
        m << "error: " << cell(x.error) << " | | | | | | | |\n";
        continue;
      }
      const BenchRow* one = alone(r, x);
      m << format_number(x.ms, 2) << " | " << (one ? format_number(one->ms, 2) : std::string("n/a")) << " | "
        << format_number(x.images_per_s, 1) << " | " << format_number(x.images_per_s_total, 1) << " | "
        << percent(x.scaling_efficiency) << " | " << format_number(x.exposed_comm_ms, 2) << " | "
        << rank_ms_text(x.rank_ms) << " | " << cell(execution_note(x)) << " |\n";
    }
  }

  bool sampled = false;
  for (const auto& x : r.rows) sampled |= x.gpu.count > 0;
  if (sampled) {
    m << "\n## The GPU during the timed steps\n\nnvidia-smi every 100 ms: the SM clock (median, lowest), "
         "the power draw against the limit, the hottest sample. A clock below its maximum with most samples at "
         "the power limit means the step is power-bound there.\n\n| batch | variant | samples | SM clock MHz | "
         "power W | at the power limit | max C |\n|---:|---|---:|---:|---:|---:|---:|\n";
    for (const auto& x : r.rows) {
      if (x.gpu.count == 0) continue;
      const auto& g = x.gpu;
      m << "| " << x.batch << " | " << x.variant << " | " << g.count << " | " << format_number(g.sm_clock_mhz_median, 0)
        << " (min " << format_number(g.sm_clock_mhz_min, 0) << ", max " << format_number(g.sm_clock_max_mhz, 0)
        << ") | " << format_number(g.power_w_mean, 0) << " of " << format_number(g.power_limit_w, 0) << " | "
        << percent(g.at_power_limit) << " | " << format_number(g.temperature_c_max, 0) << " |\n";
    }
  }

  m << "\n## Summary\n\n| model | batch | ours | ms | TFLOP/s | MFU | peak GiB | first step s | best torch | "
       "torch ms | speedup |\n|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|\n";
  for (const auto& x : r.summary) {
    m << "| " << x.model << " | " << x.batch << " | " << (x.error.empty() ? x.variant : cell(x.error)) << " | "
      << format_number(x.ms, 2) << " | " << format_rate(x.tflops) << " | " << percent(x.mfu) << " | "
      << format_number(x.peak_gib, 2) << " | " << format_number(x.first_step_s, 2) << " | "
      << (x.best_torch_mode.empty() ? "n/a" : x.best_torch_mode) << " | " << format_number(x.best_torch_ms, 2)
      << " | " << (x.speedup_vs_best_torch ? format_number(x.speedup_vs_best_torch, 2) + "x" : std::string("n/a"))
      << " |\n";
  }

  if (!r.gemm_tuning.empty()) {
    size_t changed = 0;
    for (const auto& t : r.gemm_tuning) changed += t.chosen != 0;
    m << "\n## Matrix-product algorithms\n\n" << r.gemm_tuning.size()
      << " product shapes were tuned on first use (cuBLASLt's top candidates timed on the real buffers); "
      << changed << " run a faster algorithm than cuBLASLt's first pick:\n\n"
      << "| product | first pick ms | chosen ms | chosen (rank of candidates) |\n|---|---:|---:|---:|\n";
    for (const auto& t : r.gemm_tuning) {
      if (t.chosen == 0) continue;
      m << "| " << cell(t.what) << " | " << format_number(t.heuristic_ms, 4) << " | " << format_number(t.chosen_ms, 4)
        << " | " << t.chosen << " of " << t.candidates << " |\n";
    }
  }
  return m.str();
}

void write_report_files(const std::string& dir, const BenchReport& report) {
  io::write_text_atomic(fs::join(dir, "bench.json"), to_json(report).dump(2) + "\n");
  io::write_text_atomic(fs::join(dir, "bench.md"), to_markdown(report));
}

}  // namespace perftrain::observe::bench
