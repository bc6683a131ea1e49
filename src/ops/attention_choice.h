// [speed] attention = "auto": per shape, our tiled attention or cuDNN's,
// whichever ran faster. On the first forward of a new key where both
// families apply, both run forward and backward on fresh random inputs of
// that shape (CUDA events on the current stream: two warm-up runs, then the
// median of five) and the faster is kept for the process. While the stream
// is being captured nothing is timed: a decision made before is used, or
// else our tiled kernels (recorded as not timed). The backward runs the
// family its forward chose (the forward's saved "tiled" flag, as with
// "tiled"). The records say why each shape ran where it did, as the GEMM
// tuner's (ops/cublaslt_workspace.h) do.
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

struct AttentionChoiceKey {
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  bool masked = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  int device = 0;
  bool operator<(const AttentionChoiceKey& o) const;
};

struct AttentionChoiceRecord {
  AttentionChoiceKey key;
  double tiled_ms = 0;  // median forward + backward; 0 where not timed
  double cudnn_ms = 0;
  AttentionFamily choice = AttentionFamily::Tiled;
  bool timed = false;  // false: decided during a capture, without timing
};

// One record per key decided since the last reset, in key order.
std::vector<AttentionChoiceRecord> attention_choice_records();
void reset_attention_choices();

// The note attention_paths_used() appends to a line of this shape, e.g.
// " (auto: 0.81 ms vs cuDNN 0.93 ms fwd+bwd)"; empty where no record.
std::string attention_choice_note(int64_t tokens, int64_t head_dim, bool masked, c10::ScalarType dtype);

namespace detail {

// Forward + backward median of each family at a key, in milliseconds.
struct AttentionTimes {
  double tiled_ms = 0, cudnn_ms = 0;
};
using AttentionTimer = std::function<AttentionTimes(const AttentionChoiceKey&)>;

// The decision at `key`: the cached one, else (not capturing) timed by
// `timer` and cached, else our tiled kernels, cached as not timed (kept:
// a captured graph and the eager steps after it run the same kernels).
// Thread-safe; ties go to ours.
AttentionFamily choose_attention_family(const AttentionChoiceKey& key, bool capturing, const AttentionTimer& timer);

// Whether, with "auto", our tiled kernels run q [B, T, heads * head_dim]
// (tiled_attention_takes said yes): true where cuDNN does not apply (no
// timing), else choose_attention_family with the current stream's capture
// status and the CUDA-event timer.
bool auto_attention_picks_tiled(const at::Tensor& q, int64_t heads, bool masked);

// The family a timing run forces (inside the timer), or none: while set,
// tiled_attention_applies asks nothing else and paths are not noted.
const AttentionFamily* forced_attention_family();

}  // namespace detail

}  // namespace perftrain::ops
