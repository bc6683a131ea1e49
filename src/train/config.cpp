#include "train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <stdexcept>
#include <sstream>
#include <variant>

#include "base/error.h"
#include "base/text.h"
#include "data/dataset.h"
#include "models/fp8_states.h"
#include "ops/attention_mode.h"
#include "train/memory_estimate.h"

namespace perftrain::train {
namespace {

using Target = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*>;
struct Key {
  const char* section;
  const char* key;
  Target target;
  // A string key's allowed values (empty: any); an integer key's range.
  std::vector<const char*> choices = {};
  int64_t min = std::numeric_limits<int64_t>::min(), max = std::numeric_limits<int64_t>::max();
};

// Names kept elsewhere (static storage) as a key's choices.
std::vector<const char*> c_strings(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  for (const auto& n : names) out.push_back(n.c_str());
  return out;
}

// Every configurable key, in the order config.toml lists them.
std::vector<Key> keys(TrainConfig& c) {
  auto& m = c.model;
  return {
      {"model", "name", &m.name},
      {"model", "family", &m.family, {"dit", "single-stream", "looped"}},
      {"model", "depth", &m.depth},
      {"model", "hidden", &m.hidden},
      {"model", "heads", &m.heads},
      {"model", "patch", &m.patch},
      {"model", "mlp_ratio", &m.mlp_ratio},
      {"model", "image_size", &m.image_size},
      {"model", "in_channels", &m.in_channels},
      {"model", "num_classes", &m.num_classes},
      {"model", "class_dropout", &m.class_dropout},
      {"model", "learn_sigma", &m.learn_sigma},
      {"model", "cond_tokens", &m.cond_tokens, {}, 1, 4096},
      {"model", "cond_dim", &m.cond_dim, {}, 0, 65536},
      {"model", "loop_block", &m.loop_block, {"dit", "single_stream"}},
      {"model", "prelude", &m.prelude, {}, 0, 1024},
      {"model", "coda", &m.coda, {}, 0, 1024},
      {"model", "shared_group", &m.shared_group, {}, 1, 1024},
      {"model", "loops", &m.loops, {}, 1, 1024},
      {"model", "reinject", &m.reinject, {"none", "add", "concat"}},
      {"model", "lora_rank", &m.lora_rank, {}, 0, 65536},
      {"model", "lora_alpha", &m.lora_alpha},
      {"model", "lora_targets", &m.lora_targets},
      {"model", "lora_bias", &m.lora_bias},
      {"model", "route_capacity", &m.route_capacity},
      {"model", "route_capacity_end", &m.route_capacity_end},
      {"model", "router_aux_weight", &m.router_aux_weight},
      {"data", "source", &c.data.source, {"fashion-mnist", "latents", "images", "synthetic"}},
      {"data", "path", &c.data.path},
      {"data", "synthetic_size", &c.data.synthetic_size, {}, 1, data::kMaxSyntheticSize},
      {"data", "prefetch", &c.data.prefetch},
      {"data", "workers", &c.data.workers, {}, 1, 256},
      {"data", "flip", &c.data.flip},
      {"train", "steps", &c.optim.steps},
      {"train", "batch_size", &c.optim.batch_size},
      {"train", "accumulate", &c.optim.accumulate, {}, 1, kMaxAccumulate},
      {"train", "lr", &c.optim.lr},
      {"train", "weight_decay", &c.optim.weight_decay},
      {"train", "decay_all", &c.optim.decay_all},
      {"train", "beta1", &c.optim.beta1},
      {"train", "beta2", &c.optim.beta2},
      {"train", "eps", &c.optim.eps},
      {"train", "warmup_steps", &c.optim.warmup_steps},
      {"train", "lr_schedule", &c.optim.lr_schedule, {"constant", "cosine", "linear", "wsd"}},
      {"train", "lr_min", &c.optim.lr_min},
      {"train", "decay_fraction", &c.optim.decay_fraction},
      {"train", "grad_clip", &c.optim.grad_clip},
      {"train", "ema_decay", &c.optim.ema_decay},
      {"train", "ema_warmup", &c.optim.ema_warmup},
      {"train", "ema_start", &c.optim.ema_start, {}, 0, std::numeric_limits<int64_t>::max()},
      {"train", "seed", &c.optim.seed},
      {"train", "device", &c.optim.device, {"auto", "cpu", "cuda"}},
      {"train", "precision", &c.optim.precision, {"auto", "bf16", "fp16", "fp32", "fp8"}},
      {"train", "fp8_amax_history", &c.optim.fp8_amax_history, {}, 1, kernels::kFp8MaxHistory},
      {"train", "fp8_margin", &c.optim.fp8_margin, {}, 0, models::kFp8MaxMargin},
      {"diffusion", "objective", &c.diffusion.objective, {"ddpm", "flow"}},
      {"diffusion", "time_sampling", &c.diffusion.time_sampling, {"uniform", "logit-normal"}},
      {"diffusion", "sample_steps", &c.diffusion.sample_steps},
      {"diffusion", "cfg_scale", &c.diffusion.cfg_scale},
      {"log", "every", &c.log.every},
      {"log", "sample_every", &c.log.sample_every},
      {"log", "checkpoint_every", &c.log.checkpoint_every},
      {"log", "keep_checkpoints", &c.log.keep_checkpoints},
      {"log", "sample_per_class", &c.log.sample_per_class},
      {"log", "sample_classes", &c.log.sample_classes},
      {"log", "tensorboard", &c.log.tensorboard},
      {"log", "histogram_every", &c.log.histogram_every},
      {"log", "mlflow", &c.log.mlflow},
      {"log", "mlflow_experiment", &c.log.mlflow_experiment},
      {"log", "wandb", &c.log.wandb, {"off", "offline", "online"}},
      {"log", "wandb_project", &c.log.wandb_project},
      {"run", "dir", &c.run.dir},
      {"run", "name", &c.run.name},
      {"speed", "graph", &c.speed.graph},
      {"speed", "fused_kernels", &c.speed.fused_kernels},
      {"speed", "fused_optimizer", &c.speed.fused_optimizer},
      {"speed", "recompute", &c.speed.recompute},
      {"speed", "gelu_recompute", &c.speed.gelu_recompute},
      {"speed", "attention", &c.speed.attention, c_strings(ops::attention_modes())},
      {"speed", "weight_grad_stream", &c.speed.weight_grad_stream, {"auto", "on", "off"}},
      {"speed", "gemm_tune", &c.speed.gemm_tune, {}, 0, 64},
      {"health", "monitor_every", &c.health.monitor_every, {}, 0, 1000000000},
      {"health", "grad_histograms", &c.health.grad_histograms},
      {"health", "nan_policy", &c.health.nan_policy, {"stop", "skip"}},
      {"health", "anomaly_mode", &c.health.anomaly_mode},
      {"health", "vanish_norm", &c.health.vanish_norm},
      {"health", "patience", &c.health.patience, {}, 1, 1000000},
      {"health", "explode_factor", &c.health.explode_factor},
      {"health", "median_window", &c.health.median_window, {}, 1, 100000},
      {"distributed", "timeout_s", &c.distributed.timeout_s},
      {"distributed", "bucket_mb", &c.distributed.bucket_mb},
      {"distributed", "shard_optimizer", &c.distributed.shard_optimizer},
      {"eval", "every", &c.eval.every, {}, 0, 1000000000},
      {"eval", "samples", &c.eval.samples, {}, 4, 1000000},
      {"eval", "features", &c.eval.features},
      {"eval", "inception", &c.eval.inception},
      {"eval", "ref_stats", &c.eval.ref_stats},
      {"eval", "vae", &c.eval.vae},
  };
}

// "a, b or c"
std::string one_of(const std::vector<const char*>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i)
    out += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(choices[i]);
  return out;
}

// Whether a key's value is one it allows; else the UsageError's text.
std::string check_rule(const Key& k) {
  const std::string full = std::string(k.section) + "." + k.key;
  if (auto* const* s = std::get_if<std::string*>(&k.target); s && !k.choices.empty()) {
    for (const char* c : k.choices)
      if (**s == c) return "";
    return full + " '" + base::printable(**s) + "' (expected " + one_of(k.choices) + ")";
  }
  if (auto* const* i = std::get_if<int64_t*>(&k.target); i && (**i < k.min || **i > k.max))
    return full + " " + std::to_string(**i) + " (expected an integer from " + std::to_string(k.min) + " to " +
           std::to_string(k.max) + ")";
  // Every number is finite: inf and nan pass comparisons like lr > 0.
  if (auto* const* d = std::get_if<double*>(&k.target); d && !std::isfinite(**d))
    return full + " " + (std::isnan(**d) ? "nan" : **d > 0 ? "inf" : "-inf") + " (expected a finite number)";
  return "";
}

std::string type_name(const Target& t) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return "a boolean";
        else if constexpr (std::is_same_v<T, std::string>) return "a string";
        else if constexpr (std::is_same_v<T, double>) return "a number";
        else return "an integer";
      },
      t);
}

