#include "observe/profile/step_profiler.h"

#include <ATen/record_function.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "compat/compat.h"

namespace perftrain::observe::profile {
namespace {

namespace prof = torch::profiler::impl;

prof::ProfilerConfig make_config(const ProfilerOptions& o) {
  prof::ExperimentalConfig experimental;
  return prof::ProfilerConfig(prof::ProfilerState::KINETO, o.record_shapes, o.profile_memory, o.with_stack,
                              /*with_flops=*/false, /*with_modules=*/false, experimental);
}

std::set<prof::ActivityType> activities(const ProfilerOptions& o) {
  std::set<prof::ActivityType> a = {prof::ActivityType::CPU};
  if (o.cuda) a.insert(prof::ActivityType::CUDA);
  return a;
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

}  // namespace

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

StepProfiler::StepProfiler(ProfilerOptions opts) : opts_(std::move(opts)), machine_(opts_.schedule) {
  if (!opts_.dir.empty()) fs::create_directories(opts_.dir);
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
}

void StepProfiler::end_step(int64_t step) {
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
        torch::autograd::profiler::enableProfiler(make_config(opts_), activities(opts_));
        enabled_ = true;
        first_step_ = step;
        break;
      case Op::kStopAndSave:
      case Op::kStopAndDiscard: {
        close_step_range();
        if (!enabled_ && !prepared_) break;
        if (!enabled_) {  // a warm-up without a window: start and stop to release the profiler
          torch::autograd::profiler::enableProfiler(make_config(opts_), activities(opts_));
        }
        if (opts_.sync) opts_.sync();  // the window's GPU work is complete in its trace
        auto result = torch::autograd::profiler::disableProfiler();
        const bool save = op == Op::kStopAndSave && enabled_;
        enabled_ = prepared_ = false;
        if (!save || !result) break;
        const int index = static_cast<int>(traces_.size());
        const std::string path = fs::join(opts_.dir, opts_.tag + "window-" + std::to_string(index) + ".json");
        result->save(path);
        auto meta = opts_.metadata;
        meta["window"] = std::to_string(index);
        meta["steps"] = std::to_string(first_step_) + "-" + std::to_string(step >= 0 ? step : first_step_);
        meta["schedule"] = to_string(opts_.schedule);
        traces_.push_back(finish_trace_file(path, meta, opts_.gzip));
        if (on_saved) on_saved(traces_.back(), index);
        break;
      }
    }
  }
}

}  // namespace perftrain::observe::profile
