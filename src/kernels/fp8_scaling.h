// Delayed scaling for fp8 tensors on the device (issue 39), for many tensors
// ("slots") in one launch, with no host sync (capturable). Per slot, once a
// step, after the step's casts have max-accumulated its amax
// (kernels/fp8_cast.h):
//   a = *amax;  history[1 .. H) = history[0 .. H-1);  history[0] = a   (the roll)
//   m = the max of the finite entries of the rolled history
//   a not finite (NaN, Inf):  scale kept,  events[0] += 1   (overflow)
//   a == 0:                   scale kept,  events[1] += 1   (underflow)
//   else: s = fp8_max / (m * 2^margin), in fp32; s not finite (m subnormal):
//         scale kept, events[1] += 1; else scale = s
//   scale_inv = 1 / scale  (fp32; what the fp8 product multiplies by)
//   *amax = 0              (ready for the next step's casts)
// The history keeps every amax as it came (a non-finite one too: the record
// of what happened), but the max skips non-finite entries, so one bad step
// does not hold the scale for H steps. Every operation is an IEEE fp32
// operation (the max is order-free): the CPU reference
// (ops/fp8_scaling.cpp) gives the same bits.
//
// Launch: one block of 128 threads per slot; the block reads the history
// into shared memory, then writes it shifted by one. Bytes: 2H + ~6 floats
// a slot. The slots travel in a table passed by value as the kernel parameter
// (as kernels/multi_tensor_adamw.h's), up to kFp8ScalingMaxSlots a launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

constexpr int kFp8ScalingMaxSlots = 512;   // per table (~24 KB)
constexpr int kFp8MaxHistory = 1024;       // TransformerEngine's default length

struct Fp8ScalingSlot {
  float* amax;       // 1 float
  float* history;    // history_len floats, [0] the newest
  float* scale;      // 1 float
  float* scale_inv;  // 1 float
  float* events;     // 2 floats: overflow, underflow counts
  int32_t history_len;
  float fp8_max;  // of the slot's format (kernels::fp8_max)
};

struct Fp8ScalingTable {
  int count;
  Fp8ScalingSlot slot[kFp8ScalingMaxSlots];
};
static_assert(sizeof(Fp8ScalingTable) <= 32000, "the table travels as a kernel parameter (32764 bytes at most)");

// margin: the scale's power-of-two headroom (0: the history's max maps to
// fp8_max). Throws std::invalid_argument for a history length outside
// [1, kFp8MaxHistory], a null pointer or a count outside [0, kFp8ScalingMaxSlots].
void fp8_scaling_update(const Fp8ScalingTable& table, int margin, cudaStream_t stream);

}  // namespace perftrain::kernels
