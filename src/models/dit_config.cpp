#include "models/dit_config.h"

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

[[noreturn]] void unknown_model(const std::string& name) {
  std::ostringstream known;
  for (const auto& n : model_names()) known << " " << n;
  throw UsageError("unknown model '" + name + "'; known models:" + known.str());
}

}  // namespace

std::vector<std::string> dit_model_names() { return family_names("DiT-", kPatches); }
std::vector<std::string> single_stream_model_names() { return family_names("SS-", kSingleStreamPatches); }

std::vector<std::string> model_names() {
  std::vector<std::string> names = dit_model_names();
  for (auto& n : single_stream_model_names()) names.push_back(std::move(n));
  return names;
}

DiTConfig model_config(const std::string& name) {
  DiTConfig c;
  if (find_in_family(name, "DiT-", "dit", kPatches, c) ||
      find_in_family(name, "SS-", "single-stream", kSingleStreamPatches, c))
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
  if (family != "dit" && family != "single-stream") fail("family '" + family + "' (expected dit or single-stream)");
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

int64_t DiTConfig::parameter_count(bool trainable_only) const {
  const int64_t D = hidden, M = mlp_hidden(), P = patch * patch;
  if (single_stream()) {  // linears without bias; RMSNorm weights; no fixed tensors
    const int64_t hd = D / heads;
    const int64_t block = 4 * D + 2 * hd + 4 * D * D + 3 * D * M + 4 * D * D;
    const int64_t cond = cond_dim > 0 ? cond_dim + cond_dim * D : (num_classes + (class_dropout > 0)) * cond_tokens * D;
    return P * in_channels * D + 256 * D + D * D + cond + depth * block + D * D + D * P * out_channels();
  }
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  const int64_t block = linear(D, 3 * D) + linear(D, D) + linear(D, M) + linear(M, D) + linear(D, 6 * D);
  const int64_t n = linear(P * in_channels, D)                  // x_embedder (conv as a linear)
                    + linear(256, D) + linear(D, D)             // t_embedder
                    + (num_classes + (class_dropout > 0)) * D  // y_embedder
                    + depth * block                             //
                    + linear(D, P * out_channels()) + linear(D, 2 * D);  // final_layer
  return trainable_only ? n : n + tokens() * D;
}

double DiTConfig::forward_flops_per_sample() const {
  if (single_stream()) {
    const double T = static_cast<double>(sequence_tokens()), I = static_cast<double>(tokens()), D = hidden,
                 M = mlp_hidden(), P = static_cast<double>(patch * patch);
    const double per_block = 2 * T * D * (4 * D + 3 * M) + 2 * 2 * T * T * D + 2 * D * 4 * D;
    const double embed = 2 * I * P * in_channels * D + 2 * (256 * D + D * D) + 2.0 * cond_tokens * cond_dim * D;
    return depth * per_block + embed + 2 * I * D * P * out_channels() + 2 * D * D;
  }
  // 2 FLOPs per multiply-add. Per block: qkv, proj, fc1, fc2, adaLN linear,
  // and attention (QK^T and PV); plus patch embedding, final layer, t-MLP.
  const double T = static_cast<double>(tokens()), D = hidden, M = mlp_hidden();
  const double p2c = static_cast<double>(patch * patch * in_channels);
  const double per_block = 2 * T * D * (3 * D + D + 2 * M) + 2 * 2 * T * T * D + 2 * D * 6 * D;
  const double embed = 2 * T * p2c * D + 2 * (256 * D + D * D);
  const double final_layer = 2 * T * D * (patch * patch * out_channels()) + 2 * D * 2 * D;
  return depth * per_block + embed + final_layer;
}

}  // namespace perftrain::models
