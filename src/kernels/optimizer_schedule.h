// The learning-rate and EMA-decay schedules as closed forms of the step:
// the one definition that the optimizer's prepare kernel evaluates on the
// device inside the captured step (kernels/multi_tensor_adamw.cu, from the
// device step counter), and the host reference and the plain AdamW path
// evaluate on the host (ops/multi_tensor_adamw.cpp, train/lr_schedule.h).
// Plain C++ usable from host code and CUDA device code alike.
//
// lr_at(s, step), step = 1, 2, ... the optimizer step being taken, W the
// warm-up steps, T the total steps (train.steps), base = s.lr:
//   step < W:  base * step / W                       (linear warm-up from 0)
//   then, with t = clamp((step - W) / (T - W), 0, 1) (t = 1 when T <= W):
//   constant:  base
//   cosine:    min + (base - min) * (1 + cos(pi t)) / 2
//   linear:    min + (base - min) * (1 - t)
//   wsd:       base up to S = max(W, T - decay_fraction * T), then with
//              u = clamp((step - S) / (T - S), 0, 1):  min + (base - min) * (1 - sqrt(u))
//              (the "1-sqrt" cool-down of Hägele et al. 2024)
// so the last step (step = T) takes lr_min under cosine, linear and wsd.
//
// ema_decay_at(e, update), update = 0, 1, ... the updates taken before this one:
//   update < start: 0 (the EMA copies the weights);
//   else with v = update - start: min(decay, (1 + v) / (10 + v)) with warm-up, decay without.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define PERFTRAIN_HOST_DEVICE __host__ __device__
#else
#define PERFTRAIN_HOST_DEVICE
#endif

namespace perftrain::kernels {

enum class LrShape : int32_t { kConstant = 0, kCosine = 1, kLinear = 2, kWsd = 3 };

struct LrSchedule {
  double lr = 1e-4;             // the peak (base) learning rate
  double lr_min = 0;            // the floor cosine, linear and wsd decay to
  int64_t warmup_steps = 0;     // W
  int64_t total_steps = 0;      // T (train.steps)
  double decay_fraction = 0.2;  // wsd: the last fraction of T that decays
  LrShape shape = LrShape::kConstant;
};

struct EmaSchedule {
  double decay = 0.9999;
  bool warmup = true;
  int64_t start = 0;  // updates before this one copy the weights
};

PERFTRAIN_HOST_DEVICE inline double schedule_clamp01(double x) { return x < 0 ? 0 : (x > 1 ? 1 : x); }

PERFTRAIN_HOST_DEVICE inline double lr_at(const LrSchedule& s, double step) {
  const double w = static_cast<double>(s.warmup_steps), total = static_cast<double>(s.total_steps);
  if (s.warmup_steps > 0 && step < w) return s.lr * step / w;
  const double span = s.lr - s.lr_min;
  switch (s.shape) {
    case LrShape::kConstant:
      return s.lr;
    case LrShape::kCosine: {
      const double t = total > w ? schedule_clamp01((step - w) / (total - w)) : 1.0;
      return s.lr_min + span * 0.5 * (1.0 + cos(3.14159265358979323846 * t));
    }
    case LrShape::kLinear: {
      const double t = total > w ? schedule_clamp01((step - w) / (total - w)) : 1.0;
      return s.lr_min + span * (1.0 - t);
    }
    case LrShape::kWsd: {
      const double decay_start = fmax(w, total - s.decay_fraction * total);
      if (step <= decay_start) return s.lr;
      const double u = total > decay_start ? schedule_clamp01((step - decay_start) / (total - decay_start)) : 1.0;
      return s.lr_min + span * (1.0 - sqrt(u));
    }
  }
  return s.lr;
}

PERFTRAIN_HOST_DEVICE inline double ema_decay_at(const EmaSchedule& e, double update) {
  const double start = static_cast<double>(e.start);
  if (update < start) return 0.0;
  const double v = update - start;
  if (!e.warmup) return e.decay;
  const double ramp = (1.0 + v) / (10.0 + v);
  return ramp < e.decay ? ramp : e.decay;
}

}  // namespace perftrain::kernels