// Sets one key from a TOML value; false when the value has the wrong type.
bool assign(const Target& t, const toml::node& v) {
  return std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) return false;
          *p = v.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) return false;
          *p = v.as_string()->get();
        } else if constexpr (std::is_same_v<T, double>) {
          if (v.is_integer()) *p = static_cast<double>(v.as_integer()->get());
          else if (v.is_floating_point()) *p = v.as_floating_point()->get();
          else return false;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (!v.is_integer() || v.as_integer()->get() < 0) return false;
          *p = static_cast<uint64_t>(v.as_integer()->get());
        } else {
          if (!v.is_integer()) return false;
          *p = v.as_integer()->get();
        }
        return true;
      },
      t);
}

// A looped model's depth counts its block applications: setting the loop
// structure (or the family) sets it.
void keep_looped_depth(models::DiTConfig& m, const std::string& key) {
  static const char* const kStructure[] = {"model.family", "model.prelude", "model.coda", "model.shared_group",
                                           "model.loops"};
  if (m.looped() && std::find(std::begin(kStructure), std::end(kStructure), key) != std::end(kStructure))
    m.depth = m.looped_depth();
}

void set_key(TrainConfig& cfg, const std::string& section, const std::string& key,
             const toml::node& value, const std::string& origin_text) {
  const std::string full = base::printable(section + "." + key), origin = base::printable(origin_text);
  // Naming a model sets its architecture; explicit depth/hidden/... may follow.
  if (full == "model.name") {
    if (!value.is_string()) throw UsageError(origin + ": model.name must be a string");
    auto arch = models::model_config(value.as_string()->get());
    auto& m = cfg.model;
    m.name = arch.name, m.family = arch.family;
    m.depth = arch.depth, m.hidden = arch.hidden, m.heads = arch.heads, m.patch = arch.patch;
    m.prelude = arch.prelude, m.coda = arch.coda, m.shared_group = arch.shared_group, m.loops = arch.loops;
    return;
  }
  for (const Key& k : keys(cfg)) {
    if (section == k.section && key == k.key) {
      if (!assign(k.target, value))
        throw UsageError(origin + ": " + full + " must be " + type_name(k.target) +
                         (k.choices.empty() ? "" : " (" + one_of(k.choices) + ")"));
      keep_looped_depth(cfg.model, full);
      return;
    }
  }
  std::ostringstream known, sections;
  std::string last;
  for (const Key& k : keys(cfg)) {
    if (section == k.section) known << " " << k.key;
    if (last != k.section) sections << " [" << k.section << "]";
    last = k.section;
  }
  if (section == "dist")  // the section's name until the data-parallel code became src/distributed/
    throw UsageError(origin + ": the [dist] section is now [distributed] (" + full + " -> distributed." +
                     full.substr(5) + ")");
  if (known.str().empty())
    throw UsageError(origin + ": unknown section [" + base::printable(section) + "]; known sections:" +
                     sections.str());
  throw UsageError(origin + ": unknown key " + full + "; known keys in [" + base::printable(section) + "]:" +
                   known.str());
}

