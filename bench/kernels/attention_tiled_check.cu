// The tiled attention forward and backward (kernels::attention_tiled_fwd_sm90,
// kernels::attention_tiled_bwd_sm90) against float64, torch-free. Random bf16 q, k, v at T = 64, 257, 288, 1024 and
// 1152 tokens, head dims 64, 72, 96 and 128, without a key bias and with the
// single-stream mask as a bias (fp32 and bf16: condition tokens first, each
// sample's padded condition keys at -65504, one sample with a single
// attended condition key, and beyond 256 tokens a whole 128-key tile masked
// too), q and k from a [B, T, 2D] tensor and v from a packed [B, T, 3D] one
// in some cases (dq, dk into a [B, T, 2D] tensor and dv into its own then);
// O, the log-sum-exp and dQ, dK, dV (from a random dO and the kernel's own
// O and lse) in float64 on the CPU; the kernels' results (outputs, a guard
// past them and every SM's shared memory poisoned with NaN first, three
// runs that must agree to the bit; masked keys' dK, dV exactly zero)
// against them. Then the time per call at the single-stream and 512 px
// shapes and at head dim 128 (1024 and 4096 tokens), forward and backward.
//   attention_tiled_check checks   the float64 checks only: the ctest
//                                  kernels.attention_tiled_float64 (label
//                                  gpu; exit 77, skipped, without an sm_90 GPU)
//   attention_tiled_check time     the timings only
//   attention_tiled_check few      two of the checks (288 tokens, masked), for compute-sanitizer
//   attention_tiled_check          both
// Build: cmake --build build --target attention_tiled_check (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=attention_tiled_check [LAB_ARGS=checks] [SANITIZE=1] [NCU=1].
// cuDNN's time at the same shapes: attention_tiled_bench (libtorch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kernels/attention_tiled_bwd_sm90.h"
#include "kernels/attention_tiled_fwd_sm90.h"

using bf16 = __nv_bfloat16;
using perftrain::kernels::AttentionGradOperand;
using perftrain::kernels::AttentionKeyBias;
using perftrain::kernels::AttentionOperand;

namespace {

float bf(bf16 v) { return __bfloat162float(v); }

enum class BiasKind { kNone, kF32, kBf16 };

const char* bias_name(BiasKind k) { return k == BiasKind::kNone ? "none" : k == BiasKind::kF32 ? "fp32" : "bf16"; }

// One case: the shape, the bias, and whether q, k come from a [B, T, 2D]
// tensor (row stride 2D) while v stays in the packed [B, T, 3D] one.
struct Case {
  int batch, tokens, heads, dim;
  BiasKind bias;
  bool split_qk;
};

// The condition length of the single-stream shapes: 32 up to 288 tokens, 128 beyond.
int condition_tokens(int tokens) { return tokens <= 288 ? std::min(32, tokens / 2) : 128; }

// The single-stream key mask as 0 / -65504 per key: condition tokens first,
// sample b attends lengths[b] of them; sample 0 attends one, and beyond 256
// tokens also loses keys 128-255 (a whole tile).
std::vector<double> key_bias(int batch, int tokens, std::mt19937& rng) {
  const int tc = condition_tokens(tokens);
  std::vector<double> bias(size_t(batch) * tokens, 0.0);
  for (int b = 0; b < batch; ++b) {
    const int len = b == 0 ? 1 : b == 1 ? tc : 1 + int(rng() % tc);
    for (int j = len; j < tc; ++j) bias[size_t(b) * tokens + j] = -65504.0;
    if (b == 0 && tokens > 256)
      for (int j = 128; j < 256; ++j) bias[size_t(b) * tokens + j] = -65504.0;
  }
  return bias;
}

struct Device {
  bf16 *qkv = nullptr, *qk = nullptr, *out = nullptr, *d_out = nullptr, *dqkv = nullptr, *dv = nullptr;
  float *lse = nullptr, *delta = nullptr;
  void* bias = nullptr;
  ~Device() {
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(qk), static_cast<void*>(out),
                    static_cast<void*>(d_out), static_cast<void*>(dqkv), static_cast<void*>(dv),
                    static_cast<void*>(lse), static_cast<void*>(delta), bias})
      cudaFree(p);
  }
};

