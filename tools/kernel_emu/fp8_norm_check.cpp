// The row kernels' fused fp8 output (kernels/fp8_cast.h, Fp8RowOut; their real source,
// tools/kernel_emu) against the unfused path it replaces: each of adaln_layernorm,
// residual_adaln (with and without a bias), rms_adaln and residual_rms_adaln writes h
// (bf16 or fp32), fp8_cast_kernel casts that h; the fused launch (h not written, and h
// written beside the codes) must give the same E4M3 bytes and the same amax bits, and h's
// bits where it writes h. Scales that saturate some values; a row with an Inf (NaN h, NaN
// amax); 16-byte and one-element-misaligned pointers (vector and scalar paths); outputs
// NaN- or sentinel-filled with NaN past every input. And fp8_transpose against the
// transposed codes: whole 64 x 64 tiles by the vector path, edges and misaligned ones
// byte by byte, nothing written past q_t. Exit 1 on any failure.
#include "check.h"
#include "kernels/adaln_layernorm.h"
#include "kernels/fp8_cast.h"
#include "kernels/residual_adaln.h"
#include "kernels/residual_rms_adaln.h"
#include "kernels/rms_adaln.h"

namespace k = perftrain::kernels;

namespace perftrain::kernels {
int multiprocessor_count() { return 2; }  // fp8_cast's grid: 2 "SMs"
}  // namespace perftrain::kernels

constexpr uint8_t kSentinel = 0xA5;

// What one launch of a row kernel gets: h (may be null) and the fp8 output (q null: none).
template <typename TA>
using RowLaunch = std::function<void(TA* h, const k::Fp8RowOut& fp8)>;

template <typename TA>
void compare_fused(const std::string& where, size_t rows, int D, int off, float scale, const RowLaunch<TA>& run) {
  const size_t N = rows * D;
  // Unfused: h, then the cast of the stored h.
  auto hs = nans<TA>(N + off);
  run(hs.data() + off, {});
  pad_intact("h", hs);
  std::vector<uint8_t> q_ref(N + off + kPad, kSentinel);
  float amax_ref = 0.25f;  // a start value below the data's: accumulated onto
  k::Fp8CastArgs a;
  a.x = hs.data() + off;
  a.x_type = sizeof(TA) == 4 ? k::Fp8Source::kF32 : k::Fp8Source::kBF16;
  a.rows = int64_t(rows), a.cols = D, a.scale = &scale, a.q = q_ref.data() + off, a.amax = &amax_ref;
  k::fp8_cast(a, nullptr);
  for (int pass = 0; pass < 2; ++pass) {  // 0: h not written; 1: h written beside the codes
    const std::string w = where + (pass == 0 ? " codes only" : " h and codes");
    auto h2 = nans<TA>(N + off);
    std::vector<uint8_t> q(N + off + kPad, kSentinel);
    float amax = 0.25f;
    run(pass == 0 ? nullptr : h2.data() + off, {q.data() + off, &scale, &amax});
    size_t bad = 0;
    for (size_t i = 0; i < N; ++i) bad += q[off + i] != q_ref[off + i];
    for (size_t i = N + off; i < q.size(); ++i) bad += q[i] != kSentinel;
    hash_bytes(q.data() + off, N);
    if (bad) { ++fails; printf("FAIL %s: %zu code bytes differ from the cast of h (or written past q)\n", w.c_str(), bad); }
    if (__float_as_uint(amax) != __float_as_uint(amax_ref)) {
      ++fails;
      printf("FAIL %s: amax %g, the cast's %g\n", w.c_str(), amax, amax_ref);
    }
    if (pass == 1 && std::memcmp(h2.data() + off, hs.data() + off, N * sizeof(TA)) != 0) {
      ++fails;
      printf("FAIL %s: h differs from the unfused launch's\n", w.c_str());
    }
  }
  printf("%s done, %d failures so far\n", where.c_str(), fails);
}

// x with an Inf in row 1 where `inf`.
template <typename TX> std::vector<TX> inputs(size_t N, int D, int off, bool inf) {
  auto xs = rnd<TX>(N + off, 2.0, 0.3);
  if (inf) xs[off + D + 3] = fromd<TX>(std::numeric_limits<double>::infinity());
  return xs;
}

