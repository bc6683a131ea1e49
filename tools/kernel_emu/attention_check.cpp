// The whole-head attention kernels (attention_head_fwd_sm90, attention_head_bwd_sm90: their
// real source on the emulated sm_90a of sm90_emu.h) against a float64 reference:
//   S = s Q K^T, P = softmax(S), out = P V, lse = ln(sum exp S) per query;
//   D = rowsum(dO * O), dS = P * (dO V^T - D), dV = P^T dO, dK = s dS^T Q, dQ = s dS K.
// T = 256, head dims 64 and 72 (the tail panel), (B, H) = (1, 1) and (2, 3) on an emulated
// GPU of 2 SMs (the forward's persistent CTAs take 3 heads each: both buffers and both
// phase parities). Outputs start NaN (an element not written stays NaN), NaN past every
// buffer; every case runs twice, the second time on another schedule (set_schedule), and
// must give the same bits. Exit 1 on any failure.
#include "check.h"
#include "kernels/attention_head_bwd_sm90.h"
#include "kernels/attention_head_fwd_sm90.h"

namespace k = perftrain::kernels;
constexpr int kT = 256;

static std::string where_of(const char* what, int B, int H, int D) {
  return std::string(what) + " B=" + std::to_string(B) + " H=" + std::to_string(H) + " D=" + std::to_string(D);
}

struct Head {  // one (b, h) of the packed [B, T, 3, H, D] input, as float64
  std::vector<double> q, kk, v;  // [T][D]
};
static Head head_of(const std::vector<bf16>& qkv, int b, int h, int H, int D) {
  Head x{std::vector<double>(kT * D), std::vector<double>(kT * D), std::vector<double>(kT * D)};
  for (int t = 0; t < kT; ++t)
    for (int c = 0; c < D; ++c) {
      const size_t row = (size_t(b) * kT + t) * 3 * H * D;
      x.q[t * D + c] = tod(qkv[row + (0 * H + h) * D + c]);
      x.kk[t * D + c] = tod(qkv[row + (1 * H + h) * D + c]);
      x.v[t * D + c] = tod(qkv[row + (2 * H + h) * D + c]);
    }
  return x;
}
// P [T][T] and lse [T] of one head.
static void softmax_ref(const Head& x, int D, double scale, std::vector<double>& p, std::vector<double>& lse) {
  p.assign(size_t(kT) * kT, 0);
  lse.assign(kT, 0);
  for (int i = 0; i < kT; ++i) {
    double mx = -1e300;
    for (int j = 0; j < kT; ++j) {
      double s = 0;
      for (int c = 0; c < D; ++c) s += x.q[i * D + c] * x.kk[j * D + c];
      p[i * kT + j] = scale * s;
      mx = std::max(mx, scale * s);
    }
    double sum = 0;
    for (int j = 0; j < kT; ++j) sum += std::exp(p[i * kT + j] - mx);
    lse[i] = mx + std::log(sum);
    for (int j = 0; j < kT; ++j) p[i * kT + j] = std::exp(p[i * kT + j] - lse[i]);
  }
}

static void forward_case(int B, int H, int D) {
  const std::string where = where_of("attention fwd", B, H, D);
  const size_t rows = size_t(B) * kT, qkv_n = rows * 3 * H * D, out_n = rows * H * D, lse_n = size_t(B) * H * kT;
  const double scale = 1.0 / std::sqrt(double(D));
  const auto qkv = rnd<bf16>(qkv_n, 1.5);
  std::vector<double> out_ref(out_n), lse_ref(lse_n), p, lse;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const Head x = head_of(qkv, b, h, H, D);
      softmax_ref(x, D, scale, p, lse);
      for (int i = 0; i < kT; ++i) {
        lse_ref[(size_t(b) * H + h) * kT + i] = lse[i];
        for (int c = 0; c < D; ++c) {
          double o = 0;
          for (int j = 0; j < kT; ++j) o += p[i * kT + j] * x.v[j * D + c];
          out_ref[(size_t(b) * kT + i) * H * D + h * D + c] = o;
        }
      }
    }
  on_two_schedules(where, [&](bool check) {
    auto out = nans<bf16>(out_n);
    auto lse_got = nans<float>(lse_n);
    k::attention_head_fwd_sm90(qkv.data(), out.data(), lse_got.data(), B, H, D, float(scale), nullptr);
    if (check) {
      matches("out", where, out.data(), out_ref, 2e-2, 1e-2);
      close("lse", where, lse_got.data(), lse_ref, 1e-4);
      pad_intact("out", out);
      pad_intact("lse", lse_got);
    }
    return bits_of(out, lse_got);
  });
}

