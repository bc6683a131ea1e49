// The whole-head attention backward (kernels::attention_head_bwd_sm90)
// against float64, torch-free. Random bf16 q, k, v and dO for a few
// (sample, head) pairs at head dims 64 and 72; the forward's O and
// log-sum-exp and the three gradients in float64 on the CPU; the kernel's
// packed dq/dk/dv (output and every SM's shared memory poisoned with NaN
// first, three runs that must agree to the bit) against them. Then the time
// per call at the b256 shapes of DiT-B/2, S/2 (head dim 64) and XL/2 (72).
//   attention_bwd_check checks   the float64 checks only: the ctest
//                                kernels.attention_head_bwd_float64 (label
//                                gpu; exit 77, skipped, without an sm_90 GPU)
//   attention_bwd_check time     the timings only
//   attention_bwd_check          both
// Build: cmake --build build --target attention_bwd_check (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=attention_bwd_check [LAB_ARGS=checks] [SANITIZE=1] [NCU=1
// NCU_KERNEL=attention_head_bwd NCU_SKIP=5] (with `time`, launch 5 of the
// kernel is B/2's first timed one; each shape takes 145 launches).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kernels/attention_head_bwd_sm90.h"

using bf16 = __nv_bfloat16;

constexpr int kT = perftrain::kernels::kHeadBwdTokens;

static float bf(bf16 v) { return __bfloat162float(v); }

struct Problem {
  int batch, heads, dim;
  std::vector<bf16> qkv, o, d_o;  // [B, T, 3, H, D], [B, T, H, D], [B, T, H, D]
  std::vector<float> lse;         // [B, H, T]
  size_t at_qkv(int b, int t, int which, int h, int d) const {
    return (((size_t(b) * kT + t) * 3 + which) * heads + h) * dim + d;
  }
  size_t at_o(int b, int t, int h, int d) const { return ((size_t(b) * kT + t) * heads + h) * dim + d; }
};

// Random inputs; O and lse from the forward in float64 (O rounded to bf16, as
// the forward stores it).
static Problem make_problem(int batch, int heads, int dim, float scale, unsigned seed, bool forward) {
  Problem p{batch, heads, dim, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  p.qkv.resize(size_t(batch) * kT * 3 * heads * dim);
  p.o.resize(size_t(batch) * kT * heads * dim);
  p.d_o.resize(p.o.size());
  p.lse.resize(size_t(batch) * heads * kT);
  for (auto& v : p.qkv) v = __float2bfloat16(nd(rng));
  for (auto& v : p.d_o) v = __float2bfloat16(nd(rng));
  if (!forward) {  // timing only: any finite O and lse
    for (auto& v : p.o) v = __float2bfloat16(nd(rng));
    for (auto& v : p.lse) v = 6.f + nd(rng);
    return p;
  }
  std::vector<double> s(kT);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < kT; ++i) {
        double mx = -1e300;
        for (int j = 0; j < kT; ++j) {
          double acc = 0;
          for (int d = 0; d < dim; ++d) acc += double(bf(p.qkv[p.at_qkv(b, i, 0, h, d)])) * bf(p.qkv[p.at_qkv(b, j, 1, h, d)]);
          s[j] = scale * acc;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < kT; ++j) sum += std::exp(s[j] - mx);
        p.lse[(size_t(b) * heads + h) * kT + i] = float(mx + std::log(sum));
        for (int d = 0; d < dim; ++d) {
          double acc = 0;
          for (int j = 0; j < kT; ++j) acc += std::exp(s[j] - mx) / sum * bf(p.qkv[p.at_qkv(b, j, 2, h, d)]);
          p.o[p.at_o(b, i, h, d)] = __float2bfloat16(float(acc));
        }
      }
  return p;
}

// The gradients of one (sample, head) in float64: dq, dk, dv [T][D].
static void reference(const Problem& p, int b, int h, float scale, std::vector<double>& dq, std::vector<double>& dk,
                      std::vector<double>& dv) {
  const int dim = p.dim;
  dq.assign(size_t(kT) * dim, 0);
  dk.assign(size_t(kT) * dim, 0);
  dv.assign(size_t(kT) * dim, 0);
  std::vector<double> prob(kT), dp(kT);
  for (int i = 0; i < kT; ++i) {
    const double lse = p.lse[(size_t(b) * p.heads + h) * kT + i];
    double delta = 0;
    for (int d = 0; d < dim; ++d) delta += double(bf(p.d_o[p.at_o(b, i, h, d)])) * bf(p.o[p.at_o(b, i, h, d)]);
    for (int j = 0; j < kT; ++j) {
      double sc = 0, dpj = 0;
      for (int d = 0; d < dim; ++d) {
        sc += double(bf(p.qkv[p.at_qkv(b, i, 0, h, d)])) * bf(p.qkv[p.at_qkv(b, j, 1, h, d)]);
        dpj += double(bf(p.d_o[p.at_o(b, i, h, d)])) * bf(p.qkv[p.at_qkv(b, j, 2, h, d)]);
      }
      prob[j] = std::exp(scale * sc - lse);
      dp[j] = dpj;
    }
    for (int j = 0; j < kT; ++j) {
      const double ds = prob[j] * (dp[j] - delta);
      for (int d = 0; d < dim; ++d) {
        dq[size_t(i) * dim + d] += scale * ds * bf(p.qkv[p.at_qkv(b, j, 1, h, d)]);
        dk[size_t(j) * dim + d] += scale * ds * bf(p.qkv[p.at_qkv(b, i, 0, h, d)]);
        dv[size_t(j) * dim + d] += prob[j] * bf(p.d_o[p.at_o(b, i, h, d)]);
      }
    }
  }
}

