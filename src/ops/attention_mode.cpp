#include "ops/attention_mode.h"

#include <stdexcept>

#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_tiled.h"

namespace perftrain::ops {

namespace {

// The four switches a mode sets.
struct AttentionSwitches {
  bool whole_head_forward, whole_head_backward, tiled, automatic;
  bool operator==(const AttentionSwitches& o) const {
    return whole_head_forward == o.whole_head_forward && whole_head_backward == o.whole_head_backward &&
           tiled == o.tiled && automatic == o.automatic;
  }
};

// Our whole-head backward needs our forward's saved state or cuDNN's: with
// "tiled" the whole-head backward runs after the tiled forward at 256 tokens.
AttentionSwitches switches_of(const std::string& mode) {
  return {mode == "whole_head" || mode == "auto", mode != "cudnn", mode == "tiled", mode == "auto"};
}

}  // namespace

const std::vector<std::string>& attention_modes() {
  static const std::vector<std::string> modes{"whole_head", "tiled", "cudnn", "auto"};
  return modes;
}

void set_attention_mode(const std::string& mode) {
  bool known = false;
  for (const auto& m : attention_modes()) known = known || m == mode;
  if (!known) {
    std::string names;
    for (const auto& m : attention_modes()) names += (names.empty() ? "" : ", ") + m;
    throw std::invalid_argument("attention mode \"" + mode + "\" is not one of " + names);
  }
  const AttentionSwitches s = switches_of(mode);
  set_whole_head_attention_forward(s.whole_head_forward);
  set_whole_head_attention_backward(s.whole_head_backward);
  set_tiled_attention(s.tiled);
  set_attention_auto(s.automatic);
}

std::string attention_mode() {
  const AttentionSwitches now{whole_head_attention_forward(), whole_head_attention_backward(), tiled_attention(),
                              attention_auto()};
  for (const auto& m : attention_modes())
    if (switches_of(m) == now) return m;
  return "custom";
}

}  // namespace perftrain::ops
