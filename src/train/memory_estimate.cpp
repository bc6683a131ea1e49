#include "train/memory_estimate.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace perftrain::train {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// CUDA context, cuBLAS/cuDNN handles and workspaces outside the caching
// allocator's count (about 0.6 GiB measured on an H200), with room to spare.
constexpr double kCudaReserveBytes = 1.0 * kGiB;
// The program itself on the CPU: libtorch's code and runtime (about 0.3 GiB
// of resident memory before the model).
constexpr double kCpuReserveBytes = 0.5 * kGiB;

// Bytes autograd keeps per sample for one DiT block, by path. T tokens, D
// width, M MLP width, H heads; e the activations' element size.
struct BlockShape {
  double T, D, M, H;
};

// The fused chained blocks (DiT::run_blocks_chained), from the ops'
// save_for_backward lists: projected_attention keeps its input h, qkv [T,3D],
// the output [T,D] and the log-sum-exp [H,T] fp32; the projection's output
// [T,D] (kept by residual_adaln for the gate's gradient); each residual_adaln
// keeps its x-hat [T,D] and rstd [T] fp32 and hands h2 [T,D] to gelu_mlp,
// which keeps it with pre [T,M] and, unless GELU is recomputed, act [T,M];
// the MLP output [T,D] is kept by the next residual_adaln.
double fused_block_bytes(const BlockShape& s, double e, bool keep_act) {
  return e * s.T * (10 * s.D + (keep_act ? 2 : 1) * s.M) + 2 * 4 * s.T + 4 * s.H * s.T;
}

// The plain blocks (DiTBlock::forward, ATen autograd; the CPU, or
// speed.fused_kernels off): fp32 x, both LayerNorm outputs and x1 (r = 4
// bytes); in the activation dtype a, 15 [T, D] tensors: the three products'
// inputs, qkv and its per-head copies, the attention output and its
// transposed copy, both gated branches, and what the attention's backward
// keeps besides (the count measured against the peak resident memory of CPU
// runs of DiT-S/2 and S/4); pre and act of the MLP. On CUDA, SDPA's fused
// kernels keep only the output and its log-sum-exp: 10 [T, D] tensors there
// (measured against the allocator peak of DiT-S/2 b128 on the H200).
double plain_block_bytes(const BlockShape& s, double a, bool cuda) {
  constexpr double r = 4;
  const double kept = cuda ? 10 : 15;
  return r * 4 * s.T * s.D + a * (kept * s.T * s.D + 2 * s.T * s.M) + 4 * 4 * s.T + 4 * s.H * s.T;
}

std::string resolved_precision(const std::string& precision, bool cuda) {
  if (precision == "auto") return cuda ? "bf16" : "fp32";
  return precision;
}

}  // namespace

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char text[64];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return text;
}

std::string MemoryEstimate::breakdown() const {
  std::string out;
  for (const auto& [what, bytes] : parts) {
    if (bytes <= 0) continue;
    out += (out.empty() ? "" : ", ") + what + " " + bytes_text(bytes);
  }
  return out;
}

