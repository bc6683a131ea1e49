#include "observe/bench/torch_reference.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/text.h"
#include "base/fs.h"
#include "observe/bench/subprocess.h"
#include "observe/bench/variants.h"

namespace perftrain::observe::bench {
namespace {

bool in_reference_registry(const std::string& model) {
  for (const char* size : {"S", "B", "L", "XL"})
    for (const char* patch : {"2", "4", "8"})
      if (model == std::string("DiT-") + size + "/" + patch) return true;
  return false;
}

std::optional<double> number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string last_nonempty_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

bool is_executable_file(const std::string& path) {
  return fs::is_regular_file(path) && ::access(path.c_str(), X_OK) == 0;
}

// A name without a slash as the shell finds it: an executable file of that
// name in a folder of PATH.
bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (is_executable_file(fs::join(dir.empty() ? "." : dir, name))) return true;
  return false;
}

}  // namespace

std::vector<std::string> torch_mode_names() {
  const std::vector<std::string> compiled = {"compile",           "reduce-overhead",
                                             "max-autotune",      "max-autotune-no-cudagraphs",
                                             "float8-tensorwise", "float8-rowwise"};
  std::vector<std::string> names = {"eager-fp32", "eager-bf16"};
  names.insert(names.end(), compiled.begin(), compiled.end());
  for (const auto& m : compiled) names.push_back(m + "-regional");
  return names;
}

std::vector<std::string> parse_torch_modes(const std::string& list) {
  const auto known = torch_mode_names();
  std::vector<std::string> out;
  for (const auto& m : split_list(list)) {
    if (std::find(known.begin(), known.end(), m) == known.end()) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw UsageError("--torch-modes: unknown torch mode '" + m + "'; known modes: " + names);
    }
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  if (out.empty()) throw UsageError("--torch-modes is empty");
  return out;
}

std::string reference_python(const std::string& build_python, const std::string& source_dir) {
  if (!build_python.empty() && is_executable_file(build_python)) return build_python;
  const std::string venv = fs::join(source_dir, ".venv/bin/python");
  if (fs::exists(venv)) return venv;
  return "python3";
}

void check_python(const std::string& python) {
  const bool found = python.find('/') != std::string::npos ? is_executable_file(python)
                                                            : !python.empty() && on_path(python);
  if (!found)
    throw UsageError("--python " + base::printable(python) + ": not an executable file (nor a program on PATH)");
}

std::string default_torch_cache_dir(const std::function<const char*(const char*)>& getenv) {
  const char* xdg = getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return fs::join(xdg, "perftrain/inductor");  // a relative one is ignored
  const char* home = getenv("HOME");
  if (home != nullptr && home[0] != '\0') return fs::join(home, ".cache/perftrain/inductor");
  return "";
}

std::string default_torch_cache_dir() {
  return default_torch_cache_dir([](const char* n) { return static_cast<const char*>(std::getenv(n)); });
}

void check_torch_cache_dir(const std::string& dir) {
  if (dir.empty()) throw UsageError("--torch-cache is empty");
  const std::string shown = base::printable(dir);
  if (shown != dir) throw UsageError("--torch-cache " + shown + ": a folder name with control characters");
  std::string existing = dir;  // the nearest folder that exists, where the rest will be made
  while (!fs::exists(existing) && fs::parent_path(existing) != existing) existing = fs::parent_path(existing);
  const std::string what = "--torch-cache " + dir + ": ";
  if (!fs::is_directory(existing))
    throw UsageError(what + (existing == dir ? "not a directory" : existing + " is not a directory"));
  if (::access(existing.c_str(), W_OK | X_OK) != 0) throw UsageError(what + existing + " is not writable");
}

int64_t count_files(const std::string& dir) {
  std::vector<std::string> names;
  try {
    names = fs::is_directory(dir) ? fs::list_directory(dir) : names;
  } catch (const RuntimeError&) {
    return 0;  // unreadable: nothing torch could use either
  }
  int64_t n = 0;
  for (const auto& name : names) {
    const std::string path = fs::join(dir, name);
    n += fs::is_directory(path) ? count_files(path) : 1;
  }
  return n;
}

std::string reference_script_name(const std::string& family) {
  if (family == "single-stream") return "reference_single_stream.py";
  if (family == "looped") return "reference_looped.py";
  return "reference_dit.py";
}

std::string reference_script(const std::string& source_dir, const std::string& family) {
  return fs::join(source_dir, "bench/" + reference_script_name(family));
}

