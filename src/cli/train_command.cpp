// perftrain train: resolve the config (cli/train_options.h) and run training,
// or with --dry-run print the resolved config and stop.
#include <CLI/CLI.hpp>
#include <toml++/toml.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <tuple>

#include "base/error.h"
#include "base/fs.h"
#include "cli/command.h"
#include "cli/launcher.h"
#include "cli/option_checks.h"
#include "cli/train_options.h"
#include "compat/compat.h"
#include "distributed/launch_env.h"
#include "observe/profile/schedule.h"
#include "train/checkpoint.h"
#include "train/signals.h"
#include "train/trainer.h"

namespace perftrain::cli {
namespace {

// A flag that sets one config key: --steps 100 is --set train.steps=100.
struct Shortcut {
  const char* flag;
  const char* key;  // section.key
  const char* help;
};
// Shortcuts under a heading of their own in --help.
struct ShortcutGroup {
  const char* heading;
  std::vector<Shortcut> shortcuts;
};
const ShortcutGroup kShortcutGroups[] = {
    {"Model and data",
     {{"--model", "model.name", "model name (perftrain models lists them)"},
      {"--data", "data.source", "data source: fashion-mnist | latents | images | synthetic"},
      {"--data-path", "data.path",
       "dataset directory, latent shard file/directory, or (images) an image folder or tar shard pattern"},
      {"--image-size", "model.image_size", "input height = width (images: the centre crop; latents: their size)"},
      {"--objective", "diffusion.objective", "ddpm | flow"}}},
    {"Training",
     {{"--device", "train.device", "auto | cpu | cuda (also picks the defaults: GPU or CPU)"},
      {"--precision", "train.precision",
       "auto | bf16 | fp16 | fp32 | fp8 (auto: bf16 on CUDA, fp32 on the CPU; fp8: the blocks' linears)"},
      {"--steps", "train.steps", "total training steps"},
      {"--batch-size", "train.batch_size", "batch size"},
      {"--lr", "train.lr", "learning rate"},
      {"--seed", "train.seed", "random seed"}}},
    {"Run directory",
     {{"--run-name", "run.name", "run directory name under --runs-dir (empty: <model>-<data>-<date>)"},
      {"--runs-dir", "run.dir", "where run directories go"}}},
};

// The defaults for a machine with and without a GPU, as TOML tables, so
// that help shows the values the config code actually starts from.
struct Defaults {
  toml::table gpu = toml::parse(train::default_config(true).to_toml());
  toml::table cpu = toml::parse(train::default_config(false).to_toml());

