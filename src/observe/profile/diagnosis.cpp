#include "observe/profile/diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace perftrain::observe::profile {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0, double e = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a, b, c, d, e);
  return buf;
}

double share(double ms, const StepAnalysis& a) { return a.step_ms > 0 ? ms / a.step_ms : 0; }

// The advice is in PyTorch's terms for any program but perftrain's own step.
bool pytorch(const RunFacts& f) { return f.program == Program::kPyTorch; }

double phase_ms(const StepAnalysis& a, const std::string& p) {
  for (const auto& x : a.busy_by_phase)
    if (x.phase == p) return x.ms;
  return 0;
}

// What the rules read besides the step's analysis and the run's facts: the
// accounting against the unprofiled step.
struct Inputs {
  StepAccounting acc;
  bool corrected;  // the idle time is without the profiler's cost
  double busy;     // GPU busy ms, at least 1e-9
};

std::string launch_advice(const StepAnalysis& a, const RunFacts& f) {
  if (a.captured)
    return pytorch(f) ? "the step already replays CUDA graphs: the gaps are between the graphs' own kernels or between "
                        "graphs (graph breaks: TORCH_LOGS=graph_breaks names them); fewer and larger kernels "
                        "(torch.compile's fusion, mode=\"max-autotune\"), or a larger batch, fill them"
                      : "the step is already one graph launch: the gaps are between the graph's own kernels; a larger "
                        "batch, or fewer and larger kernels (fusion), fill them";
  const std::string n = fmt("%.0f", a.kernels_per_step);
  if (pytorch(f))
    return "capture the step in CUDA graphs, one launch instead of " + n +
           ": torch.compile(model, mode=\"reduce-overhead\") (or perftrain.capture_step, or torch.cuda.graphs), "
           "with torch.optim.AdamW(..., fused=True, capturable=True) so the optimizer is a few kernels with no host "
           "sync" +
           (f.compiled ? "" : "; torch.compile's default mode also fuses the elementwise kernels") +
           "; a larger batch makes each kernel longer";
  return "capture the step in one CUDA graph (speed.graph=true, which needs speed.fused_optimizer=true): "
         "one launch per step instead of " + n +
         (f.fused_kernels ? "" : "; fuse the blocks' small kernels (speed.fused_kernels=true)") +
         "; a larger batch makes each kernel longer";
}

// Launch-bound: the GPU waits for the host between kernels (a quarter of
// the step or more) and the kernels are short or many. The profiler's own
// cost (CUPTI's records per kernel, the recording of each op) shows up as
// idle time between kernels: where the unprofiled step was timed, it is
// taken out and the share is of the unprofiled step.
void launch_bound(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  const StepAccounting& acc = in.acc;
  const bool corrected = in.corrected;
  const double idle = acc.idle_without_profiler_share;
  if (!a.cpu_only && a.kernels_per_step > 0 && idle >= 0.25 &&
      (a.median_kernel_us < 25 || a.kernels_per_step >= 500 || a.launch_cpu_ms >= 0.7 * a.gpu_busy_ms)) {
    Finding x{"launch-bound", "launch-bound: the GPU is idle between kernels for " + fmt("%.0f%%", 100 * idle) +
                                  " of the step" + (corrected ? " (without the profiler's cost)" : ""),
              "", "", idle};
    if (corrected)
      x.evidence = fmt("GPU idle between kernels about %.3f ms of the unprofiled %.3f ms step (%.3f ms in the trace, "
                       "less the profiler's %.3f ms per step); ",
                       acc.idle_without_profiler_ms, acc.unprofiled_ms, a.idle_other_ms, acc.overhead_ms);
    else
      x.evidence = fmt("GPU idle between kernels %.3f ms of %.3f ms per step (the profiler's own cost included: the "
                       "unprofiled step was not timed); ",
                       a.idle_other_ms, a.step_ms);
    x.evidence += fmt("%.0f kernels per step, median %.1f us; %.3f ms/step of CPU time in launch calls against "
                      "%.3f ms of GPU work",
                      a.kernels_per_step, a.median_kernel_us, a.launch_cpu_ms, a.gpu_busy_ms);
    x.advice = launch_advice(a, f);
    out.push_back(x);
  }
}

