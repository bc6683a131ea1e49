// Gradient health of one monitored training step, as plain host values: per
// parameter and per module (a DiT block, an embedder, the final layer) the
// gradient's norm, mean and max |g|, share of zeros, NaN/Inf count, and the
// update/weight ratio ||dw|| / ||w|| of that step's optimizer update. The
// train layer fills it (train/grad_monitor.h: computed on the device inside
// the step, read back asynchronously); TensorBoard, the plots, metrics.jsonl
// and the detectors below read it. No torch types here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::observe {

struct GradStats {
  int64_t numel = 0;        // elements of the gradient(s)
  double norm = 0;          // L2 norm of the gradient
  double mean_abs = 0;      // mean |g|
  double max_abs = 0;       // max |g|
  double zero_share = 0;    // share of elements exactly 0, in [0, 1]
  int64_t nonfinite = 0;    // NaN and Inf elements
  double weight_norm = 0;   // ||w|| before the update
  double update_norm = 0;   // ||dw||, the update's size (0 when the step was skipped)
  double update_ratio() const { return weight_norm > 0 ? update_norm / weight_norm : 0; }
  bool finite() const { return nonfinite == 0; }
};

struct NamedGradStats {
  std::string name;  // "blocks.3.attn.qkv.weight" (parameter) or "blocks.3" (module)
  GradStats stats;
};

// A gradient histogram over the fixed buckets of grad_histogram_limits():
// counts of the finite elements, with their min, max, sum and sum of squares.
// finite = false: the gradient held NaN/Inf (its min, max and sum are not
// numbers; TensorBoard gets no histogram then).
struct GradHistogram {
  double num = 0, min = 0, max = 0, sum = 0, sum_squares = 0;
  bool finite = true;
  std::vector<double> counts;  // one per limit
};

struct NamedGradHistogram {
  std::string name;
  GradHistogram hist;
};

// The fp8 scaling's health of one linear (train.precision = fp8): its
// current scales (the casts' multipliers of the input, weight and output
// gradient) and the scaling's event counts since the run began, summed over
// those three: overflows (a step's amax was NaN/Inf: the scale kept) and
// underflows (an amax of zero: the scale kept).
struct Fp8LayerHealth {
  std::string name;  // "blocks.3.mlp.fc1"
  double scale_x = 1, scale_w = 1, scale_dy = 1;
  double overflows = 0, underflows = 0;
};

struct GradHealthSample {
  int64_t step = 0;                     // the training step it was taken at
  GradStats global;                     // all parameters together
  std::vector<NamedGradStats> params;   // in the model's parameter order
  std::vector<NamedGradStats> modules;  // in order of first parameter
  // A looped model's per-loop groups, loop by loop: "loop3/adapters" (every
  // adapter of loop 3), "loop3/router"; empty for the other families. The
  // shared blocks' gradients (summed over the loops, as their .grad) are the
  // modules "shared.<k>".
  std::vector<NamedGradStats> loops;
  // Gradient histograms (health.grad_histograms), per parameter and per
  // module in the orders above; empty when the step took none.
  std::vector<NamedGradHistogram> param_histograms, module_histograms;
  // fp8 runs: every fp8 linear's scaling, as it stood when the sample was
  // taken from the runner; empty otherwise.
  std::vector<Fp8LayerHealth> fp8;
};

// The gradient histograms' bucket edges, fixed so that the device fills the
// counts without looking at the data and histograms add up across parameters
// and steps: bucket i holds the values in (limits[i-1], limits[i]] (the first
// from -inf; the last limit is the largest double). Over |g| four buckets a
// decade from 1e-12 to 1e2, mirrored for negative values, and one bucket
// (-1e-12, 1e-12] around zero: 115 buckets.
const std::vector<double>& grad_histogram_limits();

// The module a parameter belongs to for the per-module view: its first name
// component, with the index for a list ("blocks.3.mlp.fc1.weight" ->
// "blocks.3", "x_embedder.proj.bias" -> "x_embedder", "pos_embed" ->
// "pos_embed").
std::string module_of_parameter(const std::string& param_name);

// A looped model's per-loop parameters (models/looped.h: adapters.<l>.*,
// routers.<l>.*): the loop l; any other name: -1.
int64_t loop_of_parameter(const std::string& param_name);

// Sums per-parameter statistics into one: norms as root of summed squares,
// means and shares weighted by numel, maxima as max, counts as sums.
GradStats combine(const std::vector<const GradStats*>& parts);

// The per-module, per-loop and global entries from sample.params (fills
// modules, loops and global), and module_histograms from param_histograms (counts, sums and
// numbers summed, min of mins, max of maxima).
void summarize_modules(GradHealthSample& sample);

// Thresholds of the detectors ([health] config keys).
struct HealthThresholds {
  double vanish_norm = 1e-7;   // a module's gradient norm under this ...
  int64_t patience = 3;        // ... for this many monitored steps in a row: vanishing (and all-zero: dead)
  double explode_factor = 10;  // global norm above this times the running median: exploding
  int64_t median_window = 20;  // monitored steps in the running median
  int64_t median_min = 5;      // samples needed before the exploding check starts
};

struct HealthWarning {
  int64_t step = 0;
  std::string kind;    // vanishing | exploding | dead | nonfinite
  std::string module;  // "" for the global (exploding)
  std::string message; // one line for the log
};

// Feeds on monitored samples in step order and says what turned unhealthy.
// A condition is warned once when it starts (again after it cleared).
class HealthDetectors {
 public:
  explicit HealthDetectors(HealthThresholds t = {}) : t_(t) {}
  std::vector<HealthWarning> observe(const GradHealthSample& sample);
  // Every warning so far (for the run report).
  const std::vector<HealthWarning>& warnings() const { return all_; }

 private:
  HealthThresholds t_;
  std::vector<std::string> names_;
  std::vector<int64_t> low_run_, zero_run_;  // consecutive low / all-zero samples per module
  std::vector<bool> nonfinite_;
  std::vector<double> recent_norms_;
  bool exploding_ = false;
  std::vector<HealthWarning> all_;
};

}  // namespace perftrain::observe