std::string torch_bench_command(const std::string& python, const std::string& script, const TorchBenchRequest& r) {
  std::ostringstream c;
  if (r.nproc > 0 || !r.cache_dir.empty()) c << "env ";
  if (r.nproc > 0)
    c << "-u RANK -u LOCAL_RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u GROUP_RANK -u ROLE_RANK -u MASTER_ADDR "
         "-u MASTER_PORT -u TORCHELASTIC_RUN_ID ";
  if (!r.cache_dir.empty())
    c << shell_quote("TORCHINDUCTOR_CACHE_DIR=" + r.cache_dir) << " "
      << shell_quote("TRITON_CACHE_DIR=" + fs::join(r.cache_dir, "triton")) << " ";
  if (r.nproc > 0)
    c << shell_quote(python) << " -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node " << r.nproc
      << " ";
  else
    c << shell_quote(python) << " ";
  c << shell_quote(script) << " bench --model ";
  if (r.family == "single-stream") {
    // Its registry holds our SS-* names; the name is kept, the architecture explicit.
    c << shell_quote(r.model) << " --depth " << r.depth << " --hidden " << r.hidden
      << " --heads " << r.heads << " --patch " << r.patch << " --cond-tokens " << r.cond_tokens << " --cond-dim "
      << r.cond_dim;
  } else if (r.family == "looped") {
    // Its registry holds our Looped-* names; the width explicit, the loops in model_flags.
    c << shell_quote(r.model) << " --hidden " << r.hidden << " --heads " << r.heads << " --patch " << r.patch
      << " --cond-tokens " << r.cond_tokens << " --cond-dim " << r.cond_dim;
    for (const auto& [flag, value] : r.model_flags) c << " " << flag << (value.empty() ? "" : " " + shell_quote(value));
  } else if (in_reference_registry(r.model)) {
    c << shell_quote(r.model);
  } else {
    c << "DiT-S/2 --depth " << r.depth << " --hidden " << r.hidden << " --heads " << r.heads << " --patch "
      << r.patch;
  }
  c << " --image-size " << r.image_size << " --in-channels " << r.in_channels << " --num-classes " << r.num_classes
    << " --class-dropout " << r.class_dropout << " --no-learn-sigma --batch " << r.batch << " --mode "
    << shell_quote(r.mode) << " --steps " << r.steps << " --warmup " << r.warmup << " --device "
    << shell_quote(r.device) << " --json";
  if (r.ema_decay > 0) c << " --ema " << r.ema_decay;
  if (r.nproc > 0) c << " --ddp";
  return c.str();
}

TorchRow parse_torch_bench_output(const std::string& stdout_text, const TorchBenchRequest& r) {
  TorchRow row;
  row.model = r.model;
  row.batch = r.batch;
  row.mode = r.mode;
  // The JSON is the last line that looks like an object (torch.compile may
  // print warnings to stdout before it).
  std::istringstream in(stdout_text);
  std::string line, json_line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b != std::string::npos && line[b] == '{') json_line = line.substr(b);
  }
  if (json_line.empty()) {
    row.error = "no JSON result in its output";
    return row;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_line);
  } catch (const std::exception& e) {
    row.error = std::string("unreadable JSON result: ") + e.what();
    return row;
  }
  if (!j.is_object()) {
    row.error = "its JSON result is not an object";
    return row;
  }
  if (auto it = j.find("model"); it != j.end() && it->is_string()) row.model = it->get<std::string>();
  if (auto it = j.find("torch"); it != j.end() && it->is_string()) row.torch_version = it->get<std::string>();
  if (auto it = j.find("device"); it != j.end() && it->is_string()) row.device = it->get<std::string>();
  row.ms = number(j, "ms_median");
  row.ms_p10 = number(j, "ms_p10");
  row.ms_p90 = number(j, "ms_p90");
  row.images_per_s = number(j, "images_per_s");
  row.tflops = number(j, "tflops");
  row.peak_gib = number(j, "peak_gib");  // null on the CPU
  row.first_step_s = number(j, "first_step_s");
  if (auto w = number(j, "world_size")) row.world_size = static_cast<int64_t>(*w);
  if (auto it = j.find("torch_cache"); it != j.end() && it->is_string()) row.torch_cache = it->get<std::string>();
  if (auto h = number(j, "torch_cache_hits")) row.torch_cache_hits = static_cast<int64_t>(*h);
  if (auto m = number(j, "torch_cache_misses")) row.torch_cache_misses = static_cast<int64_t>(*m);
  row.images_per_s_total = number(j, "images_per_s_total");
  if (!row.ms) row.error = "its JSON result has no ms_median";
  return row;
}

TorchRow run_torch_bench(const std::string& python, const std::string& script, const TorchBenchRequest& r,
                         const std::string& log_path) {
  const std::string cmd = torch_bench_command(python, script, r);
  {
    std::ofstream log(log_path, std::ios::trunc);  // the command first, then its stderr
    log << "$ " << cmd << "\n";
  }
  const auto out = run_command_capture(cmd, log_path);
  TorchRow row;
  if (out.ok) {
    row = parse_torch_bench_output(out.out, r);
  } else {
    row.model = r.model;
    row.batch = r.batch;
    row.mode = r.mode;
    row.world_size = std::max<int64_t>(1, r.nproc);
    std::ifstream log(log_path);
    std::stringstream all;
    all << log.rdbuf();
    const std::string last = last_nonempty_line(all.str());
    row.error = (out.exit_code < 0 ? std::string("did not run") : "exit status " + std::to_string(out.exit_code)) +
                (last.empty() || last.rfind("$ ", 0) == 0 ? "" : ": " + last);
  }
  row.log_path = log_path;
  return row;
}

}  // namespace perftrain::observe::bench
