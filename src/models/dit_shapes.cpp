#include "models/dit_shapes.h"

#include <cmath>
#include <map>
#include <sstream>

#include "base/error.h"
#include "base/text.h"

namespace perftrain::models {
namespace {

using Shape = std::vector<int64_t>;

std::string shape_text(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  return o.str() + "]";
}

class Shapes {
 public:
  Shapes(const TensorShapes& shapes, std::string what) : what_(std::move(what)) {
    for (const auto& [name, shape] : shapes) by_name_[name] = shape;
  }
  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  // The shape of `name`, which must have `rank` dimensions.
  const Shape& get(const std::string& name, size_t rank, const char* layout) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end())
      throw UsageError(what_ + ": no tensor '" + name + "', so not a DiT state dict (facebookresearch/DiT's names)");
    if (it->second.size() != rank) fail(name, "is not " + std::string(layout));
    return it->second;
  }
  [[noreturn]] void fail(const std::string& name, const std::string& why) const {
    throw UsageError(what_ + ": tensor '" + base::printable(name) + "' has shape " + shape_text(by_name_.at(name)) +
                     ", which " + why);
  }
  const std::string& what() const { return what_; }

 private:
  std::map<std::string, Shape> by_name_;
  std::string what_;
};

int64_t count_blocks(const Shapes& s) {
  int64_t depth = 0;
  while (s.has("blocks." + std::to_string(depth) + ".attn.qkv.weight")) ++depth;
  if (depth == 0) s.get("blocks.0.attn.qkv.weight", 2, "");  // names the missing tensor
  return depth;
}

// The image size from pos_embed [1, T, D]: T = (image_size / patch)^2.
int64_t image_size_of(const Shapes& s, int64_t hidden, int64_t patch) {
  const Shape& pos = s.get("pos_embed", 3, "[1, tokens, hidden]");
  const auto grid = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(pos[1]))));
  if (pos[0] != 1 || pos[2] != hidden || grid * grid != pos[1])
    s.fail("pos_embed", "is not [1, (image_size / patch)^2, " + std::to_string(hidden) + "]");
  return grid * patch;
}

// heads: the hint, the hint model's, or the registry's for this depth and width.
int64_t heads_of(const DiTConfig& c, const ShapeHints& hints, const std::string& what) {
  if (hints.heads > 0) return hints.heads;
  if (!hints.model.empty()) {
    const DiTConfig r = dit_config(hints.model);
    if (r.hidden != c.hidden || r.patch != c.patch)
      throw UsageError(what + ": --model " + hints.model + " has hidden " + std::to_string(r.hidden) + " and patch " +
                       std::to_string(r.patch) + ", the shapes say hidden " + std::to_string(c.hidden) +
                       " and patch " + std::to_string(c.patch));
    return r.heads;
  }
  for (const auto& name : dit_model_names()) {
    const DiTConfig r = dit_config(name);
    if (r.depth == c.depth && r.hidden == c.hidden) return r.heads;
  }
  throw UsageError(what + ": the shapes say depth " + std::to_string(c.depth) + " and hidden " +
                   std::to_string(c.hidden) + ", which no registry model has, and heads leave no trace in shapes; "
                   "pass --heads");
}

// The registry name of this architecture, else one of the same width and
// patch (the other fields say what differs), else of the same patch.
std::string name_of(const DiTConfig& c) {
  std::string same_width, same_patch;
  for (const auto& name : dit_model_names()) {
    const DiTConfig r = dit_config(name);
    if (r.patch != c.patch) continue;
    if (r.depth == c.depth && r.hidden == c.hidden && r.heads == c.heads) return name;
    if (r.hidden == c.hidden && same_width.empty()) same_width = name;
    if (same_patch.empty()) same_patch = name;
  }
  return !same_width.empty() ? same_width : !same_patch.empty() ? same_patch : "DiT-S/2";
}

}  // namespace

DiTConfig dit_config_from_shapes(const TensorShapes& shapes, const ShapeHints& hints, const std::string& what) {
  const Shapes s(shapes, what);
  DiTConfig c;
  const Shape& x = s.get("x_embedder.proj.weight", 4, "[hidden, in_channels, patch, patch]");
  if (x[2] != x[3]) s.fail("x_embedder.proj.weight", "has a patch that is not square");
  c.hidden = x[0], c.in_channels = x[1], c.patch = x[2];
  c.depth = count_blocks(s);
  c.image_size = image_size_of(s, c.hidden, c.patch);
  const Shape& fc1 = s.get("blocks.0.mlp.fc1.weight", 2, "[mlp_hidden, hidden]");
  c.mlp_ratio = static_cast<double>(fc1[0]) / static_cast<double>(c.hidden);
  const Shape& out = s.get("final_layer.linear.weight", 2, "[patch * patch * out_channels, hidden]");
  const int64_t out_channels = out[0] / (c.patch * c.patch);
  if (out_channels * c.patch * c.patch != out[0] || (out_channels != c.in_channels && out_channels != 2 * c.in_channels))
    s.fail("final_layer.linear.weight", "does not give in_channels or 2 x in_channels outputs per pixel");
  c.learn_sigma = out_channels == 2 * c.in_channels;
  const Shape& table = s.get("y_embedder.embedding_table.weight", 2, "[classes + 1, hidden]");
  c.num_classes = std::max<int64_t>(table[0] - 1, 1);
  c.class_dropout = table[0] > 1 ? 0.1 : 0.0;  // the last row: the null class
  c.heads = heads_of(c, hints, what);
  c.name = hints.model.empty() ? name_of(c) : hints.model;
  try {
    c.validate();
  } catch (const UsageError& e) {
    throw UsageError(what + ": " + e.what());
  }
  return c;
}

std::string describe_model_config(const DiTConfig& c) {
  std::ostringstream o;
  o << c.name << ": depth " << c.depth << ", hidden " << c.hidden << ", heads " << c.heads << ", patch " << c.patch
    << ", mlp_ratio " << c.mlp_ratio << ", image_size " << c.image_size << ", in_channels " << c.in_channels
    << ", learn_sigma " << (c.learn_sigma ? "true" : "false") << ", num_classes " << c.num_classes
    << ", class_dropout " << c.class_dropout;
  if (c.single_stream()) o << ", family single-stream, cond_tokens " << c.cond_tokens << ", cond_dim " << c.cond_dim;
  return o.str();
}

}  // namespace perftrain::models