  // "4000 (GPU), 500 (CPU)" where they differ, else the one value.
  std::string text(const std::string& key) const {
    auto one = [&](const toml::table& t) {
      const auto v = t.at_path(key);
      if (const auto* s = v.as_string()) return s->get().empty() ? std::string("\"\"") : s->get();
      if (const auto* b = v.as_boolean()) return std::string(b->get() ? "on" : "off");
      std::ostringstream o;
      o.precision(15);  // 0.0002, not its binary expansion
      if (const auto* f = v.as_floating_point()) o << f->get();
      else o << v;
      return o.str();
    };
    const std::string g = one(gpu), c = one(cpu);
    return g == c ? g : g + " (GPU), " + c + " (CPU)";
  }
};

// Checks that a value reads as an integer or a number ("--steps: abc is not
// an integer"); no description, so --help shows the bare type name.
CLI::Validator number(bool integer) {
  return CLI::Validator(
      [integer](std::string& v) -> std::string {
        size_t used = 0;
        try {
          if (integer) std::stoll(v, &used);
          else std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        return used == v.size() && !v.empty() ? "" : v + " is not " + (integer ? "an integer" : "a number");
      },
      "");
}

std::string quoted(const std::string& s) {
  std::ostringstream o;
  o << toml::value<std::string>(s);
  return o.str();
}

// The current directory joined with a relative path; others unchanged.
std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) throw RuntimeError("cannot read the current directory");
  std::string rel = path;
  while (rel.rfind("./", 0) == 0) rel.erase(0, 2);
  return rel.empty() || rel == "." ? std::string(cwd) : fs::join(cwd, rel);
}

// absolute() of each of the "::"-separated parts (the image inputs' tar
// shard patterns may list several).
std::string absolute_paths(const std::string& paths) {
  std::string out;
  size_t start = 0;
  for (;;) {
    const size_t sep = paths.find("::", start);
    out += absolute(paths.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) return out;
    out += "::";
    start = sep + 2;
  }
}

// A resume continues in the run's own directory: a run.name or run.dir other
// than the checkpoint's would only rewrite what the run records.
void check_run_place_kept(const train::TrainConfig& cfg, const train::TrainConfig& own, const std::string& resume) {
  for (const auto& [flag, mine, theirs] : {std::tuple{"--run-name (run.name)", cfg.run.name, own.run.name},
                                           std::tuple{"--runs-dir (run.dir)", cfg.run.dir, own.run.dir}})
    if (mine != theirs)
      throw UsageError(std::string(flag) + " '" + mine + "' cannot go with --resume " + resume +
                       ": a resumed run keeps its own ('" + theirs + "'); leave it out, or start a new run");
}

void run(const TrainArgs& a, const std::string& init_from, bool save_on_signal, const std::string& profile,
         bool profile_scopes_only) {
  const auto start = std::chrono::steady_clock::now();
  train::TrainOptions opts;
  opts.resume = a.resume;
  opts.init_from = init_from;
  opts.process_start = start;
  opts.interactive = isatty(STDOUT_FILENO);
  opts.save_on_signal = save_on_signal;
  opts.profile = profile;
  opts.profile_scopes_only = profile_scopes_only;
  // Data parallel: rank 0 speaks for the run; the others print only errors.
  const bool rank0 = distributed::launch_env().rank == 0;
  std::ostream quiet(nullptr);
  auto s = train::run_training(resolve_config(a), opts, rank0 ? std::cout : quiet);
  if (!rank0) {
    if (s.stop_signal != 0) std::exit(128 + s.stop_signal);
    return;
  }
  if (s.stop_signal != 0) {  // exit as the signal asked, 128 + its number, once everything is written
    std::cout.flush();
    std::cerr << "perftrain: stopped by " << train::stop_signal_name(s.stop_signal) << " after step " << s.last_step
              << ": checkpoint " << s.last_checkpoint << ", report " << s.run_dir
              << "/report.md (continue with --resume " << s.run_dir << ")\n";
    std::exit(128 + s.stop_signal);
  }
  std::cout << "done: steps " << s.first_step << "-" << s.last_step << ", loss " << s.first_loss << " -> "
            << s.final_loss << ", " << s.steps_per_s << " steps/s\n"
            << "samples: " << s.last_samples << "\ncheckpoint: " << s.last_checkpoint
            << "\nreport: " << s.run_dir << "/report.md\n";
}

// --nproc-per-node N: checks the config once, before any rank starts; with
// N > 1 starts the ranks and exits with their code.
void launch_data_parallel(const TrainArgs& a, int nproc) {
  refuse_nproc_under_launcher();
  const train::TrainConfig cfg = resolve_config(a);  // a usage error once, before any rank starts
  if (cfg.optim.batch_size % nproc != 0)
    throw UsageError("train.batch_size = " + std::to_string(cfg.optim.batch_size) +
                     " is the global batch and must divide by --nproc-per-node " + std::to_string(nproc));
  if (nproc > 1) {
    std::cout.flush();
    std::exit(launch_ranks(nproc, arguments_without_nproc()));
  }
}

}  // namespace

void add_train_options(CLI::App* cmd, const std::shared_ptr<TrainArgs>& a) {
  const Defaults defaults;
  const char* config = "Config (resolved in this order: device defaults, --config, the flags below, --set)";
  cmd->add_option("--config", a->config_file, "TOML config file (e.g. one `perftrain config` printed)")
      ->check(CLI::ExistingFile)
      ->group(config);
  cmd->add_option_function<std::string>(
         "--resume",
         [a](const std::string& v) {
           a->resume = v;
           a->resume_given = true;
         },
         "continue a run: its directory, or a ckpt/step_* directory")
      ->group(config);
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)")->group(config);
  cmd->add_option("overrides", a->overrides, "more section.key=value overrides")->group(config);
  for (const ShortcutGroup& group : kShortcutGroups) {
    for (const Shortcut& s : group.shortcuts) {
      const std::string key = s.key;
      const bool is_text = defaults.gpu.at_path(key).is_string();
      auto* opt = cmd->add_option_function<std::string>(
          s.flag,
          [a, key, is_text](const std::string& v) {
            if (key == "train.device") a->device = v;
            a->shortcuts.push_back(key + "=" + (is_text ? quoted(v) : v));
          },
          s.help);
      opt->default_str(defaults.text(key))->group(group.heading);
      if (defaults.gpu.at_path(key).is_integer()) opt->type_name("INT")->check(number(true));
      else if (!is_text) opt->type_name("FLOAT")->check(number(false));
    }
  }
  // Speed shortcuts: on | off for one or two [speed] keys, flags for the others.
  const char* speed = "Speed (the [speed] keys, docs/guide/speed.md)";
  auto on_off = [&](const char* flag, std::vector<std::string> keys, const char* help) {
    cmd->add_option_function<std::string>(
           flag,
           [a, keys](const std::string& v) {
             for (const auto& k : keys) a->shortcuts.push_back(k + "=" + (v == "on" ? "true" : "false"));
           },
           help)
        ->check(CLI::IsMember({"on", "off"}))
        ->default_str(defaults.text(keys.front()))
        ->group(speed);
  };
  on_off("--graph", {"speed.graph"}, "on | off: capture the whole step in one CUDA graph");
  on_off("--fused", {"speed.fused_kernels", "speed.fused_optimizer"},
         "on | off: fused kernels and the device optimizer");
  cmd->add_flag_callback(
         "--recompute", [a] { a->shortcuts.push_back("speed.recompute=true"); },
         "recompute block activations in backward (less memory, ~30% slower; default off)")
      ->group(speed);
  cmd->add_flag_callback(
         "--gelu-recompute", [a] { a->shortcuts.push_back("speed.gelu_recompute=true"); },
         "keep only the MLPs' pre-activations, GELU again in backward (~15% less memory, ~3% slower; default off)")
      ->group(speed);
}