// Data-bound: the GPU idles while the host waits for the next batch.
void data_bound(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  const double data = std::max(share(a.idle_data_ms, a), share(a.data_wait_ms, a));
  if (data >= 0.10) {
    Finding x{"data-bound", "data-bound: the step waits for the loader " + fmt("%.0f%%", 100 * data) + " of the time",
              fmt("host time waiting for a batch %.3f ms/step; GPU idle meanwhile %.3f ms/step of %.3f ms",
                  a.data_wait_ms, a.idle_data_ms, a.step_ms),
              "", data};
    if (a.blocking_h2d_ms > 0)
      x.evidence += fmt("; %.3f ms/step of the wait in host-to-device copies from pageable memory (the host "
                        "blocks in each)",
                        a.blocking_h2d_ms);
    if (pytorch(f))
      x.advice = "load ahead of the step: DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, "
                 "prefetch_factor=2 or more) and batch.to(device, non_blocking=True), so the copy of a pinned batch "
                 "overlaps the GPU's work; precompute what is the same every epoch (VAE latents) instead of "
                 "decoding or encoding it in the step";
    else
      x.advice = "prepare batches ahead (data.prefetch, now " + std::to_string(f.prefetch) +
                 "; more loader threads), keep batches in pinned memory for asynchronous copies, and train on "
                 "pre-extracted latents (data.source=latents) instead of decoding or encoding on the fly";
    out.push_back(x);
  }
}

// Memory-bound elementwise work: non-matrix, non-attention kernels take a
// third or more of the GPU's busy time.
void elementwise(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  const double elem = a.elementwise_ms / in.busy;
  if (!a.cpu_only && elem >= 0.35) {
    Finding x{"elementwise", "memory-bound elementwise work: " + fmt("%.0f%%", 100 * elem) +
                                 " of GPU time is outside matrix products and attention",
              fmt("%.3f ms/step in norms, activations, residuals, casts and reductions against %.3f ms of matrix "
                  "products and %.3f ms of attention; these kernels are limited by memory bandwidth (bytes read and "
                  "written once each), not by arithmetic",
                  a.elementwise_ms, a.matrix_ms, a.attention_ms),
              "", elem * share(a.gpu_busy_ms, a)};
    if (pytorch(f))
      x.advice = f.compiled ? "already compiled: check for graph breaks (TORCH_LOGS=graph_breaks) that leave parts "
                              "eager, try mode=\"max-autotune\", or replace the blocks with fused modules "
                              "(perftrain.nn: adaLN LayerNorm, gated residual, bias-GELU in one pass each)"
                            : "torch.compile(model) fuses chains of elementwise ops into one Triton kernel each; "
                              "perftrain.nn's fused modules (adaLN LayerNorm, gated residual, bias-GELU) do it "
                              "for a DiT block";
    else
      x.advice = f.fused_kernels ? "fuse further: fold the remaining elementwise ops into matrix-product epilogues or "
                                 "into the fused norm/residual kernels (docs/design.md, adding a fused op)"
                               : "turn on the fused kernels (speed.fused_kernels=true): LayerNorm, modulation, gate "
                                 "and residual in one pass, GELU and bias in the products' epilogues";
    out.push_back(x);
  }
}

