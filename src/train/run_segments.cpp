#include "train/run_segments.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "io/atomic_file.h"

namespace perftrain::train {
namespace {

nlohmann::json to_json(const RunSegment& s) {
  nlohmann::json j = {{"first_step", s.first_step},
                      {"last_step", s.last_step},
                      {"ranks", s.ranks},
                      {"batch_size", s.batch_size},
                      {"steps_per_s", s.steps_per_s},
                      {"first_step_s", s.first_step_s},
                      {"device", s.device},
                      {"step_mode", s.step_mode},
                      {"end", s.end},
                      {"last_checkpoint", s.last_checkpoint},
                      {"last_samples", s.last_samples},
                      {"nonfinite_site", s.nonfinite_site},
                      {"checkpoint_warnings", s.checkpoint_warnings}};
  if (s.peak_memory_gib) j["peak_memory_gib"] = *s.peak_memory_gib;
  return j;
}

// A line written by write_run_segments; nullopt for anything else.
std::optional<RunSegment> from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("first_step") || !j["first_step"].is_number_integer() ||
      !j.contains("last_step") || !j["last_step"].is_number_integer())
    return std::nullopt;
  RunSegment s;
  s.first_step = j["first_step"].get<int64_t>();
  s.last_step = j["last_step"].get<int64_t>();
  s.ranks = j.value("ranks", 0);
  s.batch_size = j.value("batch_size", int64_t{0});
  s.steps_per_s = j.value("steps_per_s", 0.0);
  s.first_step_s = j.value("first_step_s", 0.0);
  if (j.contains("peak_memory_gib") && j["peak_memory_gib"].is_number())
    s.peak_memory_gib = j["peak_memory_gib"].get<double>();
  s.device = j.value("device", "");
  s.step_mode = j.value("step_mode", "");
  s.end = j.value("end", "");
  s.last_checkpoint = j.value("last_checkpoint", "");
  s.last_samples = j.value("last_samples", "");
  s.nonfinite_site = j.value("nonfinite_site", "");
  if (j.contains("checkpoint_warnings") && j["checkpoint_warnings"].is_array())
    for (const auto& w : j["checkpoint_warnings"])
      if (w.is_string()) s.checkpoint_warnings.push_back(w.get<std::string>());
  return s;
}

}  // namespace

std::vector<RunSegment> read_run_segments(const std::string& path, int64_t resume_step) {
  std::vector<RunSegment> out;
  if (fs::exists(path)) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto s = from_json(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
      if (!s || s->first_step > resume_step || s->last_step < s->first_step) continue;
      if (!out.empty() && s->first_step <= out.back().last_step) continue;  // steps never repeat
      if (s->last_step > resume_step) {  // resumed from an earlier checkpoint: its later steps are gone
        s->last_step = resume_step;
        s->end = "continued from step " + std::to_string(resume_step);
        s->last_checkpoint.clear();
        s->last_samples.clear();
      }
      out.push_back(*s);
    }
  }
  const int64_t recorded_to = out.empty() ? 0 : out.back().last_step;
  if (recorded_to < resume_step) {
    RunSegment unrecorded;
    unrecorded.first_step = recorded_to + 1;
    unrecorded.last_step = resume_step;
    out.push_back(unrecorded);
  }
  return out;
}

void write_run_segments(const std::string& path, const std::vector<RunSegment>& segments) {
  std::string text;
  for (const RunSegment& s : segments) text += to_json(s).dump() + "\n";
  io::write_text_atomic(path, text);
}

}  // namespace perftrain::train
