// perftrain summary's table (torchinfo-like): every module of a model with
// its output shape, parameters, trainable flag and mult-adds, from one
// forward run through nn::Module's hooks (on the meta device: shapes only,
// nothing computed or allocated, so DiT-XL/2 takes well under a second after
// it is built).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace perftrain::models::views {

struct SummaryRow {
  std::string name;  // qualified ("blocks.3.attn"); "" for the model itself
  std::string type;  // class name ("Linear", "DiTBlock")
  int depth = 0;     // 0 for the model, 1 for its children, ...
  std::vector<int64_t> output_shape;  // of the first call; empty when it never ran
  int64_t calls = 0;                  // forward calls in the one model forward
  // Parameters in the module's subtree, every tensor counted once: a tensor
  // registered by several modules counts under the first in state_dict order
  // (the others show it in shared_params, not in params).
  int64_t params = 0;
  int64_t trainable_params = 0;
  int64_t shared_params = 0;  // registered here too but counted earlier
  // Multiply-adds of the subtree's forward: a weight [out, ...] whose module
  // produces [..., out] costs numel/out per output element (Linear: in*out
  // per token; the patch conv: C*p*p per output element); attention adds its
  // two products (2 * B * T^2 * D); elementwise ops and lookups count 0.
  double mult_adds = 0;
  // Modules this row stands for: consecutive list members of one structure
  // that never run themselves (a looped model's per-loop adapters, read as
  // weights: "adapters.0..7" with repeat 8); params are their sum.
  int64_t repeat = 1;
  // "yes", "no", "partial" or "" (no parameters of its own subtree).
  std::string trainable() const;
};

struct ModuleSummary {
  std::string title;  // e.g. "DiT-XL/2, batch 256, input [256, 4, 32, 32]"
  std::vector<SummaryRow> rows;  // depth first in registration order
  int64_t total_params = 0;      // each tensor once, trainable or not
  int64_t trainable_params = 0;
  double total_mult_adds = 0;    // of one forward of the batch
  double param_bytes = 0;        // at the parameters' dtypes
  // Training memory, filled by the caller (train/memory_estimate): (what, bytes).
  std::vector<std::pair<std::string, double>> memory;
  std::string memory_note;
};

// Runs forward() once with hooks on model and fills the rows. forward gets
// the model's hooks attached; what it returns is ignored. A block that ran
// on weights other than its modules' (a looped model's shared block: its
// children's hooks do not fire) has its mult-adds from its linears' shapes
// and its input's tokens, per call. Never-run repeated list members are
// rolled up into one row per module of the first (SummaryRow::repeat).
ModuleSummary summarize_module(const nn::Module& model, const std::function<void()>& forward);

// The table as text ("table"), CSV, JSON or Markdown ("md"), rows down to
// max_depth (deeper modules are folded into their ancestors' numbers).
// Throws UsageError for another format.
std::string format_summary(const ModuleSummary& summary, const std::string& format, int max_depth);

// "1.23 G", "675.1 M", "4.2 k", "12"
std::string si_count(double n);

}  // namespace perftrain::models::views