void require(bool ok, const std::string& what) {
  if (!ok) throw UsageError("invalid config: " + what);
}

std::string quoted(const std::string& s) {
  std::ostringstream o;
  o << toml::value<std::string>(s);
  return o.str();
}

// A key's value as config.toml writes it: one that reads back exactly.
std::string value_text(const Target& target) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return quoted(*p);
        else if constexpr (std::is_same_v<T, double>) {
          std::string s;
          for (int digits = 15; digits <= 17; ++digits) {  // the shortest text that reads back exactly
            std::ostringstream v;
            v.precision(digits);
            v << *p;
            s = v.str();
            if (std::stod(s) == *p) break;
          }
          if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
          return s;
        } else return std::to_string(*p);
      },
      target);
}

}  // namespace

TrainConfig default_config(bool cuda) {
  TrainConfig c;
  c.model = models::dit_config(cuda ? "DiT-S/2" : "DiT-T/4");
  c.model.image_size = 32;
  c.model.in_channels = 1;
  c.model.num_classes = 10;
  c.diffusion.cfg_scale = 2.0;
  if (cuda) {
    c.optim.steps = 4000;
    c.optim.batch_size = 256;
    c.optim.lr = 2e-4;
  } else {
    // Minutes on two cores. Rectified flow rather than DDPM: after a few
    // hundred steps its Euler samples are recognisable shapes where DDIM's
    // are still noise (both measured: docs/guide/quickstart.md).
    c.model.learn_sigma = false;
    c.diffusion.objective = "flow";
    c.optim.steps = 500;
    c.optim.batch_size = 32;
    c.optim.lr = 1e-3;
    c.optim.warmup_steps = 50;
    c.log.every = 50;
    c.log.sample_every = 0;
    c.log.checkpoint_every = 0;
    c.diffusion.sample_steps = 25;
    c.log.sample_per_class = 4;
  }
  return c;
}