// Matrix-bound: matrix products and attention fill the step.
void matrix_bound(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  const double mat = (a.matrix_ms + a.attention_ms) / in.busy;
  const double idle_all = in.corrected ? (a.idle_data_ms + in.acc.idle_without_profiler_ms) / in.acc.unprofiled_ms
                                       : share(a.idle_data_ms + a.idle_other_ms, a);
  if (!a.cpu_only && mat >= 0.6 && idle_all < 0.15) {
    Finding x{"matrix-bound", "matrix-bound: " + fmt("%.0f%%", 100 * mat) +
                                  " of GPU time is matrix products and attention, the GPU idle " +
                                  fmt("%.0f%%", 100 * idle_all),
              "", "", mat * share(a.gpu_busy_ms, a)};
    x.evidence = fmt("matrix products %.3f ms, attention %.3f ms per step of %.3f ms", a.matrix_ms, a.attention_ms,
                     a.step_ms);
    if (f.train_flops_per_step > 0) {
      const double step_tf = f.train_flops_per_step / (a.step_ms * 1e-3) / 1e12;
      const double mat_tf = f.train_flops_per_step / ((a.matrix_ms + a.attention_ms) * 1e-3) / 1e12;
      x.evidence += fmt("; the step achieves %.0f TFLOP/s, %.0f TFLOP/s while in matrix and attention kernels",
                        step_tf, mat_tf);
      if (f.peak_tflops)
        x.evidence += fmt(" (%.0f%% and %.0f%% of the %.0f TFLOP/s bf16 peak measured in this run)",
                          100 * step_tf / *f.peak_tflops, 100 * mat_tf / *f.peak_tflops, *f.peak_tflops);
    }
    x.advice = "the step is where it should be: what is left is the matrix units' rate; less work (fewer tokens, "
               "smaller patches only where the quality allows), better tiles for the shapes that run below the "
               "peak (the op table's slowest products), or a lower precision";
    if (pytorch(f))
      x.advice += std::string("; in PyTorch: bf16 autocast where products still run in fp32, ") +
                  (f.compiled ? "mode=\"max-autotune\" to search tiles" : "torch.compile(mode=\"max-autotune\") to search tiles") +
                  ", scaled_dot_product_attention for attention (flash or cuDNN kernels)";
    out.push_back(x);
  }
}

// Power-capped: most samples at the power limit.
void power_capped(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  if (f.gpu.count > 0 && f.gpu.at_power_limit && *f.gpu.at_power_limit >= 0.5) {
    Finding x{"power-capped", "power-capped: the GPU ran at its power limit in " +
                                  fmt("%.0f%%", 100 * *f.gpu.at_power_limit) + " of the samples",
              "GPU " + bench::describe(f.gpu), "", 0.5};
    if (f.gpu.sm_clock_mhz_median && f.gpu.sm_clock_max_mhz) {
      const double c = *f.gpu.sm_clock_mhz_median, m = *f.gpu.sm_clock_max_mhz;
      x.evidence += fmt("; the cap allows a %.0f MHz SM clock, %.0f%% of the %.0f MHz maximum", c, 100 * c / m, m);
      if (f.peak_tflops && f.peak_clock_mhz && *f.peak_clock_mhz > 0)
        x.evidence += fmt("; the %.0f TFLOP/s peak was measured at %.0f MHz, so about %.0f TFLOP/s at the step's clock",
                          *f.peak_tflops, *f.peak_clock_mhz, *f.peak_tflops * c / *f.peak_clock_mhz);
    }
    x.advice = std::string("the limit is electrical, not the code: compare runs at equal clocks (") +
               (pytorch(f) ? "a cool-down between runs, or nvidia-smi --lock-gpu-clocks" : "perftrain bench --cooldown") + "), "
               "count achieved FLOP/s against the capped clock's peak, and cut work that draws power without "
               "progress (recomputation, fp32 products)";
    out.push_back(x);
  }
}