MemoryEstimate estimate_training_memory(const TrainConfig& cfg, bool cuda, const std::string& precision_in) {
  const auto& m = cfg.model;
  const auto& sp = cfg.speed;
  const std::string precision = resolved_precision(precision_in, cuda);
  const double P = static_cast<double>(m.parameter_count(true));
  const BlockShape s{static_cast<double>(m.image_size / m.patch) * static_cast<double>(m.image_size / m.patch),
                     static_cast<double>(m.hidden), std::floor(static_cast<double>(m.hidden) * m.mlp_ratio),
                     static_cast<double>(m.heads)};
  const double L = static_cast<double>(m.depth);
  const double pos_embed = 4 * s.T * s.D;  // fixed buffer, in the model and in the EMA
  const double pixels = static_cast<double>(m.in_channels) * m.image_size * m.image_size;  // C*H*W of one sample
  const double out_pixels = static_cast<double>(m.out_channels()) * m.image_size * m.image_size;

  const bool half = precision == "bf16" || precision == "fp16";
  const double e = half ? 2 : 4;  // activation element size (autocast dtype or fp32)
  const bool fused = cuda && sp.fused_kernels;
  const bool device_optimizer = cuda && sp.fused_optimizer;
  // bf16 copies kept by the device optimizer; otherwise 16-bit casts of the
  // weights made per product (autocast's cache, or compute_weight's cast)
  // and held by autograd until backward: the same bytes.
  const bool shadows = device_optimizer && precision == "bf16" && sp.fused_kernels;
  const double weight_copies = (shadows || half) ? 2 * P : 0;

  double per_block = 0, extra = 0;
  if (fused && !sp.recompute) {
    per_block = fused_block_bytes(s, e, !sp.gelu_recompute);
    // Patch-embedding input, the first adaLN LayerNorm's fp32 input, the
    // final product's input.
    extra = e * pixels + 4 * s.T * s.D + e * s.T * s.D;
  } else {
    // Per-block recompute keeps each block's fp32 input; in backward one
    // block's activations live again (with its own first LayerNorm's input).
    const double block = fused ? fused_block_bytes(s, e, !sp.gelu_recompute) + 4 * s.T * s.D
                               : plain_block_bytes(s, half ? 2.0 : 4.0, cuda);
    per_block = sp.recompute ? 4 * s.T * s.D : block;
    extra = (sp.recompute ? block : 0) + 4 * pixels + 3 * 4 * s.T * s.D;  // + the final layer's LayerNorm and product
  }
  // The objective's per-sample tensors (noise, x_t, target, prediction, loss terms).
  extra += 8 * 4 * out_pixels;
  const double activations = L * per_block + extra;
  // Backward's working set beyond what is kept: one block's gradients in
  // flight (the residual stream's fp32 gradient twice, dpre [T,M]).
  const double working = 2 * 4 * s.T * s.D + e * s.T * s.M;
  // The loader's batches ahead (host memory: counted on the CPU) or the
  // step's static and staging buffers (device memory: counted on CUDA).
  const double batches = 4 * pixels * (cuda ? 2 : static_cast<double>(cfg.data.prefetch) + 1);
  const double workspaces = cuda ? 40.0 * 1024 * 1024 : 0;  // cuBLASLt: 32 MiB main stream, 8 MiB side

  MemoryEstimate est;
  est.batch_size = cfg.optim.batch_size;
  const double B = static_cast<double>(cfg.optim.batch_size);
  est.parts = {{"parameters", 4 * P + pos_embed},
               {"gradients", 4 * P},
               {"optimizer moments", 8 * P},
               {"EMA model", 4 * P + pos_embed},
               {shadows ? "bf16 weight copies" : "16-bit weight casts", weight_copies},
               {"activations", activations * B},
               {"backward working set", working * B + workspaces},
               {"batches", batches * B}};
  est.fixed_bytes = 4 * P + pos_embed + 4 * P + 8 * P + 4 * P + pos_embed + weight_copies + workspaces;
  est.per_sample_bytes = activations + working + batches;
  return est;
}

int64_t largest_batch_that_fits(const MemoryEstimate& est, double available_bytes) {
  if (est.per_sample_bytes <= 0) return 0;
  const double room = available_bytes - est.fixed_bytes;
  if (room < est.per_sample_bytes) return 0;
  const double b = std::floor(room / est.per_sample_bytes);
  return b > 9.0e18 ? INT64_MAX : static_cast<int64_t>(b);
}

double memory_available_for_training(bool cuda) {
  if (cuda) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();  // clear it: the run's own CUDA calls will report a real failure
      return INFINITY;
    }
    return std::max(0.0, static_cast<double>(free) - kCudaReserveBytes);
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return INFINITY;
  return std::max(0.0, static_cast<double>(pages) * static_cast<double>(page) - kCpuReserveBytes);
}

void check_memory_fits(const TrainConfig& cfg, bool cuda, const std::string& precision, double available_bytes) {
  const MemoryEstimate est = estimate_training_memory(cfg, cuda, precision);
  if (est.total_bytes() <= available_bytes) return;
  const std::string where = cuda ? "the GPU has " + bytes_text(available_bytes) + " free for it"
                                 : "this machine has " + bytes_text(available_bytes) + " of memory";
  std::string suggestion;
  if (!cfg.speed.recompute) {
    TrainConfig with = cfg;
    with.speed.recompute = true;
    const MemoryEstimate r = estimate_training_memory(with, cuda, precision);
    if (r.total_bytes() <= available_bytes)
      suggestion = "speed.recompute=true (--recompute) fits it (about " + bytes_text(r.total_bytes()) + "); ";
  }
  const int64_t largest = largest_batch_that_fits(est, available_bytes);
  if (largest > 0) suggestion += "the largest batch that fits is " + std::to_string(largest) + " (--batch-size " +
                                 std::to_string(largest) + ")";
  else suggestion += "not even a batch of 1 fits: choose a smaller model";
  throw UsageError("train.batch_size " + std::to_string(cfg.optim.batch_size) + " needs about " +
                   bytes_text(est.total_bytes()) + " (" + est.breakdown() + ") but " + where + "; " + suggestion);
}

}  // namespace perftrain::train
