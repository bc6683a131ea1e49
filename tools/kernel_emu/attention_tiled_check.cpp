// The tiled attention kernels (attention_tiled_fwd_sm90, attention_tiled_bwd_sm90: their real
// source on the emulated sm_90a of sm90_emu.h) against a float64 reference:
//   x = s Q K^T + b (b the key bias), P = softmax(x), out = P V, lse = ln(sum exp x);
//   D = rowsum(dO * O), dS = P * (dO V^T - D), dV = P^T dO, dK = s dS^T Q, dQ = s dS K.
// T = 64, 257, 288 and 1152 (one case), head dims 64 and 72, no bias and the
// single-stream key mask as a bf16 and an fp32 bias (condition tokens first, sample 0 with one
// attended key and beyond 256 tokens a whole key tile masked), packed q, k, v and q|k split
// from v (gradients into separate tensors then), two heads at 200 tokens, one sample with its
// bias row T long (unpadded: the row map's one-sample stride); head dims 96 and 128
// at 64 tokens, at 200 (two samples, two heads, a mask) and at 288. Outputs start NaN,
// NaN past every buffer; every case on two schedules, the same bits. Exit 1 on any failure.
// ctest kernels.emu_attention_tiled, or
//   run.sh attention_tiled_check.cpp attention_tiled_fwd_sm90 attention_tiled_bwd_sm90
// (about a minute and a half; EMU_ARGS=edges runs instead T = 65, 127, 128, 129, 191, 255, 256 at
// batch 3, about 3 minutes).
#include <cstring>

#include "check.h"
#include "kernels/attention_tiled_bwd_sm90.h"
#include "kernels/attention_tiled_fwd_sm90.h"

namespace k = perftrain::kernels;

enum class BiasKind { kNone, kBf16, kF32 };

struct Case {
  int B, T, H, D;
  BiasKind bias;
  bool split;
};

static std::string where_of(const char* what, const Case& c) {
  return std::string(what) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" +
         std::to_string(c.H) + " D=" + std::to_string(c.D) + " bias=" + std::to_string(int(c.bias)) +
         (c.split ? " split" : "");
}

// 0 / -65504 per key: condition tokens first, sample 0 attends one, the others all Tc;
// beyond 256 tokens sample 0 also loses keys 128-255.
static std::vector<double> mask_bias(const Case& c) {
  const int tc = c.T <= 288 ? std::min(32, c.T / 2) : 128;
  std::vector<double> bias(size_t(c.B) * c.T, 0.0);
  for (int b = 0; b < c.B; ++b) {
    const int len = b == 0 ? 1 : tc - b % 3;
    for (int j = len; j < tc; ++j) bias[size_t(b) * c.T + j] = -65504.0;
    if (b == 0 && c.T > 256)
      for (int j = 128; j < 256; ++j) bias[size_t(b) * c.T + j] = -65504.0;
  }
  return bias;
}

