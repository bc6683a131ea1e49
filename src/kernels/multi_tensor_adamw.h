// The optimizer step on the device in three launches over every parameter
// tensor, with no host sync (so a whole training step captures in a CUDA graph):
//   (1) adamw_sum_squares: per-block partial sums of grad^2 into a buffer;
//   (2) adamw_prepare: one block sums the partials in a fixed order
//       (deterministic), then computes the step's scalars: the unscaled norm,
//       inf/NaN detection, the fp16 loss-scale update, the step counter, the
//       LR, the clip coefficient, the bias corrections and the EMA weight;
//   (3) adamw_update: AdamW and the EMA in one pass over each element
//       (reads p, g, m, v, ema; writes p, m, v, ema: 36 bytes and ~20 FLOPs
//       an element, so it runs at copy bandwidth), and, where a tensor has
//       one, its bf16 shadow: the copy the next forward's matrix products
//       read (2 more bytes an element instead of a separate cast per layer
//       and step: one launch, no re-read of p).
// The tensors are found through a table passed by value as a kernel parameter
// (CUDA 12.1+ allows 32 KB of them on sm_90): a block takes fixed chunks of
// kAdamWChunk elements and finds its tensor by binary search in the prefix sum
// of chunk counts. 16-byte vector loads where a tensor's pointers allow.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/chunk_table.h"
#include "kernels/optimizer_schedule.h"

namespace perftrain::kernels {

constexpr int kAdamWChunk = 65536;     // elements per block task
constexpr int kAdamWMaxTensors = 384;  // per table (a table is ~20 KB)

// One parameter tensor, float32, contiguous, n elements. g == nullptr: the
// parameter had no gradient (only its EMA follows it); ema == nullptr: no EMA;
// shadow == nullptr: no bf16 copy to keep (else it is rewritten from p
// wherever p changes). decay 0: no weight decay on this tensor (its group).
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  float* ema;
  __nv_bfloat16* shadow;
  int64_t n;
  int32_t decay;
};

// Chunks of kAdamWChunk elements: chunk_end holds the prefix sums of ceil(n / kAdamWChunk).
using AdamWTable = ChunkTable<AdamWTensor, kAdamWMaxTensors>;
static_assert(sizeof(AdamWTable) <= 32000, "the table travels as a kernel parameter (32764 bytes at most)");

// The step's scalars, in device memory (float32 slots, so the op layer can
// show each one as a 0-d tensor). Written by adamw_prepare; the state part
// (loss_scale .. good_steps) persists between steps.
struct AdamWScalars {
  float loss_scale;  // the scale this step's gradients carry (1 without dynamic scaling); updated for the next
  float grad_norm;   // of the unscaled gradients, before clipping
  float lr;          // of the last step (the schedule's value; a skipped step's too)
  float skipped;     // steps skipped for inf/NaN gradients, in total
  float step;        // updates taken (AdamW's step counter)
  float good_steps;  // finite steps since the last scale change
  // Derived for adamw_update:
  float skip;           // 1: this step is skipped
  float coef;           // gradient multiplier: 1/loss_scale * clip coefficient
  float step_size;      // lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float lr_wd;          // lr * weight_decay (p -= lr_wd * p, on the tensors with decay)
  float ema_weight;     // 1 - ema decay (lerp weight)
  float schedule_step;  // steps taken, skipped ones too: the LR schedule's position
};
constexpr int kAdamWScalarSlots = sizeof(AdamWScalars) / sizeof(float);

struct AdamWHyper {
  LrSchedule lr_schedule;  // evaluated at schedule_step (kernels/optimizer_schedule.h)
  EmaSchedule ema;         // evaluated at step - 1
  double beta1, beta2, eps, weight_decay;
  double grad_clip;  // 0: off
  int64_t growth_interval;
  bool dynamic_loss_scale;
  bool skip_nonfinite;  // without the dynamic scale: an inf/NaN norm skips the update (skipped += 1)
};

// Blocks for a table of `chunks` chunks on the current device (a few per SM;
// fixed for the life of a table so the reduction order never changes).
int adamw_grid(int chunks);
// Fills partials[0 .. grid) (grid <= table.chunks, fixed by the caller).
void adamw_sum_squares(const AdamWTable& table, double* partials, int grid, cudaStream_t stream);
// Sums partials[0 .. count) and writes *scalars; count -1: the norm was not
// computed, grad_norm is NaN (the caller has no clipping or dynamic scale).
void adamw_prepare(const double* partials, int count, AdamWScalars* scalars, const AdamWHyper& hyper,
                   cudaStream_t stream);
// Applies the update described by *scalars (nothing when scalars->skip).
void adamw_update(const AdamWTable& table, const AdamWScalars* scalars, const AdamWHyper& hyper, int grid,
                  cudaStream_t stream);

}  // namespace perftrain::kernels