// Alignment: tensor cores want product dimensions that are multiples of 8
// (16 bytes of bf16); our attention kernels want head dims of 64.
void alignment(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  std::string bad;
  for (const auto& [name, d] : f.matrix_dims)
    if (d % 8 != 0) bad += (bad.empty() ? "" : ", ") + name + " = " + std::to_string(d);
  std::string heads;
  for (const auto& [name, d] : f.head_dims)
    if (d % 64 != 0) heads += (heads.empty() ? "" : ", ") + name + " = " + std::to_string(d);
  if (!bad.empty() || !heads.empty()) {
    Finding x{"alignment", "product dimensions off the tensor cores' grain", "", "", 0.02};
    if (!bad.empty()) x.evidence = "not multiples of 8: " + bad;
    if (!heads.empty()) x.evidence += std::string(x.evidence.empty() ? "" : "; ") + "not multiples of 64: " + heads;
    x.advice = "pad or choose sizes that are multiples of 8 (64 for head dims and the hidden width): "
               "a ragged edge runs in a slower tile or a padded copy";
    out.push_back(x);
  }
}

// Host syncs inside the step: the host waits for the GPU, then the GPU for the host.
void host_syncs(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  if (!a.syncs.empty() && a.syncs_per_step > 0) {
    Finding x{"host-syncs", fmt("host syncs inside the step: %.1f per step", a.syncs_per_step), "", "",
              std::min(1.0, 0.05 * a.syncs_per_step)};
    for (size_t i = 0; i < a.syncs.size() && i < 5; ++i) {
      const auto& s = a.syncs[i];
      x.evidence += (i ? "; " : "") + std::to_string(s.count) + " x " + s.call + (s.op.empty() ? "" : " in " + s.op) +
                    " (" + s.phase + ")";
    }
    if (a.syncs_per_step < 1)
      x.advice = "fewer than one per step: a periodic read-back (the loss once per log window); fine unless the "
                 "window is short";
    else if (pytorch(f))
      x.advice = "remove reads of device values from the step (loss.item(), .cpu(), print(loss), a Python if on a "
                 "tensor, torch.cuda.synchronize()): keep the loss on the device and read it every N steps; "
                 "torch.optim.AdamW(..., capturable=True) keeps its step count on the device";
    else
      x.advice = "remove reads of device values from the step (.item(), .cpu(), printing a loss): keep them on the "
                 "device and read once per log window; the device optimizer (speed.fused_optimizer) has none";
    if (a.syncs_per_step < 1) x.weight = 0.01;
    out.push_back(x);
  }
}

// fp32 matrix work in a mixed-precision run.
void fp32_matmul(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  if (!a.cpu_only && f.precision != "fp32" &&
      (a.fp32_matrix_ms >= 0.05 * std::max(a.matrix_ms, 1e-9) || a.fp32_matrix_ops > 0) &&
      (a.fp32_matrix_ms > 0 || a.fp32_matrix_ops > 0)) {
    Finding x{"fp32-matmul",
              f.precision.empty() ? "matrix products in fp32/TF32: the tensor cores run bf16 at about twice the rate"
                                  : "fp32 where " + f.precision + " was meant",
              "", "", share(a.fp32_matrix_ms, a)};
    x.evidence = fmt("%.3f ms/step in fp32/TF32 matrix kernels (%.0f%% of matrix time)", a.fp32_matrix_ms,
                     100 * a.fp32_matrix_ms / std::max(a.matrix_ms, 1e-9));
    if (a.fp32_matrix_ops > 0) x.evidence += "; " + std::to_string(a.fp32_matrix_ops) + " matrix ops on float inputs";
    x.advice = pytorch(f) ? "run the forward and the loss under torch.autocast(\"cuda\", dtype=torch.bfloat16) (the "
                            "backward follows); where fp32 must stay, torch.set_float32_matmul_precision(\"high\") "
                            "for TF32; record_shapes=True in torch.profiler names the products with float inputs "
                            "(--group-by op)"
                          : "run that part under autocast, or cast its weights: the op table grouped by op "
                            "(--group-by op, with --record-shapes) names the products with float inputs";
    out.push_back(x);
  }
}