static void run_case(const Case& c) {
  const int B = c.B, T = c.T, H = c.H, D = c.D, HD = H * D;
  const size_t rows = size_t(B) * T;
  const double scale = 1.0 / std::sqrt(double(D));
  const auto qkv = rnd<bf16>(rows * 3 * HD, 1.5);
  // q|k split: a [B, T, 2D] copy of q and k.
  std::vector<bf16> qk(rows * 2 * HD + kPad);
  for (size_t r = 0; r < rows; ++r) memcpy(&qk[r * 2 * HD], &qkv[r * 3 * HD], 2 * HD * sizeof(bf16));
  const std::vector<double> bias_d = c.bias == BiasKind::kNone ? std::vector<double>(rows, 0.0) : mask_bias(c);
  const int64_t stride = (T + 7) / 8 * 8;
  std::vector<bf16> bias_b(size_t(B) * stride + kPad);
  std::vector<float> bias_f(size_t(B) * stride + kPad);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < T; ++j) {
      bias_b[b * stride + j] = fromd<bf16>(bias_d[size_t(b) * T + j]);
      bias_f[b * stride + j] = float(bias_d[size_t(b) * T + j]);
    }
  k::AttentionKeyBias bias;
  if (c.bias != BiasKind::kNone) {
    bias.data = c.bias == BiasKind::kF32 ? static_cast<const void*>(bias_f.data()) : bias_b.data();
    bias.sample_stride = B == 1 ? T : stride;  // as the op passes one sample's row: T long, unpadded
    bias.fp32 = c.bias == BiasKind::kF32;
  }
  const k::AttentionOperand q{c.split ? qk.data() : qkv.data(), c.split ? 2 * HD : 3 * HD};
  const k::AttentionOperand kk{(c.split ? qk.data() : qkv.data()) + HD, c.split ? 2 * HD : 3 * HD};
  const k::AttentionOperand v{qkv.data() + 2 * HD, 3 * HD};
  const auto d_o = rnd<bf16>(rows * HD, 1.0);

  // The reference, per (b, h): out, lse, then dq, dk, dv from the kernel's own out.
  std::vector<double> out_ref(rows * HD), lse_ref(size_t(B) * H * T);
  std::vector<double> p(size_t(T) * T);
  auto at = [&](int b, int t, int w, int h, int col) { return (size_t(b) * T + t) * 3 * HD + w * HD + h * D + col; };
  auto at_o = [&](int b, int t, int h, int col) { return (size_t(b) * T + t) * HD + h * D + col; };
  std::vector<std::vector<double>> probs(size_t(B) * H);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int j = 0; j < T; ++j) {
          double s = 0;
          for (int col = 0; col < D; ++col) s += tod(qkv[at(b, i, 0, h, col)]) * tod(qkv[at(b, j, 1, h, col)]);
          p[size_t(i) * T + j] = scale * s + (c.bias == BiasKind::kNone ? 0.0 : bias_d[size_t(b) * T + j]);
          mx = std::max(mx, p[size_t(i) * T + j]);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j) sum += std::exp(p[size_t(i) * T + j] - mx);
        const double l = mx + std::log(sum);
        lse_ref[(size_t(b) * H + h) * T + i] = l;
        for (int j = 0; j < T; ++j) p[size_t(i) * T + j] = std::exp(p[size_t(i) * T + j] - l);
        for (int col = 0; col < D; ++col) {
          double o = 0;
          for (int j = 0; j < T; ++j) o += p[size_t(i) * T + j] * tod(qkv[at(b, j, 2, h, col)]);
          out_ref[at_o(b, i, h, col)] = o;
        }
      }
      probs[size_t(b) * H + h] = p;
    }
  std::vector<bf16> out_kernel;
  std::vector<float> lse_kernel;
  on_two_schedules(where_of("tiled fwd", c), [&](bool check) {
    auto out = nans<bf16>(rows * HD);
    auto lse = nans<float>(size_t(B) * H * T);
    k::attention_tiled_fwd_sm90(q, kk, v, bias, out.data(), lse.data(), B, T, H, D, float(scale), nullptr);
    if (check) {
      rel_l2("out", where_of("tiled fwd", c), out.data(), out_ref, 1e-2);
      close("out", where_of("tiled fwd", c), out.data(), out_ref, 2e-2);
      close("lse", where_of("tiled fwd", c), lse.data(), lse_ref, 1e-4);
      pad_intact("out", out);
      pad_intact("lse", lse);
      out_kernel = out;
      lse_kernel = lse;
    }
    return bits_of(out, lse);
  });

  std::vector<double> dq_ref(rows * HD, 0.0), dk_ref(rows * HD, 0.0), dv_ref(rows * HD, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const std::vector<double>& pp = probs[size_t(b) * H + h];
      for (int i = 0; i < T; ++i) {
        double delta = 0;
        for (int col = 0; col < D; ++col) delta += tod(d_o[at_o(b, i, h, col)]) * tod(out_kernel[at_o(b, i, h, col)]);
        for (int j = 0; j < T; ++j) {
          double dp = 0;
          for (int col = 0; col < D; ++col) dp += tod(d_o[at_o(b, i, h, col)]) * tod(qkv[at(b, j, 2, h, col)]);
          const double pij = pp[size_t(i) * T + j], ds = pij * (dp - delta);
          for (int col = 0; col < D; ++col) {
            dv_ref[at_o(b, j, h, col)] += pij * tod(d_o[at_o(b, i, h, col)]);
            dk_ref[at_o(b, j, h, col)] += scale * ds * tod(qkv[at(b, i, 0, h, col)]);
            dq_ref[at_o(b, i, h, col)] += scale * ds * tod(qkv[at(b, j, 1, h, col)]);
          }
        }
      }
    }
  const std::string where = where_of("tiled bwd", c);
  on_two_schedules(where, [&](bool check) {
    // Packed: one [B, T, 3D] gradient; split: dq|dk in a [B, T, 2D] one, dv in its own.
    auto dqkv = nans<bf16>(rows * 3 * HD);
    auto dv_own = nans<bf16>(rows * HD);
    auto delta = nans<float>(size_t(B) * H * T);
    const int64_t g = c.split ? 2 * HD : 3 * HD;
    const k::AttentionGradOperand dq{dqkv.data(), g}, dk{dqkv.data() + HD, g};
    const k::AttentionGradOperand dv = c.split ? k::AttentionGradOperand{dv_own.data(), HD}
                                               : k::AttentionGradOperand{dqkv.data() + 2 * HD, g};
    k::attention_tiled_bwd_sm90(q, kk, v, bias, out_kernel.data(), d_o.data(), lse_kernel.data(), delta.data(), dq, dk,
                                dv, B, T, H, D, float(scale), nullptr);
    if (check) {
      std::vector<bf16> part[3];
      for (int w = 0; w < 3; ++w) {
        part[w].resize(rows * HD);
        for (size_t r = 0; r < rows; ++r) {
          const bf16* src = w == 2 && c.split ? &dv_own[r * HD] : &dqkv[r * g + w * HD];
          memcpy(&part[w][r * HD], src, HD * sizeof(bf16));
        }
      }
      const char* names[3] = {"dq", "dk", "dv"};
      const std::vector<double>* refs[3] = {&dq_ref, &dk_ref, &dv_ref};
      for (int w = 0; w < 3; ++w) {
        rel_l2(names[w], where, part[w].data(), *refs[w], 1.5e-2);
        double mx = 0;
        for (double r : *refs[w]) mx = std::max(mx, std::fabs(r));
        close(names[w], where, part[w].data(), *refs[w], 3e-2 * mx);
      }
      // Masked keys: dK, dV exactly zero.
      size_t nonzero = 0;
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < T; ++j)
          if (bias_d[size_t(b) * T + j] < -1.0)
            for (int col = 0; col < HD; ++col)
              nonzero += tod(part[1][(size_t(b) * T + j) * HD + col]) != 0.0 ||
                         tod(part[2][(size_t(b) * T + j) * HD + col]) != 0.0;
      if (nonzero) { ++fails; printf("FAIL %s: %zu masked keys' dk/dv not zero\n", where.c_str(), nonzero); }
      // Nothing outside the written columns: with q|k split, the packed buffer's last third stays NaN.
      if (c.split) {
        size_t written = 0;
        for (size_t i = rows * 2 * HD; i < rows * 3 * HD; ++i) written += !std::isnan(tod(dqkv[i]));
        if (written) { ++fails; printf("FAIL %s: %zu elements written past the [B, T, 2D] gradient\n", where.c_str(), written); }
      }
      pad_intact("dqkv", dqkv);
      pad_intact("dv", dv_own);
    }
    return bits_of(dqkv, dv_own);
  });
}

