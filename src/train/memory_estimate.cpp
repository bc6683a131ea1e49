#include "train/memory_estimate.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

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

// The fused chained blocks (fused::dit_blocks_chained), from the ops'
// save_for_backward lists: projected_attention keeps its input h, qkv [T,3D],
// the output [T,D] and the log-sum-exp [H,T] fp32; the projection's output
// [T,D] (kept by residual_adaln for the gate's gradient); each residual_adaln
// keeps its x-hat [T,D] and rstd [T] fp32 and hands h2 [T,D] to gelu_mlp,
// which keeps it with pre [T,M] and, unless GELU is recomputed, act [T,M];
// the MLP output [T,D] is kept by the next residual_adaln.
double fused_block_bytes(const BlockShape& s, double e, bool keep_act) {
  return e * s.T * (10 * s.D + (keep_act ? 2 : 1) * s.M) + 2 * 4 * s.T + 4 * s.H * s.T;
}

// In fp8 (train.precision = "fp8", the fused path) a block keeps, in place
// of bf16 rows, the E4M3 codes that fp8_linear saves transposed for dW: of
// the qkv and fc1 (single-stream: gate_up) inputs, which the norms write as
// codes (1 byte for 2 each), of the attention output the projection casts
// (1 byte more: in bf16 it reads the attention's saved output) and of the
// second MLP product's input (1 byte for act's 2; GELU or SwiGLU keeps its
// input, so speed.gelu_recompute changes nothing). Per token: D + M bytes
// fewer than the bf16 block with its activation kept. Measured against the
// allocator peaks of DiT-XL/2 b128 on an H100: 4.29 GiB under bf16, as
// these bytes less the transposed weight codes give.
double fp8_saving_bytes(double tokens, double width, double mlp_width) { return tokens * (width + mlp_width); }

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

// The single-stream blocks (models/single_stream.cpp): S tokens (condition
// and image), D width, F the SwiGLU width, H heads; e the activations'
// element size.
struct SsShape {
  double S, D, F, H;
};

// The fused chained blocks (SingleStreamfused::dit_blocks_chained), from the
// ops' save lists: the qkv product's input h [S,D] and output [S,3D] (q | k
// is qk_norm_rope's input, v attention's, both read in place); qk_norm_rope's
// rstd [S,2H] fp32; cuDNN attention's q | k [S,2D] (qk_norm_rope's output),
// its output [S,D] (which the projection reads in place) and lse [H,S] fp32, and
// the key bias [S] when masked; each of the two residual_rms_adaln its y
// [S,D], its x-hat [S,D] (x1 itself, fp32, when the operands are fp32: e
// bytes either way) and two rstd [S] fp32; the [gate; up] product's input h2
// [S,D]; swiglu's gate_up [S,2F]; down's input [S,F] unless the activation
// is made again in backward (speed.gelu_recompute: ops::swiglu_product_linear).
double ss_fused_block_bytes(const SsShape& s, double e, bool masked, bool keep_act) {
  return e * s.S * (12 * s.D + (keep_act ? 3 : 2) * s.F) + 4 * s.S * (3 * s.H + 4) + (masked ? e * s.S : 0);
}