static void backward_case(int B, int H, int D) {
  const std::string where = where_of("attention bwd", B, H, D);
  const size_t rows = size_t(B) * kT, qkv_n = rows * 3 * H * D, o_n = rows * H * D, lse_n = size_t(B) * H * kT;
  const double scale = 1.0 / std::sqrt(double(D));
  const auto qkv = rnd<bf16>(qkv_n, 1.5);
  const auto d_o = rnd<bf16>(o_n, 1.0);
  auto o = nans<bf16>(o_n);
  auto lse_in = nans<float>(lse_n);
  std::vector<double> dq_ref(rows * H * D), dk_ref(rows * H * D), dv_ref(rows * H * D), p, lse;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const Head x = head_of(qkv, b, h, H, D);
      softmax_ref(x, D, scale, p, lse);
      auto at = [&](int t, int c) { return (size_t(b) * kT + t) * H * D + h * D + c; };
      // The kernel's inputs O and lse: the forward's, rounded as it stores them.
      for (int i = 0; i < kT; ++i) {
        lse_in[(size_t(b) * H + h) * kT + i] = float(lse[i]);
        for (int c = 0; c < D; ++c) {
          double s = 0;
          for (int j = 0; j < kT; ++j) s += p[i * kT + j] * x.v[j * D + c];
          o[at(i, c)] = fromd<bf16>(s);
        }
      }
      for (int i = 0; i < kT; ++i) {
        double delta = 0;
        for (int c = 0; c < D; ++c) delta += tod(d_o[at(i, c)]) * tod(o[at(i, c)]);
        for (int j = 0; j < kT; ++j) {
          double dp = 0;
          for (int c = 0; c < D; ++c) dp += tod(d_o[at(i, c)]) * x.v[j * D + c];
          const double pij = p[i * kT + j], ds = pij * (dp - delta);
          for (int c = 0; c < D; ++c) {
            dv_ref[at(j, c)] += pij * tod(d_o[at(i, c)]);
            dk_ref[at(j, c)] += scale * ds * x.q[i * D + c];
            dq_ref[at(i, c)] += scale * ds * x.kk[j * D + c];
          }
        }
      }
    }
  on_two_schedules(where, [&](bool check) {
    auto dqkv = nans<bf16>(qkv_n);
    k::attention_head_bwd_sm90(qkv.data(), o.data(), d_o.data(), lse_in.data(), dqkv.data(), B, H, D, float(scale),
                               nullptr);
    if (check) {
      // dqkv's q, k and v parts, each [rows][H * D].
      std::vector<bf16> part[3];
      for (int w = 0; w < 3; ++w) {
        part[w].resize(rows * H * D);
        for (size_t r = 0; r < rows; ++r)
          memcpy(&part[w][r * H * D], &dqkv[(r * 3 + w) * H * D], H * D * sizeof(bf16));
      }
      const char* names[3] = {"dq", "dk", "dv"};
      const std::vector<double>* refs[3] = {&dq_ref, &dk_ref, &dv_ref};
      for (int w = 0; w < 3; ++w) {
        double mx = 0;
        for (double r : *refs[w]) mx = std::max(mx, std::fabs(r));
        matches(names[w], where, part[w].data(), *refs[w], 3e-2 * mx, 1.5e-2);
      }
      pad_intact("dqkv", dqkv);
    }
    return bits_of(dqkv);
  });
}

int main() {
  emu::sm_count = 2;
  for (int D : {64, 72})
    for (auto bh : {std::pair<int, int>{1, 1}, std::pair<int, int>{2, 3}}) {
      forward_case(bh.first, bh.second, D);
      backward_case(bh.first, bh.second, D);
    }
  return finish();
}
