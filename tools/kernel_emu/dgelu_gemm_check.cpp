// gemm_dgelu_sm90 (fc2's backward product through GELU: the real source of
// gemm_bias_gelu_sm90.cu with W read MN-major, on the emulated sm_90a of sm90_emu.h) against
// a float64 reference of
//   dpre = (dY W2) * gelu_tanh'(pre)   (dY [M, K], W2 [K, N], pre [M, N], bf16)
//   partials[i, :] = column sums of dpre as stored over rows [128 i, 128 i + 128)   (fp32)
// Shapes it takes (M % 128, N % 256, K % 64): one tile per consumer warpgroup; 8 tiles on 2
// SMs (K = 192: the ring wrapping, the handoff barriers, the column-sum hand-over reused
// over tiles); 6 k-steps a tile on 1 SM (a stage refilled within its tile); and without
// partials (null: no sums). pre spans [-4, 4] (both of GELU's tails). Outputs start NaN, NaN
// past every buffer; each case runs on two schedules for the same bits. Exit 1 on any failure.
#include "check.h"
#include "kernels/gemm_bias_gelu_sm90.h"

namespace k = perftrain::kernels;

static double gelu_tanh_grad(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

static void dgelu_case(int64_t M, int64_t N, int64_t K, int sms, bool sums) {
  emu::sm_count = sms;
  const std::string where = "gemm_dgelu_sm90 M=" + std::to_string(M) + " N=" + std::to_string(N) +
                            " K=" + std::to_string(K) + " SMs=" + std::to_string(sms) + (sums ? "" : " no sums");
  const auto dy = rnd<bf16>(M * K, 0.25), w2 = rnd<bf16>(K * N, 0.25), pre = rnd<bf16>(M * N, 2.0);
  std::vector<double> dpre_ref(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t q = 0; q < K; ++q) s += tod(dy[i * K + q]) * tod(w2[q * N + j]);
      dpre_ref[i * N + j] = s * gelu_tanh_grad(tod(pre[i * N + j]));
    }
  const int64_t tiles_m = M / 128;
  on_two_schedules(where, [&](bool check) {
    auto dpre = nans<bf16>(M * N);
    auto partials = nans<float>(tiles_m * N);
    k::gemm_dgelu_sm90(dy.data(), w2.data(), pre.data(), dpre.data(), sums ? partials.data() : nullptr, M, N, K,
                       nullptr);
    if (check) {
      matches("dpre", where, dpre.data(), dpre_ref, 8e-3, 3e-3);
      pad_intact("dpre", dpre);
      pad_intact("partials", partials);
      if (sums) {
        // Against the sums of the kernel's own stored dpre (what the partials must add), and of the
        // float64 reference (a wrong row range or column would fail both).
        std::vector<double> of_stored(tiles_m * N, 0.0), of_ref(tiles_m * N, 0.0);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            of_stored[(i / 128) * N + j] += tod(dpre[i * N + j]);
            of_ref[(i / 128) * N + j] += dpre_ref[i * N + j];
          }
        close("partials (of dpre as stored)", where, partials.data(), of_stored, 1e-5);
        matches("partials (of the reference)", where, partials.data(), of_ref, 3e-2, 3e-3);
      } else {
        for (int64_t i = 0; i < tiles_m * N; ++i)
          if (!std::isnan(partials[i])) { ++fails; printf("FAIL %s: partials written without sums\n", where.c_str()); break; }
      }
    }
    return bits_of(dpre, partials);
  });
}

// The shapes the host refuses (the op then takes cuBLASLt's forms).
static void refuses() {
  const bool ok = k::gemm_dgelu_sm90_supported(128, 256, 64) && !k::gemm_dgelu_sm90_supported(129, 256, 64) &&
                  !k::gemm_dgelu_sm90_supported(128, 128, 64) && !k::gemm_dgelu_sm90_supported(128, 256, 96) &&
                  !k::gemm_dgelu_sm90_supported(0, 256, 64);
  if (!ok) { ++fails; printf("FAIL gemm_dgelu_sm90_supported\n"); }
}

int main() {
  refuses();
  dgelu_case(128, 256, 64, 2, true);
  dgelu_case(256, 512, 192, 2, true);
  dgelu_case(128, 512, 384, 1, true);  // 6 k-steps a tile: stages refilled within a tile
  dgelu_case(256, 256, 64, 1, false);
  return finish();
}