struct Device {
  bf16 *qkv = nullptr, *o = nullptr, *d_o = nullptr, *dqkv = nullptr;
  float* lse = nullptr;
};

static int upload(const Problem& p, Device& dev) {
  CHECK(cudaMalloc(&dev.qkv, p.qkv.size() * 2));
  CHECK(cudaMalloc(&dev.o, p.o.size() * 2));
  CHECK(cudaMalloc(&dev.d_o, p.d_o.size() * 2));
  CHECK(cudaMalloc(&dev.dqkv, p.qkv.size() * 2));
  CHECK(cudaMalloc(&dev.lse, p.lse.size() * 4));
  CHECK(cudaMemcpy(dev.qkv, p.qkv.data(), p.qkv.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dev.o, p.o.data(), p.o.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dev.d_o, p.d_o.data(), p.d_o.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dev.lse, p.lse.data(), p.lse.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dev.dqkv, 0xff, p.qkv.size() * 2));  // NaN in bf16
  return 0;
}

static void release(Device& dev) {
  cudaFree(dev.qkv);
  cudaFree(dev.o);
  cudaFree(dev.d_o);
  cudaFree(dev.dqkv);
  cudaFree(dev.lse);
}

// Every (sample, head) against float64, per gradient: the largest error over
// the RMS of the reference (reported), and a pass when every element is within
// 0.05 RMS + 2^-7 of its own size (bf16 output rounding of the large values of
// dk's heavy tail alone is 2^-9 of them; bf16 P and dS add ~1e-2 RMS).
static int check(int batch, int heads, int dim) {
  const float scale = 1.f / std::sqrt(float(dim));
  const Problem p = make_problem(batch, heads, dim, scale, 7u + batch, true);
  Device dev;
  if (upload(p, dev) != 0) return 1;
  // Three runs, each on shared memory poisoned first and into an output
  // poisoned first: their bytes must agree (the kernel is deterministic).
  std::vector<bf16> got(p.qkv.size()), again(p.qkv.size());
  bool same = true;
  for (int rep = 0; rep < 3; ++rep) {
    if (poison_shared() != 0) return 1;
    CHECK(cudaMemset(dev.dqkv, 0xff, p.qkv.size() * 2));
    perftrain::kernels::attention_head_bwd_sm90(dev.qkv, dev.o, dev.d_o, dev.lse, dev.dqkv, batch, heads, dim, scale,
                                                nullptr);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(rep == 0 ? got.data() : again.data(), dev.dqkv, got.size() * 2, cudaMemcpyDeviceToHost));
    if (rep > 0) same = same && std::memcmp(got.data(), again.data(), got.size() * 2) == 0;
  }
  release(dev);
  if (!same) std::printf("  the three runs differ: a race or a read of unwritten shared memory\n");
  size_t nan = 0;
  for (const bf16 v : got)
    if (std::isnan(bf(v))) ++nan;
  double worst[3] = {0, 0, 0};
  bool close = true;
  std::vector<double> ref[3];
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      reference(p, b, h, scale, ref[0], ref[1], ref[2]);
      for (int which = 0; which < 3; ++which) {
        double ss = 0, err = 0;
        for (double v : ref[which]) ss += v * v;
        const double rms = std::sqrt(ss / ref[which].size()) + 1e-30;
        int shown = 0;
        for (int t = 0; t < kT; ++t)
          for (int d = 0; d < dim; ++d) {
            const double g = bf(got[p.at_qkv(b, t, which, h, d)]), r = ref[which][size_t(t) * dim + d];
            const double e = std::fabs(g - r);
            err = std::max(err, e);
            const bool near = e <= 0.05 * rms + std::fabs(r) / 128;
            close = close && near;
            // The first few misses, where they are: a layout mistake shows as a pattern.
            if (!near && shown < 4) {
              std::printf("  %s[sample %d][head %d][token %d][d %d]: got %.5g, want %.5g (rms %.3g)\n",
                          which == 0 ? "dq" : which == 1 ? "dk" : "dv", b, h, t, d, g, r, rms);
              ++shown;
            }
          }
        worst[which] = std::max(worst[which], err / rms);
      }
    }
  const bool ok = nan == 0 && close && same;
  std::printf("attention bwd check batch=%d heads=%d dim=%d: NaN left %zu, worst error / rms dq %.3g dk %.3g dv %.3g "
              "-> %s\n",
              batch, heads, dim, nan, worst[0], worst[1], worst[2], ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// Milliseconds per call at (batch, heads): the median of 7 windows of 20
// calls after 5 warm-up calls; TFLOP/s counts 2.5x the forward's 4 B H T^2 D.
static int time_shape(int batch, int heads, int dim) {
  const float scale = 1.f / std::sqrt(float(dim));
  const Problem p = make_problem(batch, heads, dim, scale, 99u, false);
  Device dev;
  if (upload(p, dev) != 0) return 1;
  auto launch = [&] {
    perftrain::kernels::attention_head_bwd_sm90(dev.qkv, dev.o, dev.d_o, dev.lse, dev.dqkv, batch, heads, dim, scale,
                                                nullptr);
  };
  double med = 0;
  const int rc = median_launch_ms(launch, &med);
  release(dev);
  if (rc != 0) return rc;
  const double flops = 2.5 * 4.0 * batch * heads * double(kT) * kT * dim;
  std::printf("attention bwd time batch=%d heads=%d dim=%d: median %.3f ms, %.0f TFLOP/s\n", batch, heads, dim, med,
              flops / med * 1e-9);
  return 0;
}

int main(int argc, char** argv) {
  // (4, 40): 160 CTAs, more than one per SM in turn.
  static const int shapes[3][2] = {{1, 1}, {2, 3}, {4, 40}};
  return run_attention_checks(argc, argv, "attention_bwd_check", shapes, check, time_shape);
}
