// gemm_bias_gelu_sm90 (fc1's fused kernel: its real source on the emulated sm_90a of
// sm90_emu.h) against a float64 reference of
//   pre = A W^T + bias,  act = gelu_tanh(pre)   (A [M, K], W [N, K], bf16; bias float or bf16)
// Shapes it takes (M % 128, N % 256, K % 64): one tile per consumer warpgroup, and 8 tiles
// on 2 and on 1 emulated SMs (each warpgroup several tiles: the handoff barriers, the ring
// of 4 stages wrapping with 3 k-steps a tile, the epilogue's 4 buffers in turn), and 6
// k-steps a tile (a stage refilled within its tile). Outputs
// start NaN, NaN past every buffer; every case runs twice, the second time on another schedule
// (set_schedule), and must give the same bits.
// Exit 1 on any failure.
#include "check.h"
#include "kernels/gemm_bias_gelu_sm90.h"

namespace k = perftrain::kernels;

template <typename TB>
static void gemm_case(int64_t M, int64_t N, int64_t K, int sms) {
  emu::sm_count = sms;
  const std::string where = std::string("gemm_bias_gelu_sm90 bias ") + (is16<TB>() ? "bf16" : "f32") + " M=" +
                            std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " SMs=" +
                            std::to_string(sms);
  const auto a = rnd<bf16>(M * K, 0.25), w = rnd<bf16>(N * K, 0.25);
  const auto bias = rnd<TB>(N, 0.5);
  std::vector<double> pre_ref(M * N), act_ref(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = tod(bias[j]);
      for (int64_t q = 0; q < K; ++q) s += tod(a[i * K + q]) * tod(w[j * K + q]);
      pre_ref[i * N + j] = s;
      act_ref[i * N + j] = 0.5 * s * (1 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
    }
  on_two_schedules(where, [&](bool check) {
    auto pre = nans<bf16>(M * N), act = nans<bf16>(M * N);
    k::gemm_bias_gelu_sm90<TB>(a.data(), w.data(), bias.data(), pre.data(), act.data(), M, N, K, nullptr);
    if (check) {
      matches("pre", where, pre.data(), pre_ref, 8e-3, 3e-3);
      matches("act", where, act.data(), act_ref, 8e-3, 3e-3);
      pad_intact("pre", pre);
      pad_intact("act", act);
    }
    return bits_of(pre, act);
  });
}

int main() {
  gemm_case<float>(128, 256, 64, 2);
  gemm_case<bf16>(256, 512, 192, 2);
  gemm_case<float>(256, 512, 192, 1);
  gemm_case<bf16>(128, 512, 384, 1);  // 6 k-steps a tile: stages refilled within a tile
  return finish();
}
