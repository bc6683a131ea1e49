#include "models/dit_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/error.h"

namespace perftrain::models {
namespace {

struct Size {
  const char* letter;
  int64_t depth, hidden, heads;
};
// DiT-T is perftrain's own (not in the reference): small enough to train on
// a laptop CPU in minutes.
constexpr Size kSizes[] = {
    {"XL", 28, 1152, 16}, {"L", 24, 1024, 16}, {"B", 12, 768, 12}, {"S", 12, 384, 6}, {"T", 6, 192, 3},
};
constexpr int64_t kPatches[] = {2, 4, 8};
// Single-stream: DiT's sizes (head dim 64, 72 at XL), patch 1 and 2.
constexpr int64_t kSingleStreamPatches[] = {2, 1};

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// A family's names: prefix + size letter + "/" + patch, in registry order.
template <size_t N>
std::vector<std::string> family_names(const char* prefix, const int64_t (&patches)[N]) {
  std::vector<std::string> names;
  for (const Size& s : kSizes)
    for (int64_t p : patches) names.push_back(std::string(prefix) + s.letter + "/" + std::to_string(p));
  return names;
}

// The config of `name` in the family of `prefix`, if the family has it.
template <size_t N>
bool find_in_family(const std::string& name, const char* prefix, const char* family, const int64_t (&patches)[N],
                    DiTConfig& out) {
  for (const Size& s : kSizes)
    for (int64_t p : patches)
      if (name == std::string(prefix) + s.letter + "/" + std::to_string(p)) {
        out = DiTConfig();
        out.name = name, out.family = family, out.patch = p;
        out.depth = s.depth, out.hidden = s.hidden, out.heads = s.heads;
        return true;
      }
  return false;
}

// Looped-*: DiT's sizes; prelude 2, one shared block, coda 2, and as many
// loops as make DiT's depth of block applications.
bool find_looped(const std::string& name, DiTConfig& out) {
  if (!find_in_family(name, "Looped-", "looped", kPatches, out)) return false;
  out.prelude = 2, out.coda = 2, out.shared_group = 1;
  out.loops = out.depth - 4;
  return true;
}

[[noreturn]] void unknown_model(const std::string& name) {
  std::ostringstream known;
  for (const auto& n : model_names()) known << " " << n;
  throw UsageError("unknown model '" + name + "'; known models:" + known.str());
}

}  // namespace

std::vector<std::string> dit_model_names() { return family_names("DiT-", kPatches); }
std::vector<std::string> single_stream_model_names() { return family_names("SS-", kSingleStreamPatches); }

std::vector<std::string> looped_model_names() { return family_names("Looped-", kPatches); }

std::vector<std::string> model_names() {
  std::vector<std::string> names = dit_model_names();
  for (auto& n : single_stream_model_names()) names.push_back(std::move(n));
  for (auto& n : looped_model_names()) names.push_back(std::move(n));
  return names;
}

DiTConfig model_config(const std::string& name) {
  DiTConfig c;
  if (find_in_family(name, "DiT-", "dit", kPatches, c) ||
      find_in_family(name, "SS-", "single-stream", kSingleStreamPatches, c) || find_looped(name, c))
    return c;
  unknown_model(name);
}

DiTConfig dit_config(const std::string& name) {
  DiTConfig c;
  if (find_in_family(name, "DiT-", "dit", kPatches, c)) return c;
  unknown_model(name);
}

int64_t DiTConfig::mlp_hidden() const {
  if (!single_stream()) return static_cast<int64_t>(hidden * mlp_ratio);
  return round_up(static_cast<int64_t>(hidden * mlp_ratio * 2.0 / 3.0 + 0.5), 64);
}


namespace {
// 1e+300, not std::to_string's 301 digits.
std::string short_number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

void DiTConfig::validate() const {
  auto fail = [&](const std::string& what) { throw UsageError("model " + name + ": " + what); };
  if (depth <= 0 || hidden <= 0 || heads <= 0 || patch <= 0) fail("depth, hidden, heads and patch must be positive");
  // Far beyond any model that fits a GPU (kMaxImageSize in dit_config.h).
  auto at_most = [&](const char* key, int64_t v, int64_t max) {
    if (v > max) fail(std::string("model.") + key + " " + std::to_string(v) + " is above " + std::to_string(max));
  };
  at_most("depth", depth, 1024);
  at_most("hidden", hidden, 65536);
  at_most("image_size", image_size, kMaxImageSize);
  at_most("in_channels", in_channels, kMaxInChannels);
  at_most("num_classes", num_classes, kMaxNumClasses);
  if (hidden % heads != 0) fail("hidden " + std::to_string(hidden) + " is not divisible by heads " + std::to_string(heads));
  if (family != "dit" && family != "single-stream" && family != "looped")
    fail("family '" + family + "' (expected dit, single-stream or looped)");
  if (looped()) validate_looped();
  if (!single_stream() && hidden % 4 != 0) fail("hidden must be a multiple of 4 for the 2-D sin-cos positional embedding");
  if (single_stream()) {
    const int64_t head_dim = hidden / heads;
    if (head_dim % 2 != 0 || head_dim < 8) fail("head dim (hidden / heads) must be even and at least 8 for rotary embedding");
    if (cond_tokens < 1) fail("cond_tokens must be at least 1");
    if (cond_dim < 0) fail("cond_dim must be >= 0 (0: class labels)");
  }
  if (image_size <= 0 || image_size % patch != 0)
    fail("patch " + std::to_string(patch) + " does not divide image_size " + std::to_string(image_size));
  if (in_channels <= 0) fail("in_channels must be positive");
  if (num_classes <= 0) fail("num_classes must be positive");
  if (!(class_dropout >= 0 && class_dropout < 1))  // NaN too
    fail("model.class_dropout " + short_number(class_dropout) + " must be in [0, 1)");
  // Before mlp_hidden(): casting inf to an integer is undefined; a width of 0
  // divides by zero in the initialisation.
  if (!(mlp_ratio > 0 && mlp_ratio <= 64))
    fail("model.mlp_ratio " + short_number(mlp_ratio) + " must be a number in (0, 64]");
  if (mlp_hidden() < 1)
    fail("model.mlp_ratio " + short_number(mlp_ratio) + " gives an MLP width of " + std::to_string(mlp_hidden()) +
         " (hidden " + std::to_string(hidden) + " x mlp_ratio must be at least 1)");
}

void DiTConfig::validate_looped() const {
  auto fail = [&](const std::string& what) { throw UsageError("model " + name + ": " + what); };
  auto in_range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      fail(std::string("model.") + key + " " + std::to_string(v) + " (expected an integer from " + std::to_string(lo) +
           " to " + std::to_string(hi) + ")");
  };
  if (loop_block != "dit" && loop_block != "single_stream")
    fail("model.loop_block '" + loop_block + "' (expected dit or single_stream)");
  in_range("prelude", prelude, 0, 1024);
  in_range("coda", coda, 0, 1024);
  in_range("shared_group", shared_group, 1, 1024);
  in_range("loops", loops, 1, 1024);
  if (depth != looped_depth())
    fail("model.depth " + std::to_string(depth) + " of a looped model must be prelude + shared_group * loops + coda = " +
         std::to_string(looped_depth()) + " (set model.loops, model.prelude, model.coda or model.shared_group)");
  if (reinject != "none" && reinject != "add" && reinject != "concat")
    fail("model.reinject '" + reinject + "' (expected none, add or concat)");
  in_range("lora_rank", lora_rank, 0, 65536);
  if (!(lora_alpha > 0 && std::isfinite(lora_alpha)))
    fail("model.lora_alpha " + std::to_string(lora_alpha) + " must be a positive number");
  lora_target_list();
  if (lora_bias && loop_block == "single_stream")
    fail("model.lora_bias needs model.loop_block dit (single-stream linears have no bias)");
  auto capacity_ok = [](double c) { return c > 0 && c <= 1; };  // NaN fails
  if (!capacity_ok(route_capacity))
    fail("model.route_capacity " + std::to_string(route_capacity) + " must be in (0, 1]");
  if (route_capacity_end != -1.0 && !capacity_ok(route_capacity_end))
    fail("model.route_capacity_end " + std::to_string(route_capacity_end) + " must be in (0, 1] (-1: route_capacity)");
  if (!(router_aux_weight >= 0 && std::isfinite(router_aux_weight)))
    fail("model.router_aux_weight " + std::to_string(router_aux_weight) + " must be a number >= 0");
}

double DiTConfig::loop_capacity(int64_t loop) const {
  const double end = route_capacity_end == -1.0 ? route_capacity : route_capacity_end;
  if (loops <= 1) return route_capacity;
  return route_capacity + (end - route_capacity) * static_cast<double>(loop) / static_cast<double>(loops - 1);
}

int64_t DiTConfig::loop_tokens(int64_t loop) const {
  if (!loop_routed(loop)) return tokens();
  return std::max<int64_t>(1, std::llround(loop_capacity(loop) * static_cast<double>(tokens())));
}

bool DiTConfig::routing() const {
  for (int64_t l = 0; looped() && l < loops; ++l)
    if (loop_routed(l)) return true;
  return false;
}

std::vector<std::string> DiTConfig::lora_target_list() const {
  static const char* const kTargets[] = {"attn", "mlp", "adaln"};
  std::vector<std::string> given;
  std::stringstream in(lora_targets);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    given.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  std::vector<std::string> out;
  for (const std::string& g : given) {
    const bool known = std::find(std::begin(kTargets), std::end(kTargets), g) != std::end(kTargets);
    if (!known || std::count(given.begin(), given.end(), g) > 1)
      throw UsageError("model " + name + ": model.lora_targets '" + lora_targets + "': '" + g + "' is " +
                       (known ? "named twice" : "not a target") + " (a comma list of attn, mlp, adaln)");
  }
  for (const char* t : kTargets)
    if (std::find(given.begin(), given.end(), t) != given.end()) out.push_back(t);
  return out;
}

std::vector<LinearShape> DiTConfig::lora_linears() const {
  const int64_t D = hidden, M = mlp_hidden();
  std::vector<LinearShape> out;
  for (const std::string& t : lora_target_list()) {
    if (t == "attn") out.insert(out.end(), {{"attn.qkv", D, 3 * D}, {"attn.proj", D, D}});
    if (t == "mlp" && single_stream())
      out.insert(out.end(), {{"ffn.gate", D, M}, {"ffn.up", D, M}, {"ffn.down", M, D}});
    else if (t == "mlp")
      out.insert(out.end(), {{"mlp.fc1", D, M}, {"mlp.fc2", M, D}});
    if (t == "adaln") out.push_back(single_stream() ? LinearShape{"adaLN_modulation", D, 4 * D}
                                                    : LinearShape{"adaLN_modulation.1", D, 6 * D});
  }
  return out;
}

int64_t DiTConfig::block_parameter_count() const {
  const int64_t D = hidden, M = mlp_hidden();
  if (single_stream()) return 4 * D + 2 * (D / heads) + 4 * D * D + 3 * D * M + 4 * D * D;  // no biases; RMSNorms
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  return linear(D, 3 * D) + linear(D, D) + linear(D, M) + linear(M, D) + linear(D, 6 * D);
}

int64_t DiTConfig::looped_extra_parameter_count() const {
  const int64_t D = hidden;
  int64_t n = loops * D + (reinject == "concat" ? 2 * D * D + D : 0);  // loop_embed, reinject
  if (lora_rank > 0)
    for (const LinearShape& l : lora_linears())
      n += loops * shared_group * (lora_rank * (l.in + l.out) + (lora_bias ? l.out : 0));
  for (int64_t l = 0; l < loops; ++l) n += loop_routed(l) ? D + 1 : 0;  // routers
  return n;
}

int64_t DiTConfig::parameter_count(bool trainable_only) const {
  const int64_t D = hidden, P = patch * patch;
  // Looped: each block's weights once, however often it is applied.
  const int64_t blocks = looped() ? (prelude + shared_group + coda) * block_parameter_count() +
                                        looped_extra_parameter_count()
                                  : depth * block_parameter_count();
  if (single_stream()) {  // linears without bias; no fixed tensors
    const int64_t cond = cond_dim > 0 ? cond_dim + cond_dim * D : (num_classes + (class_dropout > 0)) * cond_tokens * D;
    return P * in_channels * D + 256 * D + D * D + cond + blocks + D * D + D * P * out_channels();
  }
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  const int64_t n = linear(P * in_channels, D)                  // x_embedder (conv as a linear)
                    + linear(256, D) + linear(D, D)             // t_embedder
                    + (num_classes + (class_dropout > 0)) * D  // y_embedder
                    + blocks                                    //
                    + linear(D, P * out_channels()) + linear(D, 2 * D);  // final_layer
  return trainable_only ? n : n + tokens() * D;
}

// 2 FLOPs per multiply-add. Per block of S tokens: the block's products
// (DiT: qkv, proj, fc1, fc2; single-stream: qkv, proj, gate, up, down),
// attention (QK^T and PV), and the adaLN linear once per sample.
double DiTConfig::block_flops(double S) const {
  const double D = hidden, M = mlp_hidden();
  if (single_stream()) return 2 * S * D * (4 * D + 3 * M) + 2 * 2 * S * S * D + 2 * D * 4 * D;
  return 2 * S * D * (3 * D + D + 2 * M) + 2 * 2 * S * S * D + 2 * D * 6 * D;
}

// Looped: every application at its token count; a routed loop's block at
// its kept image tokens (plus the condition tokens), its router over all
// image tokens; concat re-injection's product; the adapters' merge
// (2 * out * in * rank per loop and target, counted once per sample).
double DiTConfig::looped_blocks_flops() const {
  const double Tc = single_stream() ? static_cast<double>(cond_tokens) : 0.0, D = hidden;
  const double S = static_cast<double>(sequence_tokens());
  double f = static_cast<double>(prelude + coda) * block_flops(S);
  for (int64_t l = 0; l < loops; ++l) {
    f += static_cast<double>(shared_group) * block_flops(Tc + static_cast<double>(loop_tokens(l)));
    if (loop_routed(l)) f += 2 * static_cast<double>(tokens()) * D;
    if (reinject == "concat") f += 2 * S * 2 * D * D;
    if (lora_rank > 0)
      for (const LinearShape& t : lora_linears())
        f += static_cast<double>(shared_group) * 2.0 * static_cast<double>(t.out * t.in * lora_rank);
  }
  return f;
}

double DiTConfig::forward_flops_per_sample() const {
  const double blocks = looped() ? looped_blocks_flops() : static_cast<double>(depth) * block_flops(sequence_tokens());
  const double I = static_cast<double>(tokens()), D = hidden, P = static_cast<double>(patch * patch);
  if (single_stream()) {
    const double embed = 2 * I * P * in_channels * D + 2 * (256 * D + D * D) + 2.0 * cond_tokens * cond_dim * D;
    return blocks + embed + 2 * I * D * P * out_channels() + 2 * D * D;
  }
  // Plus patch embedding, final layer, t-MLP.
  const double embed = 2 * I * P * in_channels * D + 2 * (256 * D + D * D);
  const double final_layer = 2 * I * D * (P * out_channels()) + 2 * D * 2 * D;
  return blocks + embed + final_layer;
}

}  // namespace perftrain::models
