// The whole-head attention forward (kernels::attention_head_fwd_sm90)
// against float64, torch-free. Random bf16 q, k, v for a few (sample, head)
// pairs at head dims 64 and 72; O and the log-sum-exp in float64 on the CPU;
// the kernel's O and lse (outputs and every SM's shared memory poisoned with
// NaN first, three runs that must agree to the bit) against them. Then the
// time per call at the b256 shapes of DiT-B/2, S/2 (head dim 64) and XL/2 (72).
//   attention_fwd_check checks   the float64 checks only: the ctest
//                                kernels.attention_head_fwd_float64 (label
//                                gpu; exit 77, skipped, without an sm_90 GPU)
//   attention_fwd_check time     the timings only
//   attention_fwd_check          both
// Build: cmake --build build --target attention_fwd_check (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=attention_fwd_check [LAB_ARGS=checks] [SANITIZE=1] [NCU=1].
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
#include "kernels/attention_head_fwd_sm90.h"

using bf16 = __nv_bfloat16;

constexpr int kT = 256;

static float bf(bf16 v) { return __bfloat162float(v); }

struct Buffers {
  bf16 *qkv = nullptr, *out = nullptr;
  float* lse = nullptr;
  ~Buffers() {
    cudaFree(qkv);
    cudaFree(out);
    cudaFree(lse);
  }
};

static int allocate(Buffers& d, const std::vector<bf16>& qkv, size_t out_elems, size_t lse_elems) {
  CHECK(cudaMalloc(&d.qkv, qkv.size() * 2));
  CHECK(cudaMalloc(&d.out, out_elems * 2));
  CHECK(cudaMalloc(&d.lse, lse_elems * 4));
  CHECK(cudaMemcpy(d.qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  return 0;
}

// O within 0.02 RMS + 2^-7 of each value (bf16 P and O), lse within 1e-3
// (fp32 sums of 256 terms), every (sample, head) against float64.
static int check(int batch, int heads, int dim) {
  const float scale = 1.f / std::sqrt(float(dim));
  std::mt19937 rng(11u + batch + dim);
  std::normal_distribution<float> nd;
  std::vector<bf16> qkv(size_t(batch) * kT * 3 * heads * dim);
  for (auto& v : qkv) v = __float2bfloat16(nd(rng));
  const size_t out_elems = size_t(batch) * kT * heads * dim, lse_elems = size_t(batch) * heads * kT;
  Buffers d;
  if (allocate(d, qkv, out_elems, lse_elems) != 0) return 1;
  std::vector<bf16> out(out_elems), out_again(out_elems);
  std::vector<float> lse(lse_elems), lse_again(lse_elems);
  bool same = true;
  for (int rep = 0; rep < 3; ++rep) {
    if (poison_shared() != 0) return 1;
    CHECK(cudaMemset(d.out, 0xff, out_elems * 2));
    CHECK(cudaMemset(d.lse, 0xff, lse_elems * 4));
    perftrain::kernels::attention_head_fwd_sm90(d.qkv, d.out, d.lse, batch, heads, dim, scale, nullptr);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(rep == 0 ? out.data() : out_again.data(), d.out, out_elems * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(rep == 0 ? lse.data() : lse_again.data(), d.lse, lse_elems * 4, cudaMemcpyDeviceToHost));
    if (rep > 0)
      same = same && std::memcmp(out.data(), out_again.data(), out_elems * 2) == 0 &&
             std::memcmp(lse.data(), lse_again.data(), lse_elems * 4) == 0;
  }
  if (!same) std::printf("  the three runs differ: a race or a read of unwritten shared memory\n");
  auto at_qkv = [&](int b, int t, int which, int h, int c) {
    return (((size_t(b) * kT + t) * 3 + which) * heads + h) * dim + c;
  };
  size_t nan = 0, shown = 0;
  double worst_o = 0, worst_lse = 0;
  bool close = true;
  std::vector<double> s(kT), o(dim);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      double ss = 0;
      std::vector<double> ref(size_t(kT) * dim);
      std::vector<double> ref_lse(kT);
      for (int i = 0; i < kT; ++i) {
        double mx = -1e300;
        for (int j = 0; j < kT; ++j) {
          double acc = 0;
          for (int c = 0; c < dim; ++c) acc += double(bf(qkv[at_qkv(b, i, 0, h, c)])) * bf(qkv[at_qkv(b, j, 1, h, c)]);
          s[j] = scale * acc;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < kT; ++j) sum += std::exp(s[j] - mx);
        ref_lse[i] = mx + std::log(sum);
        for (int c = 0; c < dim; ++c) {
          double acc = 0;
          for (int j = 0; j < kT; ++j) acc += std::exp(s[j] - mx) / sum * bf(qkv[at_qkv(b, j, 2, h, c)]);
          ref[size_t(i) * dim + c] = acc;
          ss += acc * acc;
        }
      }
      const double rms = std::sqrt(ss / ref.size()) + 1e-30;
      for (int i = 0; i < kT; ++i) {
        const double gl = lse[(size_t(b) * heads + h) * kT + i];
        if (std::isnan(gl)) ++nan;
        const double el = std::fabs(gl - ref_lse[i]);
        worst_lse = std::max(worst_lse, el);
        close = close && el <= 1e-3 * (1 + std::fabs(ref_lse[i]));
        for (int c = 0; c < dim; ++c) {
          const double g = bf(out[((size_t(b) * kT + i) * heads + h) * dim + c]), r = ref[size_t(i) * dim + c];
          if (std::isnan(g)) ++nan;
          const double e = std::fabs(g - r);
          worst_o = std::max(worst_o, e / rms);
          const bool near = e <= 0.02 * rms + std::fabs(r) / 128;
          close = close && near;
          if (!near && shown < 4) {
            std::printf("  out[sample %d][token %d][head %d][d %d]: got %.5g, want %.5g (rms %.3g)\n", b, i, h, c, g, r,
                        rms);
            ++shown;
          }
        }
      }
    }
  const bool ok = nan == 0 && close && same;
  std::printf("attention fwd check batch=%d heads=%d dim=%d: NaN left %zu, worst error / rms out %.3g, worst lse error "
              "%.3g -> %s\n",
              batch, heads, dim, nan, worst_o, worst_lse, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

static int time_shape(int batch, int heads, int dim) {
  const float scale = 1.f / std::sqrt(float(dim));
  std::mt19937 rng(99u);
  std::normal_distribution<float> nd;
  std::vector<bf16> qkv(size_t(batch) * kT * 3 * heads * dim);
  for (auto& v : qkv) v = __float2bfloat16(nd(rng));
  Buffers d;
  if (allocate(d, qkv, size_t(batch) * kT * heads * dim, size_t(batch) * heads * kT) != 0) return 1;
  double med = 0;
  if (median_launch_ms([&] { perftrain::kernels::attention_head_fwd_sm90(d.qkv, d.out, d.lse, batch, heads, dim, scale,
                                                                        nullptr); },
                       &med) != 0)
    return 1;
  const double flops = 4.0 * batch * heads * double(kT) * kT * dim;
  std::printf("attention fwd time batch=%d heads=%d dim=%d: median %.3f ms, %.0f TFLOP/s\n", batch, heads, dim, med,
              flops / med * 1e-9);
  return 0;
}

int main(int argc, char** argv) {
  // (2, 150): 300 heads, more than one per CTA, both buffers in turn.
  static const int shapes[3][2] = {{1, 1}, {2, 3}, {2, 150}};
  return run_attention_checks(argc, argv, "attention_fwd_check", shapes, check, time_shape);
}
