#include "observe/profile/step_profiler.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/record_function.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "base/error.h"
#include "base/fs.h"
#include "compat/compat.h"

namespace perftrain::observe::profile {
namespace {

namespace prof = torch::profiler::impl;

prof::ProfilerConfig make_config(const ProfilerOptions& o) {
  prof::ExperimentalConfig experimental;
  experimental.disable_external_correlation = o.scopes_only;
  return prof::ProfilerConfig(prof::ProfilerState::KINETO, o.record_shapes, o.profile_memory, o.with_stack,
                              /*with_flops=*/false, /*with_modules=*/false, experimental);
}

std::set<prof::ActivityType> activities(const ProfilerOptions& o) {
  std::set<prof::ActivityType> a = {prof::ActivityType::CPU};
  if (o.cuda) a.insert(prof::ActivityType::CUDA);
  return a;
}

// The RecordFunction scopes the profiler records: all (empty), or the user
// scopes only (the perftrain scopes and ProfilerStep).
std::unordered_set<at::RecordScope> scopes(const ProfilerOptions& o) {
  if (o.scopes_only) return {at::RecordScope::USER_SCOPE};
  return {};
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw RuntimeError("cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) throw RuntimeError("cannot write " + path);
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

// Steps timed outside the trace: a pair of CUDA events on the device's
// current stream around each step (read only once the device is synced, at a
// window's start and end), or the host clock without CUDA.
struct StepProfiler::Clock {
  struct Mark {
    std::unique_ptr<at::cuda::CUDAEvent> begin, end;
    std::chrono::steady_clock::time_point host_begin, host_end;
    bool ended = false;
  };
  enum class Kind { kNone, kActive, kUnprofiled };

  Clock(bool cuda, int device) : cuda(cuda), device(device) {}

  void begin(Mark& m) const {
    if (cuda) {
      m.begin = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);  // timing on
      m.begin->record(at::cuda::getCurrentCUDAStream(device));
    } else {
      m.host_begin = std::chrono::steady_clock::now();
    }
  }
  void end(Mark& m) const {
    if (cuda) {
      m.end = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
      m.end->record(at::cuda::getCurrentCUDAStream(device));
    } else {
      m.host_end = std::chrono::steady_clock::now();
    }
    m.ended = true;
  }
  // From a's begin to b's end, in ms (waits for b's end).
  double span_ms(const Mark& a, const Mark& b) const {
    if (!cuda) return std::chrono::duration<double, std::milli>(b.host_end - a.host_begin).count();
    b.end->synchronize();
    return static_cast<double>(a.begin->elapsed_time(*b.end));
  }
  // The ended unprofiled steps' times; forgets them.
  std::vector<double> take_unprofiled() {
    std::vector<double> ms;
    for (const auto& m : unprofiled)
      if (m.ended) ms.push_back(span_ms(m, m));
    unprofiled.clear();
    return ms;
  }
  // The window's profiled steps: (per-step ms over their whole span, count); forgets them.
  std::pair<double, int> take_active() {
    const Mark* first = nullptr;
    const Mark* last = nullptr;
    int n = 0;
    for (const auto& m : active) {
      if (!m.ended) continue;
      if (first == nullptr) first = &m;
      last = &m;
      ++n;
    }
    const double ms = n > 0 ? span_ms(*first, *last) / n : 0;
    active.clear();
    return {ms, n};
  }

  bool cuda;
  int device;
  Kind current = Kind::kNone;  // what the step in progress is timed as
  std::deque<Mark> unprofiled;  // the latest steps without the profiler
  std::deque<Mark> active;      // the window's profiled steps
  std::vector<double> before_window_ms;  // the unprofiled steps before the window in progress
};

std::string finish_trace_file(const std::string& path, const std::map<std::string, std::string>& metadata,
                              bool gzip) {
  std::string text = read_all(path);
  const size_t brace = text.find('{');
  if (brace == std::string::npos) throw RuntimeError(path + " is not a JSON object");
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  text.insert(brace + 1, "\n  \"perftrain\": " + meta.dump() + ",");
  if (!gzip) {
    write_all(path, text);
    return path;
  }
  const std::string gz = path + ".gz";
  gzFile f = gzopen(gz.c_str(), "wb6");
  if (f == nullptr) throw RuntimeError("cannot write " + gz);
  const int n = gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  const int rc = gzclose(f);
  if (n != static_cast<int>(text.size()) || rc != Z_OK) throw RuntimeError("cannot write " + gz);
  std::remove(path.c_str());
  return gz;
}

void quiet_cpu_trace_writer() {
  // Not a switch of ours: Kineto reads this threshold once when it starts,
  // and its CPU-only trace writer logs a CUDA device query at ERROR (4 in
  // torch 2.11's Kineto). setenv without overwrite keeps a value the user set.
  ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
}

StepProfiler::StepProfiler(ProfilerOptions opts)
    : opts_(std::move(opts)), machine_(opts_.schedule),
      clock_(std::make_unique<Clock>(opts_.cuda, opts_.cuda_device)) {
  if (!opts_.cuda) quiet_cpu_trace_writer();
  if (!opts_.dir.empty()) fs::create_directories(opts_.dir);
}

const MeasuredStep& StepProfiler::window_timing(int window) const {
  if (window < 0 || window >= static_cast<int>(timings_.size()))
    throw RuntimeError("profiler window " + std::to_string(window) + " was not saved");
  return timings_[window];
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (...) {  // a destructor does not throw; finish() is called explicitly where errors matter
  }
}

void StepProfiler::begin_step(int64_t step) {
  apply(machine_.begin(step), step);
  if (enabled_) {
    step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (step_range_->isActive()) step_range_->before("ProfilerStep#" + std::to_string(step));
  }
  // Time it: a profiled step; or one without the profiler while a window is
  // still to come (the latest few are kept).
  clock_->current = Clock::Kind::kNone;
  if (enabled_) {
    clock_->active.emplace_back();
    clock_->begin(clock_->active.back());
    clock_->current = Clock::Kind::kActive;
  } else if (!prepared_ && !machine_.done_after(step - 1)) {
    if (clock_->unprofiled.size() >= static_cast<size_t>(kUnprofiledSteps)) clock_->unprofiled.pop_front();
    clock_->unprofiled.emplace_back();
    clock_->begin(clock_->unprofiled.back());
    clock_->current = Clock::Kind::kUnprofiled;
  }
}

void StepProfiler::end_step(int64_t step) {
  if (clock_->current == Clock::Kind::kActive && !clock_->active.empty()) clock_->end(clock_->active.back());
  if (clock_->current == Clock::Kind::kUnprofiled && !clock_->unprofiled.empty())
    clock_->end(clock_->unprofiled.back());
  clock_->current = Clock::Kind::kNone;
  close_step_range();
  apply(machine_.end(step), step);
}

void StepProfiler::finish() {
  close_step_range();
  apply(machine_.finish(), -1);
}

void StepProfiler::close_step_range() { step_range_.reset(); }

void StepProfiler::apply(const std::vector<Op>& ops, int64_t step) {
  for (Op op : ops) {
    switch (op) {
      case Op::kPrepare:
        torch::autograd::profiler::prepareProfiler(make_config(opts_), activities(opts_));
        prepared_ = true;
        break;
      case Op::kStart:
        if (!prepared_) torch::autograd::profiler::prepareProfiler(make_config(opts_), activities(opts_));
        if (opts_.sync) opts_.sync();  // the window starts from an idle device
        clock_->before_window_ms = clock_->take_unprofiled();
        torch::autograd::profiler::enableProfiler(make_config(opts_), activities(opts_), scopes(opts_));
        enabled_ = true;
        first_step_ = step;
        break;
      case Op::kStopAndSave:
      case Op::kStopAndDiscard: {
        close_step_range();
        if (!enabled_ && !prepared_) break;
        if (!enabled_) {  // a warm-up without a window: start and stop to release the profiler
          torch::autograd::profiler::enableProfiler(make_config(opts_), activities(opts_), scopes(opts_));
        }
        if (opts_.sync) opts_.sync();  // the window's GPU work is complete in its trace
        auto result = torch::autograd::profiler::disableProfiler();
        const bool save = op == Op::kStopAndSave && enabled_;
        enabled_ = prepared_ = false;
        const auto [profiled_ms, profiled_steps] = clock_->take_active();
        if (!save || !result) break;
        MeasuredStep timing;
        timing.profiled_ms = profiled_ms;
        timing.profiled_steps = profiled_steps;
        timing.unprofiled_ms = median_of(clock_->before_window_ms);
        timing.unprofiled_steps = static_cast<int>(clock_->before_window_ms.size());
        timing.unprofiled_what = "just before the window's warm-up";
        const int index = static_cast<int>(traces_.size());
        const std::string path = fs::join(opts_.dir, opts_.tag + "window-" + std::to_string(index) + ".json");
        result->save(path);
        auto meta = opts_.metadata;
        meta["window"] = std::to_string(index);
        meta["steps"] = std::to_string(first_step_) + "-" + std::to_string(step >= 0 ? step : first_step_);
        meta["schedule"] = to_string(opts_.schedule);
        traces_.push_back(finish_trace_file(path, meta, opts_.gzip));
        timings_.push_back(timing);
        if (on_saved) on_saved(traces_.back(), index);
        break;
      }
    }
  }
}

}  // namespace perftrain::observe::profile