train::TrainConfig resolve_config(const TrainArgs& a) {
  train::TrainConfig cfg, own;  // own: the resumed run's, before the flags
  if (a.resume_given && a.resume.empty())
    throw UsageError("--resume is empty: give a run directory or a ckpt/step_* directory to continue");
  if (!a.resume.empty()) {
    // A resumed run keeps the config it was started with; flags may change it
    // (most often train.steps, to train longer).
    cfg = own = train::config_from_weights(train::resolve_checkpoint_dir(a.resume) + "/model.safetensors");
  } else {
    const bool cuda = a.device == "cuda" || (a.device != "cpu" && compat::cuda_available());
    cfg = train::default_config(cuda);
  }
  if (!a.config_file.empty()) train::apply_toml_file(cfg, a.config_file);
  for (const auto& o : a.shortcuts) train::apply_override(cfg, o);
  for (const auto& o : a.overrides) train::apply_override(cfg, o);
  if (!a.resume.empty()) check_run_place_kept(cfg, own, a.resume);
  if (cfg.data.source != "synthetic") cfg.data.path = absolute_paths(cfg.data.path);
  cfg.validate();
  return cfg;
}

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a DiT (default: DiT-S/2 on Fashion-MNIST on the GPU, "
                                          "DiT-T/4 on the CPU)");
  auto a = std::make_shared<TrainArgs>();
  add_train_options(cmd, a);
  auto dry_run = std::make_shared<bool>(false);
  cmd->add_flag("--dry-run", *dry_run, "print the resolved config (TOML) and stop: nothing runs or is written")
      ->group(cmd->get_option("--config")->get_group());
  auto save_on_signal = std::make_shared<std::string>("on");
  cmd->add_option("--save-on-signal", *save_on_signal,
                  "on | off: a first SIGINT/SIGTERM/SIGHUP finishes the step, saves a checkpoint and the report, and "
                  "exits 130/143/129 (a second exits at once); off: the signals end the process at once")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str()
      ->group(cmd->get_option("--config")->get_group());
  auto profile = std::make_shared<std::string>();
  cmd->add_option("--profile", *profile,
                  "profile windows of this run with a torch.profiler.schedule, e.g. wait=1,warmup=1,active=2,repeat=1 "
                  "(keys skip_first, wait, warmup, active, repeat): traces, breakdown and diagnosis in <run>/profile/ "
                  "(docs/guide/profiling.md)")
      ->default_str("\"\"")
      ->group(cmd->get_option("--config")->get_group());
  auto profile_scopes_only = std::make_shared<bool>(false);
  cmd->add_flag("--profile-scopes-only", *profile_scopes_only,
                "with --profile: record the perftrain scopes, not each ATen op (less profiler cost in eager steps)")
      ->group(cmd->get_option("--config")->get_group());
  auto init_from = std::make_shared<std::string>();
  cmd->add_option("--init-from", *init_from,
                  "start a new run (step 0, fresh optimizer) from these weights: a torch.save .pt, a safetensors "
                  "weights file, or a run directory (its latest EMA weights); a new class count re-initialises the "
                  "label table (docs/guide/training.md)")
      ->check(printable_text())
      ->group(cmd->get_option("--config")->get_group());
  auto nproc = std::make_shared<int>(0);
  cmd->add_option("--nproc-per-node", *nproc,
                  "start this many processes on this host as one data-parallel run (one per GPU; "
                  "train.batch_size is the global batch; docs/guide/multi-gpu.md); 0: this process alone")
      ->check(CLI::Range(0, 1024).description(""))
      ->default_str("0")
      ->group(cmd->get_option("--config")->get_group());
  cmd->callback([a, dry_run, init_from, save_on_signal, profile, profile_scopes_only, nproc] {
    if (!init_from->empty() && a->resume_given)
      throw UsageError("--init-from and --resume cannot go together: --resume continues a run, --init-from starts a "
                       "new one from weights");
    if (!init_from->empty() && !fs::exists(*init_from)) throw UsageError("--init-from " + *init_from + " does not exist");
    if (!profile->empty()) observe::profile::parse_schedule(*profile, "--profile");  // before anything runs
    if (*nproc > 0 && !*dry_run) launch_data_parallel(*a, *nproc);
    if (*dry_run) std::cout << resolve_config(*a).to_toml();
    else run(*a, *init_from, *save_on_signal == "on", *profile, *profile_scopes_only);
  });
}

}  // namespace perftrain::cli