void apply_toml(TrainConfig& cfg, const std::string& toml_text, const std::string& origin) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << origin << ":" << e.source().begin.line << ":" << e.source().begin.column;
    throw UsageError(base::printable(where.str() + ": " + std::string(e.description())));
  }
  for (const auto& [section, node] : doc) {
    const std::string sec(section.str());
    const toml::table* table = node.as_table();
    if (!table) throw UsageError(base::printable(origin + ": '" + sec + "' must be a [section]"));
    // model.name first: it resets the architecture that other keys may refine.
    if (const toml::node* name = table->get("name"); name && sec == "model")
      set_key(cfg, sec, "name", *name, origin);
    for (const auto& [key, value] : *table) {
      if (sec == "model" && key.str() == "name") continue;
      set_key(cfg, sec, std::string(key.str()), value, origin);
    }
  }
}

void apply_toml_file(TrainConfig& cfg, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read config file " + path);
  std::stringstream text;
  text << in.rdbuf();
  apply_toml(cfg, text.str(), path);
}

void apply_override(TrainConfig& cfg, const std::string& assignment) {
  const std::string origin = "override '" + assignment + "'";
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw UsageError(base::printable(origin) + " is not of the form section.key=value");
  // One key, one value: a newline would start more TOML (another key, a
  // [section]) that the override would set behind the user's back.
  if (assignment.find_first_of("\r\n") != std::string::npos)
    throw UsageError(base::printable(origin) + ": a value is one line; set each key with its own --set");
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: take it as a string
  }
  if (parsed.size() != 1 || !parsed.contains("v"))
    throw UsageError(base::printable(origin) + ": the value must be one TOML value");
  set_key(cfg, section, key, *parsed.get("v"), origin);
}

namespace {
// The keys with a list of values or a range, of one section or all ("").
void check_rules(const TrainConfig& cfg, const std::string& section) {
  TrainConfig copy = cfg;
  for (const Key& k : keys(copy)) {
    if (!section.empty() && section != k.section) continue;
    const std::string why = check_rule(k);
    require(why.empty(), why);
  }
}
}  // namespace

// What an evaluation inside training needs; each path printable (they are echoed).
static void validate_eval(const EvalConfig& e) {
  using Path = std::pair<const char*, const std::string*>;
  for (const auto& [key, value] :
       {Path{"eval.features", &e.features}, Path{"eval.inception", &e.inception}, Path{"eval.ref_stats", &e.ref_stats},
        Path{"eval.vae", &e.vae}})
    require(base::is_printable(*value), std::string(key) + " '" + base::printable(*value) +
                                            "' holds control characters or bytes that are not UTF-8");
  require(e.inception.empty() == e.ref_stats.empty(),
          "eval.inception and eval.ref_stats go together (FID needs the network and the reference statistics)");
  require(e.every == 0 || !e.features.empty() || !e.inception.empty(),
          "eval.every > 0 needs eval.features (perftrain eval --train-features) or eval.inception with "
          "eval.ref_stats");
}