// Allocator churn: device allocations inside steady steps.
void allocator_churn(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  if (a.device_mallocs + a.device_frees > 0 || f.alloc_retries > 0) {
    Finding x{"allocator-churn", "allocator churn: the caching allocator goes to the driver inside the steps", "", "",
              0.05};
    x.evidence = std::to_string(a.device_mallocs) + " cudaMalloc and " + std::to_string(a.device_frees) +
                 " cudaFree calls in the window";
    if (f.alloc_retries > 0)
      x.evidence += "; " + std::to_string(f.alloc_retries) + " allocation retries (cache flushed to fit)";
    x.advice = std::string("keep shapes fixed from step to step, do not empty the cache inside the loop, leave "
                           "memory headroom (a smaller batch, ") +
               (pytorch(f) ? "activation checkpointing" : "speed.gelu_recompute") +
               "), or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
    out.push_back(x);
  }
}

// Recompute: backward beyond the usual twice the forward.
void recompute(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  const double fwd = phase_ms(a, "forward"), bwd = phase_ms(a, "backward");
  if ((f.recompute || f.gelu_recompute) && fwd > 0 && bwd > 2 * fwd) {
    const double cost = bwd - 2 * fwd;
    Finding x{"recompute", fmt("recomputation costs about %.3f ms per step (%.0f%%)", cost, 100 * share(cost, a)),
              fmt("backward %.3f ms against forward %.3f ms (without recompute backward is about twice forward)", bwd,
                  fwd),
              "", share(cost, a)};
    if (f.peak_reserved_gib && f.memory_total_gib)
      x.evidence += fmt("; peak reserved %.1f GiB of %.1f GiB", *f.peak_reserved_gib, *f.memory_total_gib);
    x.advice = std::string("turn ") + (f.recompute ? "speed.recompute" : "speed.gelu_recompute") +
               " off if the memory allows it; it trades this time for activation memory";
    out.push_back(x);
  }
}

// The step is one graph launch: say so, and how to see its phases.
void captured(const StepAnalysis& a, const RunFacts& f, const Inputs& in, std::vector<Finding>& out) {
  if (a.captured) {
    Finding x{"captured", pytorch(f) ? "the step replays CUDA graphs" : "each step is one CUDA graph launch", "",
              pytorch(f) ? "profile the same step without the graphs (torch.compile's default mode, or eager) for the "
                           "split by phase"
                         : "profile an eager window of the same step (--profile-uncaptured) for the split by phase",
              0};
    x.evidence = std::to_string(a.graph_launches) + " graph launches in " + std::to_string(a.steps) +
                 " steps; the kernels inside are replayed by the GPU alone, so they are not split into forward, "
                 "backward and optimizer";
    out.push_back(x);
  }
}

}  // namespace

std::vector<Finding> diagnose(const StepAnalysis& a, const RunFacts& f) {
  std::vector<Finding> out;
  if (a.step_ms <= 0) return out;
  const StepAccounting acc = account(a, f.measured);
  const Inputs in{acc, acc.has_profiled && acc.has_unprofiled, std::max(a.gpu_busy_ms, 1e-9)};
  for (auto rule : {launch_bound, data_bound, elementwise, matrix_bound, power_capped, alignment, host_syncs,
                    fp32_matmul, allocator_churn, recompute, captured})
    rule(a, f, in, out);
  std::stable_sort(out.begin(), out.end(), [](const Finding& x, const Finding& y) { return x.weight > y.weight; });
  return out;
}

std::string format_findings(const std::vector<Finding>& findings) {
  if (findings.empty()) return "Nothing stands out: no rule fired.\n";
  std::ostringstream s;
  int i = 0;
  for (const auto& f : findings)
    s << ++i << ". **" << f.id << "**: " << f.title << "\n   - evidence: " << f.evidence << "\n   - try: " << f.advice
      << "\n";
  return s.str();
}

}  // namespace perftrain::observe::profile