constexpr size_t kGuard = 4096;  // poisoned elements after out and lse: a write past T shows

// The inputs on the device: packed qkv, the [B, T, 2D] q|k copy, the bias
// (rows padded to 8 elements, as attention_key_bias pads them).
int upload(Device& d, const Case& c, const std::vector<bf16>& qkv, const std::vector<double>& bias, int64_t* stride) {
  const size_t rows = size_t(c.batch) * c.tokens, D = size_t(c.heads) * c.dim;
  CHECK(cudaMalloc(&d.qkv, qkv.size() * 2));
  CHECK(cudaMemcpy(d.qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&d.qk, rows * 2 * D * 2));
  CHECK(cudaMemcpy2D(d.qk, 2 * D * 2, d.qkv, 3 * D * 2, 2 * D * 2, rows, cudaMemcpyDeviceToDevice));
  CHECK(cudaMalloc(&d.out, (rows * D + kGuard) * 2));
  CHECK(cudaMalloc(&d.lse, (size_t(c.batch) * c.heads * c.tokens + kGuard) * 4));
  CHECK(cudaMalloc(&d.d_out, rows * D * 2));
  CHECK(cudaMalloc(&d.delta, size_t(c.batch) * c.heads * c.tokens * 4));
  CHECK(cudaMalloc(&d.dqkv, (rows * 3 * D + kGuard) * 2));
  CHECK(cudaMalloc(&d.dv, (rows * D + kGuard) * 2));
  *stride = (c.tokens + 7) / 8 * 8;
  if (c.bias == BiasKind::kNone) return 0;
  const size_t n = size_t(c.batch) * *stride;
  if (c.bias == BiasKind::kF32) {
    std::vector<float> h(n, 0.f);
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < c.tokens; ++j) h[b * *stride + j] = float(bias[size_t(b) * c.tokens + j]);
    CHECK(cudaMalloc(&d.bias, n * 4));
    CHECK(cudaMemcpy(d.bias, h.data(), n * 4, cudaMemcpyHostToDevice));
  } else {
    std::vector<bf16> h(n, __float2bfloat16(0.f));
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < c.tokens; ++j) h[b * *stride + j] = __float2bfloat16(float(bias[size_t(b) * c.tokens + j]));
    CHECK(cudaMalloc(&d.bias, n * 2));
    CHECK(cudaMemcpy(d.bias, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  return 0;
}

void launch(const Device& d, const Case& c, int64_t bias_stride) {
  const int64_t D = int64_t(c.heads) * c.dim;
  const AttentionOperand q{c.split_qk ? d.qk : d.qkv, c.split_qk ? 2 * D : 3 * D};
  const AttentionOperand k{(c.split_qk ? d.qk : d.qkv) + D, c.split_qk ? 2 * D : 3 * D};
  const AttentionOperand v{d.qkv + 2 * D, 3 * D};
  const AttentionKeyBias bias{d.bias, bias_stride, c.bias == BiasKind::kF32};
  perftrain::kernels::attention_tiled_fwd_sm90(q, k, v, bias, d.out, d.lse, c.batch, c.tokens, c.heads, c.dim,
                                               1.f / std::sqrt(float(c.dim)), nullptr);
}

// A case's random bf16 q, k, v and its key mask, and the device buffers with them.
struct Inputs {
  std::vector<bf16> qkv;
  std::vector<double> bias;
  Device d;
  int64_t bias_stride = 0;
};

int make_inputs(const Case& c, std::mt19937& rng, Inputs& in) {
  std::normal_distribution<float> nd;
  in.qkv.resize(size_t(c.batch) * c.tokens * 3 * c.heads * c.dim);
  for (auto& v : in.qkv) v = __float2bfloat16(nd(rng));
  in.bias = key_bias(c.batch, c.tokens, rng);
  return upload(in.d, c, in.qkv, in.bias, &in.bias_stride);
}

// The backward into the packed gradient (dq, dk, dv at row stride 3D), or
// with q|k split: dq, dk into a [B, T, 2D] tensor at row stride 2D and dv
// into its own [B, T, D].
void launch_backward(const Device& d, const Case& c, int64_t bias_stride) {
  const int64_t D = int64_t(c.heads) * c.dim;
  const AttentionOperand q{c.split_qk ? d.qk : d.qkv, c.split_qk ? 2 * D : 3 * D};
  const AttentionOperand k{(c.split_qk ? d.qk : d.qkv) + D, c.split_qk ? 2 * D : 3 * D};
  const AttentionOperand v{d.qkv + 2 * D, 3 * D};
  const int64_t g = c.split_qk ? 2 * D : 3 * D;
  const AttentionGradOperand dq{d.dqkv, g}, dk{d.dqkv + D, g};
  const AttentionGradOperand dv = c.split_qk ? AttentionGradOperand{d.dv, D} : AttentionGradOperand{d.dqkv + 2 * D, g};
  const AttentionKeyBias bias{d.bias, bias_stride, c.bias == BiasKind::kF32};
  perftrain::kernels::attention_tiled_bwd_sm90(q, k, v, bias, d.out, d.d_out, d.lse, d.delta, dq, dk, dv, c.batch,
                                               c.tokens, c.heads, c.dim, 1.f / std::sqrt(float(c.dim)), nullptr);
}

// out [T, d] and lse [T] of one (sample, head) in float64.
void reference(const Case& c, const std::vector<bf16>& qkv, const std::vector<double>& bias, int b, int h,
               std::vector<double>& out, std::vector<double>& lse) {
  const int T = c.tokens, d = c.dim, H = c.heads;
  const double scale = 1.0 / std::sqrt(double(d));
  auto at = [&](int t, int which, int col) { return ((size_t(b) * T + t) * 3 + which) * H * d + size_t(h) * d + col; };
  std::vector<double> s(T);
  for (int i = 0; i < T; ++i) {
    double mx = -1e300;
    for (int j = 0; j < T; ++j) {
      double acc = 0;
      for (int col = 0; col < d; ++col) acc += double(bf(qkv[at(i, 0, col)])) * bf(qkv[at(j, 1, col)]);
      s[j] = scale * acc + (c.bias == BiasKind::kNone ? 0.0 : bias[size_t(b) * T + j]);
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < T; ++j) sum += (s[j] = std::exp(s[j] - mx));
    lse[i] = mx + std::log(sum);
    for (int col = 0; col < d; ++col) {
      double acc = 0;
      for (int j = 0; j < T; ++j) acc += s[j] * bf(qkv[at(j, 2, col)]);
      out[size_t(i) * d + col] = acc / sum;
    }
  }
}

// dq, dk, dv [T, d] of one (sample, head) in float64 from q, k, v, the bias,
// the output's gradient and the kernel's O (bf16, for D as the kernel takes it).
void reference_backward(const Case& c, const std::vector<bf16>& qkv, const std::vector<double>& bias,
                        const std::vector<bf16>& d_out, const std::vector<bf16>& out, int b, int h,
                        std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  const int T = c.tokens, d = c.dim, H = c.heads;
  const double scale = 1.0 / std::sqrt(double(d));
  auto at = [&](int t, int which, int col) { return ((size_t(b) * T + t) * 3 + which) * H * d + size_t(h) * d + col; };
  auto at_o = [&](int t, int col) { return ((size_t(b) * T + t) * H + h) * d + col; };
  std::fill(dq.begin(), dq.end(), 0.0);
  std::fill(dk.begin(), dk.end(), 0.0);
  std::fill(dv.begin(), dv.end(), 0.0);
  std::vector<double> p(T), qi(d), gi(d);
  for (int i = 0; i < T; ++i) {
    double mx = -1e300, delta = 0;
    for (int col = 0; col < d; ++col) {
      qi[col] = bf(qkv[at(i, 0, col)]);
      gi[col] = bf(d_out[at_o(i, col)]);
      delta += gi[col] * bf(out[at_o(i, col)]);
    }
    for (int j = 0; j < T; ++j) {
      double acc = 0;
      for (int col = 0; col < d; ++col) acc += qi[col] * bf(qkv[at(j, 1, col)]);
      p[j] = scale * acc + (c.bias == BiasKind::kNone ? 0.0 : bias[size_t(b) * T + j]);
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (int j = 0; j < T; ++j) sum += (p[j] = std::exp(p[j] - mx));
    for (int j = 0; j < T; ++j) {
      p[j] /= sum;
      double dp = 0;
      for (int col = 0; col < d; ++col) dp += gi[col] * bf(qkv[at(j, 2, col)]);
      const double ds = p[j] * (dp - delta);
      for (int col = 0; col < d; ++col) {
        dv[size_t(j) * d + col] += p[j] * gi[col];
        dk[size_t(j) * d + col] += scale * ds * qi[col];
        dq[size_t(i) * d + col] += scale * ds * bf(qkv[at(j, 1, col)]);
      }
    }
  }
}

// An output of a launch: its device buffer, where its bytes go on the host, how many.
struct Output {
  void* device;
  void* host;
  size_t bytes;
};

// launch() three times, each after every SM's shared memory and the
// outputs are poisoned with 0xFF (NaN); the first run's outputs copied to
// the host; *same says whether the later runs gave the same bytes.
int three_runs(const std::function<void()>& launch, const std::vector<Output>& outputs, bool* same) {
  std::vector<unsigned char> again;
  *same = true;
  for (int rep = 0; rep < 3; ++rep) {
    if (poison_shared() != 0) return 1;
    for (const Output& o : outputs) CHECK(cudaMemset(o.device, 0xff, o.bytes));
    launch();
    CHECK(cudaDeviceSynchronize());
    for (const Output& o : outputs) {
      again.resize(o.bytes);
      CHECK(cudaMemcpy(rep == 0 ? o.host : again.data(), o.device, o.bytes, cudaMemcpyDeviceToHost));
      if (rep > 0) *same = *same && std::memcmp(o.host, again.data(), o.bytes) == 0;
    }
  }
  return 0;
}

bool guard_untouched(const unsigned char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != 0xff) return false;
  return true;
}

// The backward after the forward's out and lse in `d`: dQ, dK, dV each
// within 2e-2 relative L2 of float64 per (sample, head), masked keys' dK and
// dV exactly zero, three runs bit-identical, nothing written past the
// gradients' T rows or outside their columns.
int check_backward(const Case& c, Device& d, int64_t bias_stride, const std::vector<bf16>& qkv,
                   const std::vector<double>& bias, const std::vector<bf16>& out, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const size_t rows = size_t(c.batch) * c.tokens, D = size_t(c.heads) * c.dim;
  std::vector<bf16> d_out(rows * D);
  for (auto& v : d_out) v = __float2bfloat16(nd(rng));
  CHECK(cudaMemcpy(d.d_out, d_out.data(), d_out.size() * 2, cudaMemcpyHostToDevice));
  const size_t g_elems = rows * 3 * D + kGuard, v_elems = rows * D + kGuard;
  std::vector<bf16> g(g_elems), gv(v_elems);
  bool same = true;
  if (three_runs([&] { launch_backward(d, c, bias_stride); },
                 {{d.dqkv, g.data(), g_elems * 2}, {d.dv, gv.data(), v_elems * 2}}, &same) != 0)
    return 1;
  // Past the written region: the packed gradient's guard, or with q|k split
  // everything after its [B, T, 2D] and dv's guard; dv's buffer when unused.
  const size_t written = c.split_qk ? rows * 2 * D : rows * 3 * D;
  const bool guards =
      guard_untouched(reinterpret_cast<const unsigned char*>(g.data() + written), (g_elems - written) * 2) &&
      guard_untouched(reinterpret_cast<const unsigned char*>(gv.data() + (c.split_qk ? rows * D : 0)),
                      (c.split_qk ? kGuard : v_elems) * 2);
  auto grad = [&](int which, int b, int t, int h, int col) {
    const size_t hc = size_t(h) * c.dim + col, row = size_t(b) * c.tokens + t;
    if (!c.split_qk) return bf(g[(row * 3 + which) * D + hc]);
    return which < 2 ? bf(g[row * 2 * D + which * D + hc]) : bf(gv[row * D + hc]);
  };
  const size_t n = size_t(c.tokens) * c.dim;
  std::vector<double> ref[3] = {std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  double worst[3] = {0, 0, 0};
  size_t nan = 0, masked_nonzero = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      reference_backward(c, qkv, bias, d_out, out, b, h, ref[0], ref[1], ref[2]);
      for (int which = 0; which < 3; ++which) {
        double ee = 0, rr = 0;
        for (int t = 0; t < c.tokens; ++t)
          for (int col = 0; col < c.dim; ++col) {
            const double got = grad(which, b, t, h, col), r = ref[which][size_t(t) * c.dim + col];
            if (std::isnan(got)) ++nan;
            ee += (got - r) * (got - r);
            rr += r * r;
            const bool masked = c.bias != BiasKind::kNone && bias[size_t(b) * c.tokens + t] < -1.0;
            if (which > 0 && masked && got != 0.0) ++masked_nonzero;
          }
        worst[which] = std::max(worst[which], std::sqrt(ee / (rr + 1e-300)));
      }
    }
  const bool ok = nan == 0 && same && guards && masked_nonzero == 0 && worst[0] < 2e-2 && worst[1] < 2e-2 &&
                  worst[2] < 2e-2;
  if (!same) std::printf("  the three backward runs differ\n");
  if (!guards) std::printf("  a gradient written outside its rows or columns\n");
  std::printf("attention tiled bwd check B=%d T=%d H=%d d=%d bias=%s%s: NaN %zu, masked keys' dk/dv nonzero %zu, worst "
              "rel L2 dq %.3g dk %.3g dv %.3g -> %s\n",
              c.batch, c.tokens, c.heads, c.dim, bias_name(c.bias), c.split_qk ? " q|k split" : "", nan,
              masked_nonzero, worst[0], worst[1], worst[2], ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// O within 0.02 RMS + 2^-7 of each value (bf16 P and O), lse within 1e-3
// relative, every (sample, head) against float64; nothing written past T.
int check(const Case& c) {
  std::mt19937 rng(7u + c.tokens + c.dim + int(c.bias));
  Inputs in;
  if (make_inputs(c, rng, in) != 0) return 1;
  const std::vector<bf16>& qkv = in.qkv;
  const std::vector<double>& bias = in.bias;
  Device& d = in.d;
  const int64_t bias_stride = in.bias_stride;
  const size_t rows = size_t(c.batch) * c.tokens, D = size_t(c.heads) * c.dim;
  const size_t out_elems = rows * D, lse_elems = size_t(c.batch) * c.heads * c.tokens;
  std::vector<bf16> out(out_elems + kGuard);
  std::vector<float> lse(lse_elems + kGuard);
  bool same = true;
  if (three_runs([&] { launch(d, c, bias_stride); },
                 {{d.out, out.data(), out.size() * 2}, {d.lse, lse.data(), lse.size() * 4}}, &same) != 0)
    return 1;
  if (!same) std::printf("  the three runs differ: a race or a read of unwritten shared memory\n");
  const bool guards = guard_untouched(reinterpret_cast<const unsigned char*>(out.data() + out_elems), kGuard * 2) &&
                      guard_untouched(reinterpret_cast<const unsigned char*>(lse.data() + lse_elems), kGuard * 4);
  if (!guards) std::printf("  a write past the last token\n");
  size_t nan = 0, shown = 0;
  double worst_o = 0, worst_lse = 0;
  bool close = true;
  std::vector<double> ref(size_t(c.tokens) * c.dim), ref_lse(c.tokens);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      reference(c, qkv, bias, b, h, ref, ref_lse);
      double ss = 0;
      for (const double r : ref) ss += r * r;
      const double rms = std::sqrt(ss / ref.size()) + 1e-30;
      for (int i = 0; i < c.tokens; ++i) {
        const double gl = lse[(size_t(b) * c.heads + h) * c.tokens + i];
        if (std::isnan(gl)) ++nan;
        const double el = std::fabs(gl - ref_lse[i]);
        worst_lse = std::max(worst_lse, el);
        close = close && el <= 1e-3 * (1 + std::fabs(ref_lse[i]));
        for (int col = 0; col < c.dim; ++col) {
          const double g = bf(out[((size_t(b) * c.tokens + i) * c.heads + h) * c.dim + col]);
          const double r = ref[size_t(i) * c.dim + col], e = std::fabs(g - r);
          if (std::isnan(g)) ++nan;
          worst_o = std::max(worst_o, e / rms);
          const bool near = e <= 0.02 * rms + std::fabs(r) / 128;
          close = close && near;
          if (!near && shown < 4) {
            std::printf("  out[sample %d][token %d][head %d][d %d]: got %.5g, want %.5g (rms %.3g)\n", b, i, h, col, g,
                        r, rms);
            ++shown;
          }
        }
      }
    }
  const bool ok = nan == 0 && close && same && guards;
  std::printf("attention tiled fwd check B=%d T=%d H=%d d=%d bias=%s%s: NaN %zu, worst error / rms out %.3g, worst lse "
              "error %.3g -> %s\n",
              c.batch, c.tokens, c.heads, c.dim, bias_name(c.bias), c.split_qk ? " q|k split" : "", nan, worst_o,
              worst_lse, ok ? "PASS" : "FAIL");
  return (ok ? 0 : 1) | check_backward(c, d, bias_stride, qkv, bias, out, rng);
}

// The median time of one call at a training shape, and its TFLOP/s (4 B H T^2 d).
int time_shape(const char* name, const Case& c) {
  std::mt19937 rng(99u);
  Inputs in;
  if (make_inputs(c, rng, in) != 0) return 1;
  Device& d = in.d;
  const int64_t bias_stride = in.bias_stride;
  double med = 0, med_bwd = 0;
  if (median_launch_ms([&] { launch(d, c, bias_stride); }, &med) != 0) return 1;
  if (median_launch_ms([&] { launch_backward(d, c, bias_stride); }, &med_bwd) != 0) return 1;
  const double flops = 4.0 * c.batch * c.heads * double(c.tokens) * c.tokens * c.dim;
  std::printf("attention tiled time %-22s B=%d T=%d H=%d d=%d bias=%s: forward median %.3f ms, %.0f TFLOP/s; "
              "backward %.3f ms, %.0f TFLOP/s (counting 2.5x the forward's products)\n",
              name, c.batch, c.tokens, c.heads, c.dim, bias_name(c.bias), med, flops / med * 1e-9, med_bwd,
              2.5 * flops / med_bwd * 1e-9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc > 2 || (mode != "" && mode != "checks" && mode != "time" && mode != "few")) {
    std::printf("usage: %s [checks|time|few]\n", argv[0]);
    return 2;
  }
  if (skip_without_sm90("attention_tiled_check")) return kSkipCode;
  int rc = 0;
  if (mode == "few") {  // a few cases, for compute-sanitizer
    for (const int dim : {64, 72, 96, 128}) rc |= check({2, 288, 2, dim, BiasKind::kBf16, dim == 72 || dim == 96});
    return rc;
  }
  if (mode != "time")
    for (const int dim : {64, 72, 96, 128})
      for (const int tokens : {64, 257, 288, 1024, 1152})
        for (const BiasKind bias : {BiasKind::kNone, BiasKind::kF32, BiasKind::kBf16})
          rc |= check({tokens >= 1024 ? 2 : 3, tokens, 2, dim, bias, tokens == 288 || tokens == 257});
  if (mode == "checks") return rc;
  rc |= time_shape("DiT-B/2 b256 (whole-head's shape)", {256, 256, 12, 64, BiasKind::kNone, false});
  rc |= time_shape("SS-B/2 b256", {256, 288, 12, 64, BiasKind::kBf16, false});
  rc |= time_shape("SS-B/2 b64", {64, 1152, 12, 64, BiasKind::kBf16, false});
  rc |= time_shape("DiT-B/2 b64 512px", {64, 1024, 12, 64, BiasKind::kNone, false});
  rc |= time_shape("SS-XL/2 b128", {128, 288, 16, 72, BiasKind::kBf16, false});
  rc |= time_shape("SS-XL/2 b32", {32, 1152, 16, 72, BiasKind::kBf16, false});
  rc |= time_shape("DiT-XL/2 b32 512px", {32, 1024, 16, 72, BiasKind::kNone, false});
  rc |= time_shape("d128 T1024", {32, 1024, 16, 128, BiasKind::kNone, false});
  rc |= time_shape("d128 T1024 masked", {32, 1024, 16, 128, BiasKind::kBf16, false});
  rc |= time_shape("d128 T4096", {4, 4096, 16, 128, BiasKind::kNone, false});
  rc |= time_shape("d96 T1024", {32, 1024, 16, 96, BiasKind::kNone, false});
  return rc;
}
