// perftrain verify: checks the tensors and headers of a run's checkpoints, a
// step directory or one safetensors file against the CRC32Cs recorded when
// they were written, and what ckpt/latest names; names the first corrupt
// tensor of each bad file. A torch.save file is named as one, not corrupt.
#include <CLI/CLI.hpp>

#include <iostream>

#include "base/error.h"
#include "base/fs.h"
#include "cli/command.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

namespace perftrain::cli {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The step directories of a ckpt directory (hidden leftovers of interrupted
// saves are not checkpoints: the next trainer removes them). Directories of
// other step_* names are not this program's: named, and left to be verified
// by their own path.
std::vector<std::string> step_dirs(const std::string& ckpt) {
  std::vector<std::string> out;
  for (const auto& name : fs::list_directory(ckpt)) {
    if (name.rfind("step_", 0) != 0 || !fs::is_directory(fs::join(ckpt, name))) continue;
    if (train::is_step_dir_name(name)) out.push_back(fs::join(ckpt, name));
    else std::cout << "skipped  " << fs::join(ckpt, name) << ": not a step directory name perftrain writes\n";
  }
  return out;
}

struct Tally {
  int files = 0, bad = 0, unsummed = 0, old_headers = 0, foreigners = 0;
  std::string first_bad, first_foreign;
  void fail(const std::string& what) {
    ++bad;
    if (first_bad.empty()) first_bad = what;
    std::cout << "CORRUPT  " << what << "\n";
  }
  void foreign(const std::string& what) {
    ++foreigners;
    if (first_foreign.empty()) first_foreign = what;
    std::cout << "NOT OURS " << what << "\n";
  }
};

// "<path>: a torch.save file, ..." with the way to make it one perftrain reads.
std::string torch_save_note(const std::string& path, const std::string& format) {
  return path + ": a torch.save file (" + (format == "zip" ? "zip" : "legacy pickle") +
         " format), not a perftrain safetensors checkpoint: it carries no checksums to verify; to use it, " +
         (format == "zip" ? "perftrain convert " + path + " --out " + path + ".safetensors, or " : std::string()) +
         "save it as safetensors: python -c \"import torch, safetensors.torch; p = '" + path +
         "'; safetensors.torch.save_file(torch.load(p, map_location='cpu'), p + '.safetensors')\" "
         "(a dict of state_dicts: take one, e.g. torch.load(p)['ema'])";
}

void verify_file(const std::string& path, Tally& t) {
  ++t.files;
  const std::string torch = io::torch_save_format(path);
  if (!torch.empty()) return t.foreign(torch_save_note(path, torch));
  try {
    const auto file = io::SafetensorsFile::open(path);
    const size_t n = file.verify_checksums();
    if (file.has_checksums() && file.has_header_checksum()) {
      std::cout << "ok       " << path << ": " << n << " tensors and the header match their CRC32C\n";
    } else if (file.has_checksums()) {
      ++t.old_headers;
      std::cout << "ok       " << path << ": " << n
                << " tensors match their CRC32C; no metadata checksum (written before perftrain recorded one): "
                   "its metadata is not checked\n";
    } else {
      ++t.unsummed;
      std::cout << "no sums  " << path << ": " << file.names().size()
                << " tensors, readable, but the file carries no checksums (written by another tool)\n";
    }
  } catch (const UsageError& e) {  // another pickle: what it is and how to convert it
    t.foreign(e.what());
  } catch (const std::exception& e) {
    t.fail(e.what());
  }
}

void verify_step_dir(const std::string& dir, Tally& t) {
  for (const auto& f : train::checkpoint_files()) {
    const std::string path = fs::join(dir, f);
    if (fs::is_regular_file(path)) verify_file(path, t);
    else {
      ++t.files;
      t.fail(dir + ": incomplete step directory, no " + f);
    }
  }
}

void run(const std::string& target) {
  if (!fs::exists(target)) throw UsageError("verify: " + target + " does not exist");
  Tally t;
  if (fs::is_regular_file(target)) {
    verify_file(target, t);
  } else {
    const std::string ckpt = fs::is_directory(fs::join(target, "ckpt")) ? fs::join(target, "ckpt") : target;
    const auto steps = step_dirs(ckpt);
    if (fs::exists(fs::join(ckpt, "latest"))) {  // what a resume would load
      ++t.files;
      try {
        train::latest_checkpoint_dir(ckpt);
      } catch (const std::exception& e) {
        t.fail(e.what());
      }
    }
    if (!steps.empty()) {
      for (const auto& dir : steps) verify_step_dir(dir, t);
    } else {
      for (const auto& name : fs::list_directory(target))
        if (name[0] != '.' && ends_with(name, ".safetensors")) verify_file(fs::join(target, name), t);
    }
    if (t.files == 0 && t.bad == 0)
      throw UsageError("verify: no checkpoint or .safetensors file in " + target +
                       " (expected a run directory, a ckpt or step directory, or a file)");
  }
  if (t.bad > 0)
    throw RuntimeError(std::to_string(t.bad) + " of " + std::to_string(t.files) + " checked files failed; first: " +
                       t.first_bad);
  if (t.foreigners > 0)
    throw UsageError(std::to_string(t.foreigners) + " of " + std::to_string(t.files) +
                     " checked files are not perftrain safetensors files; first: " + t.first_foreign);
  std::cout << "verified " << t.files << " file" << (t.files == 1 ? "" : "s") << ": all intact";
  if (t.unsummed > 0) std::cout << " (" << t.unsummed << " without checksums: structure checked only)";
  if (t.old_headers > 0) std::cout << " (" << t.old_headers << " with no metadata checksum: tensors checked only)";
  std::cout << "\n";
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "verify", "check checkpoints against their recorded CRC32Cs and name the first corrupt tensor (exit 1)");
  auto target = std::make_shared<std::string>();
  cmd->add_option("path", *target, "a run directory, a ckpt or step directory, or a .safetensors file")->required();
  cmd->callback([target] { run(*target); });
}

}  // namespace perftrain::cli
