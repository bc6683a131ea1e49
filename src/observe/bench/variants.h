// The training-step variants `perftrain bench` compares, each one switch of
// the speed engine more than the last, so that each row says what one
// optimisation is worth:
//   eager-fp32  fp32 (TF32 matrix products), ATen ops, ATen AdamW, eager
//   eager-bf16  bf16 autocast, otherwise as above (PyTorch's eager AMP)
//   fused       bf16 + fused kernels + the on-device optimizer, eager
//   graph       bf16 + the on-device optimizer + the whole-step CUDA graph
//   all         bf16 + fused kernels + on-device optimizer + CUDA graph
// Plain data here (observe does not know the trainer); the CLI maps a
// Variant onto the step runner's options.
#pragma once

#include <string>
#include <vector>

namespace perftrain::observe::bench {

struct Variant {
  std::string name;
  std::string precision;  // fp32 | bf16 | fp16 | fp8
  bool fused_kernels = false;
  bool fused_optimizer = false;
  bool graph = false;
};

// The names above, in that order.
std::vector<std::string> variant_names();

// "eager-bf16,all" -> those variants, in the order given, without repeats.
// low_precision ("bf16", "fp16" or "fp8") replaces bf16 in the
// mixed-precision variants; fp8 only in those with fused kernels (fused,
// all: fp8 runs in the fused schedule), the others stay bf16. Throws UsageError naming an unknown variant and listing the known.
std::vector<Variant> parse_variants(const std::string& list, const std::string& low_precision = "bf16");

// "a, b,,c" -> {"a", "b", "c"}: comma-separated, blanks trimmed, empties dropped.
std::vector<std::string> split_list(const std::string& list);

}  // namespace perftrain::observe::bench
