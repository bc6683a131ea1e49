// gemm_swiglu_sm90 (the single-stream FFN's gate-up product with SwiGLU in its epilogue:
// the real source of gemm_bias_gelu_sm90.cu on the emulated sm_90a of sm90_emu.h) against
// a float64 reference of
//   gate_up = A W_gu^T [M, 2F],  h = silu(gate) * up [M, F]   (A [M, K], W_gu [2F, K], bf16)
// Shapes it takes (M % 128, F % 64, K % 64): one tile; F = 192 (3 tile columns, the up rows
// at F not a multiple of 128) on 2 SMs; several tiles a warpgroup on 1 SM with 6 k-steps a
// tile (the ring wrapping within a tile, the epilogue's buffers in turn over tiles of 6
// chunks). Outputs start NaN, NaN past every buffer; each case runs on two schedules for the
// same bits. Exit 1 on any failure.
#include "check.h"
#include "kernels/gemm_bias_gelu_sm90.h"

namespace k = perftrain::kernels;

static void swiglu_case(int64_t M, int64_t F, int64_t K, int sms) {
  emu::sm_count = sms;
  const std::string where = "gemm_swiglu_sm90 M=" + std::to_string(M) + " F=" + std::to_string(F) +
                            " K=" + std::to_string(K) + " SMs=" + std::to_string(sms);
  const auto a = rnd<bf16>(M * K, 0.25), w = rnd<bf16>(2 * F * K, 0.25);
  std::vector<double> gu_ref(M * 2 * F), h_ref(M * F);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < 2 * F; ++j) {
      double s = 0;
      for (int64_t q = 0; q < K; ++q) s += tod(a[i * K + q]) * tod(w[j * K + q]);
      gu_ref[i * 2 * F + j] = s;
    }
    for (int64_t j = 0; j < F; ++j) {
      const double g = gu_ref[i * 2 * F + j], u = gu_ref[i * 2 * F + F + j];
      h_ref[i * F + j] = g / (1 + std::exp(-g)) * u;
    }
  }
  on_two_schedules(where, [&](bool check) {
    auto gate_up = nans<bf16>(M * 2 * F), h = nans<bf16>(M * F);
    k::gemm_swiglu_sm90(a.data(), w.data(), gate_up.data(), h.data(), M, F, K, nullptr);
    if (check) {
      matches("gate_up", where, gate_up.data(), gu_ref, 8e-3, 3e-3);
      matches("h", where, h.data(), h_ref, 8e-3, 3e-3);
      pad_intact("gate_up", gate_up);
      pad_intact("h", h);
    }
    return bits_of(gate_up, h);
  });
}

// The shapes the host refuses (the op then takes the plain product and ops::swiglu).
static void refuses() {
  const bool ok = k::gemm_swiglu_sm90_supported(128, 64, 64) && !k::gemm_swiglu_sm90_supported(129, 64, 64) &&
                  !k::gemm_swiglu_sm90_supported(128, 96, 64) && !k::gemm_swiglu_sm90_supported(128, 64, 96) &&
                  !k::gemm_swiglu_sm90_supported(0, 64, 64);
  if (!ok) { ++fails; printf("FAIL gemm_swiglu_sm90_supported\n"); }
}

int main() {
  refuses();
  swiglu_case(128, 64, 64, 2);
  swiglu_case(256, 192, 192, 2);
  swiglu_case(256, 128, 384, 1);  // 4 tiles on one CTA, 6 k-steps a tile
  return finish();
}
