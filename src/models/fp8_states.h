// The fp8 scaling states of a forward's linear applications (issue 39):
// one ops::Fp8Scaling (slots x, W, dY) per application of a block's big
// linear, keyed by a stable name ("blocks.3.mlp.fc1"; a looped model's
// shared block once per loop: "shared.0.loop.2.attn.qkv"). The caller that
// runs the model owns the table (the step runner) and hands it to the model
// in DiTExecution::fp8; the fused schedules ask it for a layer's state by
// name, made on first use on the input's device (so the eager first step
// makes them all, before any capture), or from the tensors a checkpoint gave
// (load). Layers whose shapes the fp8 products do not take
// (ops::fp8_linear_supported) run ops::linear, and the table records them.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/fp8_cast.h"
#include "ops/fp8_scaling.h"

namespace perftrain::models {

// The largest power-of-two headroom a scaling update takes (2^16: far past
// any use; TransformerEngine's margin is 0 by default).
constexpr int kFp8MaxMargin = 16;

class Fp8States {
 public:
  // history_len: the amax history of every state (ops::make_fp8_scaling's
  // bounds); margin: the scales' power-of-two headroom at each update (0..16).
  // Bad values: UsageError.
  explicit Fp8States(int64_t history_len, int margin = 0);
  int64_t history_len() const { return history_len_; }
  int margin() const { return margin_; }

  // The state of `name` on `device`: made on first use (from load()'s tensors
  // where it gave them). After freeze(), an unknown name is a RuntimeError
  // (a capture must not allocate new states).
  const ops::Fp8Scaling& state(const std::string& name, const at::Device& device);
  // No more states from here on; every state's amax moves into one buffer
  // (values kept), so that a data-parallel step reduces them in one
  // collective. Before any capture: the casts read amax's address per call.
  void freeze();

  // The tensors every state's amax lives in: the one buffer after freeze(),
  // before it each state's own (in states()' order). What a data-parallel step
  // reduces by maximum over the ranks before update().
  std::vector<at::Tensor> amax_tensors() const;

  // Whether the norms that open fp8 linears write their codes (block_linear_target);
  // on unless a test turns it off to compare with the casts inside ops::fp8_linear.
  bool fused_casts() const { return fused_casts_; }
  void set_fused_casts(bool on) { fused_casts_ = on; }

  // A layer that ran ops::linear instead (its shape not taken); kept sorted.
  void note_fallback(const std::string& name) { fallbacks_.insert(name); }
  const std::set<std::string>& fallbacks() const { return fallbacks_; }

  // Every state, by name in sorted order.
  const std::map<std::string, ops::Fp8Scaling>& states() const { return states_; }
  // One step's scaling update of every state with the table's margin
  // (ops::fp8_scaling_update: one launch per 512 slots on CUDA), between steps.
  void update() const;

  // "<name>.<tensor>" for every state's named_tensors() (loaded ones not yet
  // used too), plus "history_len" (a scalar): what a checkpoint keeps.
  std::vector<std::pair<std::string, at::Tensor>> named_tensors() const;
  // Tensors named as named_tensors() names them (any device); each state
  // takes its own when made (history length checked: UsageError).
  void load(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // Loaded states no forward has asked for yet (their names).
  std::vector<std::string> unused_loaded() const;

 private:
  int64_t history_len_;
  int margin_;
  bool frozen_ = false;
  bool fused_casts_ = true;
  std::map<std::string, ops::Fp8Scaling> states_;
  at::Tensor amax_flat_;  // every state's amax, back to back (freeze)
  std::map<std::string, std::map<std::string, at::Tensor>> loaded_;  // name -> tensor -> value
  std::set<std::string> fallbacks_;
};

// Where one block application's linears find their fp8 states: the table
// (null: bf16 products) and the application's key ("blocks.3").
struct Fp8Block {
  Fp8States* states = nullptr;
  std::string key;
};

// y = x W^T (+ b) for the linear `layer` ("mlp.fc1") of application f:
// ops::fp8_linear with f's state "<key>.<layer>" where f has a table and
// the shapes are taken, else ops::linear (a table notes the fallback).
at::Tensor block_linear(const Fp8Block& f, const char* layer, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias = at::Tensor());
// The same for an input its producer may have written as codes (x.codes
// defined: for block_linear_target's target; else x.x as above).
at::Tensor block_linear(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x, const at::Tensor& weight,
                        const at::Tensor& bias = at::Tensor());

// The same for a weight given as row blocks [N_i, K] (no bias): ops::fp8_linear
// on the blocks (no concatenation made) where it applies, else
// ops::stacked_linear (the blocks read in place where they lie back to back).
at::Tensor block_linear(const Fp8Block& f, const char* layer, const at::Tensor& x,
                        const std::vector<at::Tensor>& weights);
at::Tensor block_linear(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                        const std::vector<at::Tensor>& weights);

// `layer` (weight, bias) then GELU (tanh) feeding `next_layer` (of
// next_out_features outputs), both in fp8 with the table's casts fused:
// ops::fp8_linear_gelu on the two layers' states, which returns next_layer's
// operand (act's codes, act itself never written). None where either layer
// would not run in fp8 or the casts are not fused (the caller runs
// block_linear and at::gelu).
std::optional<ops::Fp8Operand> block_linear_gelu(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                                                 const at::Tensor& weight, const at::Tensor& bias,
                                                 const char* next_layer, int64_t next_out_features);

// `layer` as the row blocks {gate, up} then SwiGLU feeding `next_layer`,
// likewise: ops::fp8_linear_swiglu, or none where block_linear and
// ops::swiglu run.
std::optional<ops::Fp8Operand> block_linear_swiglu(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                                                   const std::vector<at::Tensor>& weights, const char* next_layer,
                                                   int64_t next_out_features);

// Where the kernel that makes the input x of `layer` (a norm; x of its shape
// and dtype; out_features: the layer's weight rows) writes its E4M3 codes:
// the x slot of the layer's state, where block_linear will run the layer in
// fp8 and the table's casts are fused; else none (the producer writes x, and
// block_linear casts it as before).
std::optional<ops::Fp8Target> block_linear_target(const Fp8Block& f, const char* layer, const at::Tensor& x,
                                                  int64_t out_features);

}  // namespace perftrain::models
