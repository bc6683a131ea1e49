// [speed] attention = "auto": per shape, which family runs each direction
// of the attention: our tiled kernels both ways, cuDNN's both ways, or
// cuDNN's forward with our tiled backward (which reads cuDNN's out and lse:
// both forwards save one layout, ops/cudnn_attention's save_cudnn_state),
// whichever ran fastest. On the first forward of a new key where both
// families apply, the three plans run forward and backward on fresh random
// inputs of that shape (CUDA events on the current stream: two warm-up runs,
// then the median of five) and the fastest is kept for the process. While
// the stream is being captured nothing is timed: a decision made before is
// used, or else our tiled kernels both ways (recorded as not timed). The
// backward runs the family the forward's plan names (the forward's saved
// "tiled" flag, as with "tiled"). The records say why each shape ran where
// it did, as the GEMM tuner's (ops/cublaslt_workspace.h) do.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace perftrain::ops {

bool attention_auto();
void set_attention_auto(bool on);  // process-wide; before the step is captured

enum class AttentionFamily { Tiled, Cudnn };

// The family of each direction at one shape.
struct AttentionPlan {
  AttentionFamily forward = AttentionFamily::Tiled, backward = AttentionFamily::Tiled;
  bool operator==(const AttentionPlan& o) const { return forward == o.forward && backward == o.backward; }
  bool operator!=(const AttentionPlan& o) const { return !(*this == o); }
};
// The plans "auto" times: ours both ways, cuDNN's both ways, cuDNN's forward then our backward.
constexpr AttentionPlan kTiledPlan{AttentionFamily::Tiled, AttentionFamily::Tiled};
constexpr AttentionPlan kCudnnPlan{AttentionFamily::Cudnn, AttentionFamily::Cudnn};
constexpr AttentionPlan kMixedPlan{AttentionFamily::Cudnn, AttentionFamily::Tiled};

struct AttentionChoiceKey {
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  bool masked = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  int device = 0;
  bool operator<(const AttentionChoiceKey& o) const;
};

struct AttentionChoiceRecord {
  AttentionChoiceKey key;
  double tiled_ms = 0;  // each plan's median forward + backward; 0 where not timed
  double cudnn_ms = 0;
  double mixed_ms = 0;  // cuDNN's forward, our tiled backward
  AttentionPlan choice = kTiledPlan;
  bool timed = false;  // false: decided during a capture, without timing
};

// One record per key decided since the last reset, in key order.
std::vector<AttentionChoiceRecord> attention_choice_records();
void reset_attention_choices();

// The note attention_paths_used() appends to a line of this shape, e.g.
// " (auto, fwd+bwd: tiled 0.81 ms, cuDNN 0.93 ms, cuDNN then tiled 0.78 ms)";
// empty where no record.
std::string attention_choice_note(int64_t tokens, int64_t head_dim, bool masked, c10::ScalarType dtype);

namespace detail {

// Forward + backward median of each plan at a key, in milliseconds.
struct AttentionTimes {
  double tiled_ms = 0, cudnn_ms = 0, mixed_ms = 0;
};
using AttentionTimer = std::function<AttentionTimes(const AttentionChoiceKey&)>;

// The decision at `key`: the cached one, else (not capturing) timed by
// `timer` and cached (the fastest plan; ties go to ours both ways, then to
// the mixed plan), else our tiled kernels both ways, cached as not timed
// (kept: a captured graph and the eager steps after it run the same
// kernels). Thread-safe.
AttentionPlan choose_attention_plan(const AttentionChoiceKey& key, bool capturing, const AttentionTimer& timer);

// With "auto", the plan for q [B, T, heads * head_dim] (tiled_attention_takes
// said yes): ours both ways where cuDNN does not apply (no timing), else
// choose_attention_plan with the current stream's capture status and the
// CUDA-event timer.
AttentionPlan auto_attention_plan(const at::Tensor& q, int64_t heads, bool masked);

// The plan a timing run forces (inside the timer), or none: while set,
// tiled_attention_applies and the backward's choice after cuDNN's forward
// ask nothing else, and paths are not noted.
const AttentionPlan* forced_attention_plan();

// Forces `plan` on this thread for its lifetime (the timer's runs, and tests
// that run one plan).
class ForcedAttentionPlan {
 public:
  explicit ForcedAttentionPlan(AttentionPlan plan);
  ~ForcedAttentionPlan();
  ForcedAttentionPlan(const ForcedAttentionPlan&) = delete;
  ForcedAttentionPlan& operator=(const ForcedAttentionPlan&) = delete;

 private:
  AttentionPlan plan_;
  const AttentionPlan* before_;
};

}  // namespace detail

}  // namespace perftrain::ops
