#include "ops/attention_paths.h"

#include "ops/attention_choice.h"

#include <mutex>
#include <set>
#include <tuple>

namespace perftrain::ops {
namespace {

using Key = std::tuple<int, int64_t, int64_t, bool, int>;

std::mutex& paths_mutex() {
  static std::mutex m;
  return m;
}
std::set<Key>& paths() {
  static std::set<Key> s;
  return s;
}

const char* path_name(int path) {
  switch (static_cast<AttentionPath>(path)) {
    case AttentionPath::Own: return "ours (whole-head forward and backward)";
    case AttentionPath::Tiled: return "ours, tiled";
    case AttentionPath::Cudnn: return "cuDNN fused";
    case AttentionPath::TiledBackward: return "ours, tiled backward after cuDNN's forward";
    case AttentionPath::Efficient: return "memory-efficient (ATen, by name)";
    case AttentionPath::Sdpa: return "ATen scaled_dot_product_attention";
  }
  return "?";
}

}  // namespace

void note_attention_path(AttentionPath path, int64_t tokens, int64_t head_dim, bool masked, c10::ScalarType dtype) {
  if (detail::forced_attention_plan()) return;  // a timing run of "auto", not the model's
  const Key key{static_cast<int>(path), tokens, head_dim, masked, static_cast<int>(dtype)};
  const std::lock_guard<std::mutex> lock(paths_mutex());
  paths().insert(key);
}

std::vector<std::string> attention_paths_used() {
  std::set<Key> used;
  {
    const std::lock_guard<std::mutex> lock(paths_mutex());
    used = paths();
  }
  std::vector<std::string> lines;
  for (const auto& [path, tokens, head_dim, masked, dtype] : used) {
    const auto type = static_cast<c10::ScalarType>(dtype);
    const bool chosen = path == static_cast<int>(AttentionPath::Tiled) ||
                        path == static_cast<int>(AttentionPath::Cudnn) ||
                        path == static_cast<int>(AttentionPath::TiledBackward);
    lines.push_back(std::string(path_name(path)) + ": " + std::to_string(tokens) + " tokens, head dim " +
                    std::to_string(head_dim) + (masked ? ", key mask, " : ", ") + c10::toString(type) +
                    (chosen ? attention_choice_note(tokens, head_dim, masked, type) : ""));
  }
  return lines;
}

void reset_attention_paths() {
  const std::lock_guard<std::mutex> lock(paths_mutex());
  paths().clear();
}

}  // namespace perftrain::ops