// The plain blocks (SingleStreamBlock::forward, ATen autograd). Each RMSNorm
// keeps its input as fp32, the normalised rows and their product with the
// weight; the branch inputs h and h2, qkv [S,3D] (v is a view of it), q and k
// through their norms and the rotary (its fp32 input and output), SDPA's
// output and its transposed copy, the SwiGLU's gate, silu(gate), up and their
// product [S,F] each. fp32: the norms' fp32 inputs are the tensors themselves,
// 25 [S,D] tensors in all; 16-bit: 8 fp32 [S,D] (norm and rotary inputs) and
// 21 in the activation dtype. Plus the fp32 rstd rows and SDPA's lse. On the
// CPU the peak resident memory grows by 5 [S,D] tensors a block more, as
// DiT's (15 for 10): what glibc's dynamic mmap threshold keeps of the
// forward's temporaries (the live tensors alone, measured with a fixed
// threshold, are 20% under this estimate).
double ss_plain_block_bytes(const SsShape& s, double a, bool cuda) {
  const double wide = a == 4 ? 4 * (cuda ? 25 : 30) * s.S * s.D : 4 * 8 * s.S * s.D + a * 21 * s.S * s.D;
  return wide + a * 4 * s.S * s.F + 4 * s.S * (4 + 3 * s.H);
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

MemoryEstimate estimate_training_memory(const TrainConfig& cfg, bool cuda, const std::string& precision_in,
                                        int optimizer_shards) {
  const auto& m = cfg.model;
  const auto& sp = cfg.speed;
  const std::string precision = resolved_precision(precision_in, cuda);
  const double P = static_cast<double>(m.parameter_count(true));
  const BlockShape s{static_cast<double>(m.image_size / m.patch) * static_cast<double>(m.image_size / m.patch),
                     static_cast<double>(m.hidden), std::floor(static_cast<double>(m.hidden) * m.mlp_ratio),
                     static_cast<double>(m.heads)};
  const double L = static_cast<double>(m.depth);
  double fixed_tables = 4 * s.T * s.D;  // DiT's pos_embed (single-stream: its rotary tables), model and EMA each
  const double pixels = static_cast<double>(m.in_channels) * m.image_size * m.image_size;  // C*H*W of one sample
  const double out_pixels = static_cast<double>(m.out_channels()) * m.image_size * m.image_size;

  // fp8: bf16 autocast around fp8 products; its codes are counted below
  // (fp8_saving_bytes, the weight codes).
  const bool half = precision == "bf16" || precision == "fp16" || (precision == "fp8" && cuda);
  const double e = half ? 2 : 4;  // activation element size (autocast dtype or fp32)
  const bool fused = cuda && sp.fused_kernels;
  const bool fp8 = precision == "fp8" && fused && !sp.recompute;  // fp8_linear's codes in the fused blocks
  const bool device_optimizer = cuda && sp.fused_optimizer;
  // bf16 copies kept by the device optimizer; otherwise 16-bit casts of the
  // weights made per product (autocast's cache, or compute_weight's cast)
  // and held by autograd until backward: the same bytes.
  const bool shadows = device_optimizer && (precision == "bf16" || precision == "fp8") && sp.fused_kernels;
  // fp8: each linear's transposed weight codes, kept from forward to backward (about P bytes).
  double weight_copies = ((shadows || half) ? 2 * P : 0) + (fp8 ? P : 0);

  double per_block = 0, extra = 0;
  // Backward's working set beyond what is kept: one block's gradients in
  // flight (the residual stream's fp32 gradient twice, dpre [T,M]).
  double working = 2 * 4 * s.T * s.D + e * s.T * s.M;
  // The loader's batches ahead (host memory: counted on the CPU) or the
  // step's static and staging buffers (device memory: counted on CUDA).
  const double batch_copies = cuda ? 2 : static_cast<double>(cfg.data.prefetch) + 1;
  double batches = 4 * pixels * batch_copies;
  if (m.single_stream()) {
    // Its own formulas: S = condition + image tokens, the SwiGLU width, no
    // position table but the rotary tables ([S, hd/2] cos and sin, fp32).
    const SsShape ss{static_cast<double>(m.sequence_tokens()), s.D, static_cast<double>(m.mlp_hidden()), s.H};
    const double hd = s.D / s.H, Tc = static_cast<double>(m.cond_tokens), Dc = static_cast<double>(m.cond_dim);
    const bool masked = m.cond_dim > 0;  // features come with lengths: the key mask
    fixed_tables = 4 * ss.S * hd;
    // Modulations of all blocks and silu(c) [(4L + 2) D]; the condition
    // embedder's fp32 features, norm and weighted norm, and the product's
    // 16-bit input (features only; labels keep their indices).
    const double cond = e * (4 * L + 2) * s.D + (masked ? Tc * Dc * (3 * 4 + e) : 0);
    if (fp8) {
      per_block = ss_fused_block_bytes(ss, e, masked, true) - fp8_saving_bytes(ss.S, ss.D, ss.F);
      extra = e * pixels + 2 * e * ss.S * ss.D + 4 * ss.S + cond;
    } else if (fused && !sp.recompute) {
      per_block = ss_fused_block_bytes(ss, e, masked, !sp.gelu_recompute);
      // The patches' product input, block 0's rms_adaln x-hat and rstd, the final product's input.
      extra = e * pixels + 2 * e * ss.S * ss.D + 4 * ss.S + cond;
    } else if (fused) {
      // Each block's fp32 input kept; in backward one block lives again with
      // its opening rms_adaln's x-hat and its last residual's (unused) one;
      // then the final rms_adaln's x-hat and the product's input.
      per_block = 4 * ss.S * ss.D;
      extra = ss_fused_block_bytes(ss, e, masked, !sp.gelu_recompute) + 4 * e * ss.S * ss.D + e * pixels + cond;
    } else {
      const double a = half ? 2.0 : 4.0;
      const double block = ss_plain_block_bytes(ss, a, cuda);
      per_block = sp.recompute ? a * ss.S * ss.D : block;
      // The patches, the final layer's norm and product on the image tokens.
      extra = (sp.recompute ? block : 0) + 4 * pixels + 3 * 4 * s.T * s.D + cond;
    }
    working = 2 * 4 * ss.S * ss.D + e * ss.S * 3 * ss.F;  // dgate_up [S,2F] and d(swiglu) [S,F]
    if (masked) batches += (4 * Tc * Dc + 8) * batch_copies;  // the features and the length
    // Without the bf16 copies the fused path concatenates the stacked
    // weights (all adaLN, each [gate; up]) on every step and keeps them for
    // backward; in 16-bit that replaces the casts already counted.
    if (fused && !shadows && !half) weight_copies += 4 * L * (4 * s.D * s.D + 2 * ss.F * s.D);
  } else if (fused && !sp.recompute) {
    per_block = fp8 ? fused_block_bytes(s, e, true) - fp8_saving_bytes(s.T, s.D, s.M)
                    : fused_block_bytes(s, e, !sp.gelu_recompute);
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
  const double workspaces = cuda ? 40.0 * 1024 * 1024 : 0;  // cuBLASLt: 32 MiB main stream, 8 MiB side

  // ZeRO-1 (train/sharded_optimizer.h): whole tensors per rank, so about 1/N.
  const double moments = 8 * P / std::max(1, optimizer_shards);
  MemoryEstimate est;
  est.batch_size = cfg.optim.batch_size;
  const double B = static_cast<double>(cfg.optim.batch_size);
  // Gradient accumulation: the activations are one micro-batch's (B), the
  // batch buffers hold all N micro-batches of a step, and the step's noise
  // is drawn for all of them at once (the micro-batch's own is in `extra`).
  const double N = static_cast<double>(cfg.optim.accumulate);
  batches = batches * N + 4 * pixels * (N - 1);
  est.parts = {{"parameters", 4 * P + fixed_tables},
               {"gradients", 4 * P},
               {"optimizer moments", moments},
               {"EMA model", 4 * P + fixed_tables},
               {fp8       ? "bf16 weight copies and fp8 codes"
                : shadows ? "bf16 weight copies"
                : half    ? "16-bit weight casts"
                          : "stacked weight copies",
                weight_copies},
               {"activations", activations * B},
               {"backward working set", working * B + workspaces},
               {"batches", batches * B}};
  est.fixed_bytes = 4 * P + fixed_tables + 4 * P + moments + 4 * P + fixed_tables + weight_copies + workspaces;
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

namespace {

// A byte count from a cgroup file: a number, or infinity for "max", a
// missing file or anything else.
double cgroup_bytes(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.find_first_not_of("0123456789") != std::string::npos) return INFINITY;
  return std::stod(text);
}

// limit - usage of each of `cgroup`'s directories under `mount`, up to the mount itself.
double least_room(const std::string& mount, std::string cgroup, const char* limit_file, const char* usage_file) {
  double room = INFINITY;
  while (true) {
    const std::string dir = mount + (cgroup == "/" ? "" : cgroup);
    const double limit = cgroup_bytes(dir + "/" + limit_file);
    if (std::isfinite(limit)) {
      const double usage = cgroup_bytes(dir + "/" + usage_file);
      room = std::min(room, std::max(0.0, limit - (std::isfinite(usage) ? usage : 0.0)));
    }
    if (cgroup.empty() || cgroup == "/") return room;
    const size_t slash = cgroup.rfind('/');
    cgroup = slash == 0 || slash == std::string::npos ? "/" : cgroup.substr(0, slash);
  }
}

}  // namespace

double cgroup_memory_available(const std::string& cgroup_root, const std::string& proc_cgroup) {
  double room = INFINITY;
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "<id>:<controllers>:<path>"; v2 is "0::<path>", v1's memory line names "memory".
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",", path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (controllers == ",,")
      room = std::min(room, least_room(cgroup_root, path, "memory.max", "memory.current"));
    else if (controllers.find(",memory,") != std::string::npos)
      room = std::min(room, least_room(cgroup_root + "/memory", path, "memory.limit_in_bytes",
                                       "memory.usage_in_bytes"));
  }
  return room;
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
  std::ifstream self("/proc/self/cgroup");
  std::stringstream proc_cgroup;
  proc_cgroup << self.rdbuf();
  const double cgroup = cgroup_memory_available("/sys/fs/cgroup", proc_cgroup.str());
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return cgroup;
  // The cgroup's usage counts this program already: no reserve against it.
  return std::min(cgroup, std::max(0.0, static_cast<double>(pages) * static_cast<double>(page) - kCpuReserveBytes));
}

void check_memory_fits(const TrainConfig& cfg, bool cuda, const std::string& precision, double available_bytes,
                       int optimizer_shards) {
  const MemoryEstimate est = estimate_training_memory(cfg, cuda, precision, optimizer_shards);
  if (est.total_bytes() <= available_bytes) return;
  const std::string where = cuda ? "the GPU has " + bytes_text(available_bytes) + " free for it"
                                 : "this machine has " + bytes_text(available_bytes) +
                                       " of memory for it (physical memory, or what its cgroup's limit leaves)";
  std::string suggestion;
  if (!cfg.speed.recompute) {
    TrainConfig with = cfg;
    with.speed.recompute = true;
    const MemoryEstimate r = estimate_training_memory(with, cuda, precision, optimizer_shards);
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