int main(int argc, char** argv) {
  emu::sm_count = 2;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "edges") {  // token counts around the tile and chunk sizes
    for (int T : {65, 127, 128, 129, 191, 255, 256})
      run_case({3, T, 1, T % 2 ? 72 : 64, T % 3 ? BiasKind::kF32 : BiasKind::kBf16, T == 129});
    return finish();
  }
  for (int D : {64, 72})
    for (int T : {64, 257, 288}) {
      run_case({2, T, 1, D, BiasKind::kNone, false});
      run_case({2, T, 1, D, BiasKind::kBf16, T == 288});
      run_case({2, T, 1, D, BiasKind::kF32, false});
    }
  run_case({2, 200, 2, 72, BiasKind::kBf16, false});  // two heads (blockIdx.y)
  run_case({2, 1152, 1, 64, BiasKind::kBf16, true});  // nine key tiles, q|k split
  // One sample: the bias's row map takes a stride (T) that is no multiple of 16 bytes.
  run_case({1, 257, 2, 64, BiasKind::kBf16, false});
  run_case({1, 201, 1, 72, BiasKind::kF32, false});
  // Two panels: at 96 the second half used, its columns 64-95 stored as tail boxes.
  for (int D : {96, 128}) {
    run_case({2, 64, 1, D, BiasKind::kNone, false});
    run_case({2, 200, 2, D, D == 96 ? BiasKind::kF32 : BiasKind::kBf16, D == 96});
    run_case({2, 288, 1, D, D == 96 ? BiasKind::kBf16 : BiasKind::kF32, D == 128});
  }
  return finish();
}