template <typename TX, typename TM, typename TA>
void test_all(int B, int T, int D, int off, bool inf) {
  const std::string types = std::string(tn<TX>()) + tn<TM>() + tn<TA>();
  const std::string tail = " off" + std::to_string(off) + (inf ? " inf" : "");
  const size_t rows = size_t(B) * T, N = rows * D;
  auto xs = inputs<TX>(N, D, off, inf);
  auto ys = rnd<TA>(N + off, 1.5);
  auto bs = rnd<float>(D + off, 0.5);
  auto ws = rnd<float>(D + off, 0.5, 1.0);
  auto ms = rnd<TM>(size_t(B) * 4 * D + off, 0.6);
  const TX* x = xs.data() + off;
  const TA* y = ys.data() + off;
  const int64_t ss = 4 * D;
  const TM* gt = ms.data() + off;
  const TM* sh = ms.data() + D + off;
  const TM* sc = ms.data() + 2 * D + off;
  const float scale = 120.f;  // |h| beyond 448 / 120 saturates
  auto mu = nans<float>(rows), rs = nans<float>(rows), yr = nans<float>(rows);
  auto x1s = nans<TX>(N + off);
  compare_fused<TA>(case_name("adaln_layernorm", types.c_str(), B, T, D) + tail, rows, D, off, scale,
                    [&](TA* h, const k::Fp8RowOut& f) {
                      k::adaln_layernorm_forward<TX, TM, TA>(x, sh, ss, sc, ss, h, mu.data(), rs.data(), B, T, D,
                                                              1e-6f, nullptr, f);
                    });
  for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(bs.data() + off)})
    compare_fused<TA>(case_name("residual_adaln", types.c_str(), B, T, D) + tail + (bias ? " bias" : ""), rows, D, off,
                      scale, [&](TA* h, const k::Fp8RowOut& f) {
                        k::residual_adaln_forward<TX, TM, TA>(x, gt, ss, y, bias, sh, ss, sc, ss, x1s.data() + off, h,
                                                              mu.data(), rs.data(), nullptr, B, T, D, 1e-6f, nullptr, f);
                      });
  compare_fused<TA>(case_name("rms_adaln", types.c_str(), B, T, D) + tail, rows, D, off, scale,
                    [&](TA* h, const k::Fp8RowOut& f) {
                      k::rms_adaln_forward<TX, TM, TA>(x, ws.data() + off, sc, ss, h, rs.data(), nullptr, B, T, D,
                                                       1e-6f, nullptr, f);
                    });
  compare_fused<TA>(case_name("residual_rms_adaln", types.c_str(), B, T, D) + tail, rows, D, off, scale,
                    [&](TA* h, const k::Fp8RowOut& f) {
                      k::residual_rms_adaln_forward<TX, TM, TA>(x, gt, ss, y, ws.data() + off, ws.data() + off, sc, ss,
                                                                x1s.data() + off, h, yr.data(), rs.data(), nullptr, B, T,
                                                                D, 1e-6f, nullptr, f);
                    });
}

void test_transpose(int64_t rows, int64_t cols, int off) {
  const std::string where = "fp8_transpose " + std::to_string(rows) + "x" + std::to_string(cols) + " off" + std::to_string(off);
  const size_t n = size_t(rows * cols);
  std::vector<uint8_t> q(n + off + kPad), q_t(n + off + kPad, kSentinel);
  for (auto& b : q) b = uint8_t(rng());
  k::fp8_transpose(q.data() + off, rows, cols, q_t.data() + off, nullptr);
  size_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) bad += q_t[off + c * rows + r] != q[off + r * cols + c];
  for (size_t i = n + off; i < q_t.size(); ++i) bad += q_t[i] != kSentinel;
  hash_bytes(q_t.data() + off, n);
  if (bad) { ++fails; printf("FAIL %s: %zu bytes wrong\n", where.c_str(), bad); }
  printf("%s done, %d failures so far\n", where.c_str(), fails);
}

int main() {
  for (int D : {64, 200, 1152, 37})
    for (int off : {0, 1}) {
      test_all<float, bf16, bf16>(2, 3, D, off, false);
      test_all<bf16, bf16, bf16>(1, 2, D, off, false);
    }
  test_all<float, float, float>(2, 2, 96, 0, false);
  test_all<float, bf16, bf16>(2, 2, 64, 0, true);
  test_all<float, bf16, bf16>(1, 3, 37, 1, true);
  for (int off : {0, 1}) {
    test_transpose(64, 64, off);
    test_transpose(128, 192, off);
    test_transpose(130, 257, off);
    test_transpose(1, 1, off);
  }
  return finish();
}