// The loggers' names and paths: printable (they are echoed), and what
// MLflow and W&B accept.
static void validate_loggers(const LogConfig& l) {
  using Text = std::pair<const char*, const std::string*>;
  for (const auto& [key, value] : {Text{"log.mlflow", &l.mlflow}, Text{"log.mlflow_experiment", &l.mlflow_experiment},
                                   Text{"log.wandb_project", &l.wandb_project}})
    require(base::is_printable(*value), std::string(key) + " '" + base::printable(*value) +
                                            "' holds control characters or bytes that are not UTF-8");
  require(!l.mlflow_experiment.empty() && l.mlflow_experiment.size() <= 500,
          "log.mlflow_experiment must be a name of 1 to 500 characters");
  require(!l.wandb_project.empty() && l.wandb_project.size() <= 128 &&
              l.wandb_project.find_first_of("/\\#?%:") == std::string::npos,
          "log.wandb_project '" + base::printable(l.wandb_project) +
              "' must be 1 to 128 characters without / \\ # ? % : (W&B's rule for project names)");
}

void validate_speed(const SpeedConfig& speed) {
  TrainConfig c;
  c.speed = speed;
  check_rules(c, "speed");
}

void TrainConfig::validate() const {
  model.validate();
  // (image_size / patch)^2 fits int64 once model.validate() has bounded both.
  require(model.tokens() <= kMaxImageTokens,
          "model.image_size " + std::to_string(model.image_size) + " at model.patch " + std::to_string(model.patch) +
              " gives " + std::to_string(model.tokens()) + " tokens per image ((image_size / patch)^2); at most " +
              std::to_string(kMaxImageTokens));
  check_rules(*this, "");
  const auto& o = optim;
  require(data.prefetch >= 1, "data.prefetch must be at least 1");
  require(o.steps > 0, "train.steps must be positive");
  require(o.batch_size > 0, "train.batch_size must be positive (got " + std::to_string(o.batch_size) + ")");
  require(o.lr > 0, "train.lr must be positive (got " + std::to_string(o.lr) + ")");
  require(o.weight_decay >= 0, "train.weight_decay must be >= 0");
  require(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "train.beta1/beta2 must be in [0, 1)");
  require(o.eps > 0, "train.eps must be positive");
  require(o.warmup_steps >= 0, "train.warmup_steps must be >= 0");
  require(o.lr_min >= 0 && o.lr_min <= o.lr, "train.lr_min must be in [0, train.lr] (the floor the schedule decays to)");
  require(o.decay_fraction >= 0 && o.decay_fraction <= 1,
          "train.decay_fraction must be in [0, 1] (the last fraction of train.steps that wsd decays over)");
  require(o.grad_clip >= 0, "train.grad_clip must be >= 0 (0 turns clipping off)");
  require(o.ema_decay >= 0 && o.ema_decay < 1, "train.ema_decay must be in [0, 1)");
  require(o.precision != "fp16" || speed.fused_optimizer,
          "train.precision = fp16 keeps its loss scale in the device optimizer: leave speed.fused_optimizer on "
          "(--fused on)");
  require(o.precision != "fp8" || (speed.fused_kernels && !speed.recompute),
          "train.precision = fp8 runs the blocks' linears in the fused schedule: leave speed.fused_kernels on and "
          "speed.recompute off");
  const auto& d = diffusion;
  require(!(model.learn_sigma && d.objective == "flow"),
          "model.learn_sigma needs diffusion.objective = \"ddpm\" (flow has no variance to learn)");
  require(d.sample_steps > 0, "diffusion.sample_steps must be positive");
  require(d.cfg_scale >= 0, "diffusion.cfg_scale must be >= 0");
  require(model.cond_dim == 0 || data.source != "fashion-mnist",
          "model.cond_dim > 0 (condition features) needs data.source = \"latents\" with cond tensors, or \"synthetic\"");
  require(d.cfg_scale == 1.0 || model.class_dropout > 0,
          "diffusion.cfg_scale != 1 needs model.class_dropout > 0 (guidance needs the null class)");
  require(log.every > 0, "log.every must be positive");
  require(log.sample_every >= 0 && log.checkpoint_every >= 0, "log.sample_every/checkpoint_every must be >= 0");
  require(log.keep_checkpoints >= 1, "log.keep_checkpoints must be at least 1");
  require(log.histogram_every >= 0, "log.histogram_every must be >= 0 (0: only at the end)");
  require(log.sample_per_class > 0 && log.sample_classes > 0, "log.sample_per_class/sample_classes must be positive");
  // Bounds on what is allocated from these at once (the batch's own bound is
  // the memory estimate, train/memory_estimate.h).
  require(data.prefetch <= 64, "data.prefetch must be at most 64 (batches held ahead)");
  require(d.sample_steps <= 100000, "diffusion.sample_steps must be at most 100000");
  require(log.sample_per_class <= 1024 && log.sample_classes <= 65536 &&
              log.sample_per_class * std::min(log.sample_classes, model.num_classes) <= 65536,
          "log.sample_per_class x log.sample_classes must be at most 65536 images in a sample grid");
  require(health.vanish_norm >= 0, "health.vanish_norm must be >= 0");
  require(health.explode_factor > 1, "health.explode_factor must be > 1 (a spike is this many times the median)");
  require(distributed.timeout_s > 0 && distributed.timeout_s <= 86400, "distributed.timeout_s must be in (0, 86400] seconds");
  require(distributed.bucket_mb > 0 && distributed.bucket_mb <= 4096, "distributed.bucket_mb must be in (0, 4096]");
  validate_eval(eval);
  validate_loggers(log);
  require(!run.dir.empty(), "run.dir must not be empty");
  require(base::is_printable(run.dir),
          "run.dir (--runs-dir) '" + base::printable(run.dir) +
              "' holds control characters or bytes that are not UTF-8; give a path of printable text");
  require(base::is_printable(run.name),
          "run.name (--run-name) '" + base::printable(run.name) +
              "' holds control characters or bytes that are not UTF-8; name the run with printable text");
  require(run.name.find('/') == std::string::npos && run.name != "." && run.name != "..",
          "run.name (--run-name) must be one directory name under run.dir: no '/', not '.' or '..' "
          "(empty: <model>-<data>-<date>)");
}

