// The bf16 matrix-product rate this GPU reaches right now, measured in this
// process: the denominator of MFU. A datasheet peak (989 TFLOP/s dense for an
// H100/H200 SXM) is never reached by cuBLAS on random data, and the clock the
// GPU runs at today moves it; a measured peak makes MFU say "how much of what
// this GPU can do" (the anchors measured about 790 TFLOP/s on the H200).
//
// Method: C = A B with A, B bf16 [n, n] of random normals (random, not zeros:
// the power draw, and so the clock, depends on the bit patterns), 2-3 input
// sets used in turn so no operand stays in L2, a few warm-up products, then
// each product timed by CUDA events on the current stream; the median rate.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace perftrain::observe::bench {

struct MatmulPeakOptions {
  int64_t n = 8192;     // square size: 2 n^3 FLOPs per product
  int warmup = 5;       // untimed products
  int iterations = 20;  // timed products
  int input_sets = 3;   // (A, B) pairs used round-robin
};

struct MatmulPeak {
  std::optional<double> tflops;  // median; empty when not measured
  double ms_median = 0;          // per product
  double tflops_min = 0, tflops_max = 0;
  std::string note;  // why it is n/a, or how it was measured
};

// Measures on a CUDA device; on any other device returns n/a with a note.
// An error on the device (out of memory) becomes n/a with its message too.
MatmulPeak measure_matmul_peak(const at::Device& device, const MatmulPeakOptions& opts = {});

}  // namespace perftrain::observe::bench