double model_weight_bytes(const models::DiTConfig& model) {
  return static_cast<double>(model.parameter_count()) * sizeof(float);
}

void check_model_fits(const models::DiTConfig& model, double available_bytes) {
  const double bytes = model_weight_bytes(model);
  require(bytes <= available_bytes,
          "model " + base::printable(model.name) + " (model.depth " + std::to_string(model.depth) + ", model.hidden " +
              std::to_string(model.hidden) + ", model.image_size " + std::to_string(model.image_size) + ", ...) has " +
              std::to_string(model.parameter_count()) + " parameters: " + bytes_text(bytes) +
              " of weights, more than the " + bytes_text(available_bytes) + " of memory available");
}

std::string TrainConfig::to_toml() const {
  TrainConfig copy = *this;
  std::ostringstream out;
  std::string section;
  out << "# perftrain resolved config: a valid --config input\n";
  for (const Key& k : keys(copy)) {
    if (section != k.section) {
      section = k.section;
      out << "\n[" << section << "]\n";
    }
    out << k.key << " = " << value_text(k.target) << "\n";
  }
  return out.str();
}

std::vector<ConfigValue> config_values(const TrainConfig& cfg) {
  TrainConfig copy = cfg;
  std::vector<ConfigValue> out;
  for (const Key& k : keys(copy))
    std::visit([&](auto* p) { out.push_back({std::string(k.section) + "." + k.key, *p}); }, k.target);
  return out;
}

std::vector<std::pair<std::string, std::string>> config_fields(const TrainConfig& cfg, const std::string& section) {
  TrainConfig copy = cfg;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Key& k : keys(copy))
    if (section == k.section) out.emplace_back(k.key, value_text(k.target));
  if (out.empty()) throw std::invalid_argument("config_fields: no section [" + section + "]");
  return out;
}

}  // namespace perftrain::train
