// adaln_layernorm and residual_adaln kernels (their real source, tools/kernel_emu) against
// a float64 reference: every forward output and gradient, NaN-poisoned outputs and NaN
// past every buffer's end, aligned and one-element-misaligned pointers (16-byte and scalar
// paths), the training dtypes and pure fp32/bf16/fp16, and for the residual op with and
// without a bias, a kept xhat, a gradient reaching x1 from elsewhere and the bias's
// per-sample sums (the row-ahead backward among them). Prints each failure; exit 1 if any.
#include "check.h"
#include "kernels/adaln_layernorm.h"
#include "kernels/residual_adaln.h"

namespace k = perftrain::kernels;

// Two-pass LayerNorm statistics of n values.
static void ln_stats(const double* v, int n, double& mean, double& rstd) {
  double s = 0;
  for (int c = 0; c < n; ++c) s += v[c];
  mean = s / n;
  double q = 0;
  for (int c = 0; c < n; ++c) q += (v[c] - mean) * (v[c] - mean);
  rstd = 1 / std::sqrt(q / n + 1e-6);
}

// The LayerNorm backward of one row of one sample, dy the gradient of
// xhat * (1 + scale) + shift: the row's dx of the norm, and the row's terms of
// the column sums of dy * xhat (-> dscale) and dy (-> dshift) added in.
template <typename TY, typename TM>
void ln_backward_row(const TY* dy, const double* xh, double rstd, const TM* scale_row, int D, double* dx,
                     double* dscale, double* dshift) {
  double sg = 0, sgx = 0;
  for (int c = 0; c < D; ++c) {
    const double g = tod(dy[c]) * (1 + tod(scale_row[c]));
    sg += g; sgx += g * xh[c];
    dscale[c] += tod(dy[c]) * xh[c];
    dshift[c] += tod(dy[c]);
  }
  for (int c = 0; c < D; ++c) dx[c] = rstd * (tod(dy[c]) * (1 + tod(scale_row[c])) - sg / D - xh[c] * sgx / D);
}

// offx: element offset of the row tensors' base pointers (misalignment); offm: extra column offset of the chunks.
template <typename TX, typename TM, typename TY>
void test_ln(int B, int T, int D, int offx, int offm) {
  const std::string types = std::string(tn<TX>()) + tn<TM>() + tn<TY>();
  const std::string where = case_name("adaln_layernorm", types.c_str(), B, T, D) + " off" + std::to_string(offx) + "," + std::to_string(offm);
  const size_t N = size_t(B) * T * D;
  auto xs = rnd<TX>(N + offx, 2.0, 0.3);
  auto ms = rnd<TM>(size_t(B) * 3 * D + offm, 0.5);
  const TX* x = xs.data() + offx;
  const int64_t ss = 3 * D;
  const TM* sh = ms.data() + offm;
  const TM* sc = ms.data() + D + offm;
  auto ys = nans<TY>(N + offx);
  auto mu = nans<float>(size_t(B) * T), rs = nans<float>(size_t(B) * T);
  TY* y = ys.data() + offx;
  k::adaln_layernorm_forward<TX, TM, TY>(x, sh, ss, sc, ss, y, mu.data(), rs.data(), B, T, D, 1e-6f, nullptr);
  std::vector<double> yr(N), xh(N), mr(size_t(B) * T), rr(size_t(B) * T), row(D);
  auto A = [&](int b, int c) { return tod(sc[b * ss + c]); };
  auto M = [&](int b, int c) { return tod(sh[b * ss + c]); };
  for (int r = 0; r < B * T; ++r) {
    for (int c = 0; c < D; ++c) row[c] = tod(x[size_t(r) * D + c]);
    ln_stats(row.data(), D, mr[r], rr[r]);
    for (int c = 0; c < D; ++c) {
      const size_t i = size_t(r) * D + c;
      xh[i] = (row[c] - mr[r]) * rr[r];
      yr[i] = xh[i] * (1 + A(r / T, c)) + M(r / T, c);
    }
  }
  pad_intact("y", ys); pad_intact("mean", mu); pad_intact("rstd", rs);
  close("y", where, y, yr, is16<TY>() ? 2e-2 : 1e-4);
  close("mean", where, mu.data(), mr, 1e-5);
  close("rstd", where, rs.data(), rr, 1e-5);
  // backward
  auto dys = rnd<TY>(N + offx, 1.0);
  const TY* dy = dys.data() + offx;
  auto dxs = nans<TX>(N + offx);
  auto dsh = nans<TM>(size_t(B) * D), dsc = nans<TM>(size_t(B) * D);
  const int tiles = k::adaln_layernorm_backward_tiles(B, T, 132);
  auto parts = nans<float>(2 * size_t(B) * tiles * D + offx);
  k::adaln_layernorm_backward<TX, TM, TY>(dy, x, sc, ss, mu.data(), rs.data(), dxs.data() + offx, dsh.data(), dsc.data(),
                                          parts.data() + offx, B, T, D, tiles, nullptr);
  std::vector<double> dxr(N), dshr(size_t(B) * D, 0.0), dscr(size_t(B) * D, 0.0);
  for (int r = 0; r < B * T; ++r)
    ln_backward_row(dy + size_t(r) * D, &xh[size_t(r) * D], rr[r], sc + (r / T) * ss, D, &dxr[size_t(r) * D],
                    &dscr[size_t(r / T) * D], &dshr[size_t(r / T) * D]);
  pad_intact("dx", dxs); pad_intact("dshift", dsh); pad_intact("dscale", dsc); pad_intact("partials", parts);
  close("dx", where, dxs.data() + offx, dxr, is16<TX>() ? 2e-2 : 1e-4);
  rel_l2("dshift", where, dsh.data(), dshr, is16<TM>() ? 1e-2 : 1e-5);
  rel_l2("dscale", where, dsc.data(), dscr, is16<TM>() ? 1e-2 : 1e-5);
}

template <typename TX, typename TM, typename TA>
void test_res(int B, int T, int D, bool with_bias, bool keep_xhat, bool with_ext, bool want_dbias, int offx, int offm) {
  const std::string types = std::string(tn<TX>()) + tn<TM>() + tn<TA>();
  const std::string where = case_name("residual_adaln", types.c_str(), B, T, D) + " bias" + std::to_string(with_bias) +
      " xhat" + std::to_string(keep_xhat) + " ext" + std::to_string(with_ext) + " dbias" + std::to_string(want_dbias) +
      " off" + std::to_string(offx) + "," + std::to_string(offm);
  const size_t N = size_t(B) * T * D;
  auto xs = rnd<TX>(N + offx, 2.0, 0.3);
  auto ys = rnd<TA>(N + offx, 1.5);
  auto bs = rnd<float>(D + offx, 0.5);
  auto ms = rnd<TM>(size_t(B) * 4 * D + offm, 0.6);
  const TX* x = xs.data() + offx;
  const TA* y = ys.data() + offx;
  const float* bias = with_bias ? bs.data() + offx : nullptr;
  const int64_t ss = 4 * D;
  const TM* gt = ms.data() + offm;
  const TM* sh = ms.data() + D + offm;
  const TM* sc = ms.data() + 2 * D + offm;
  auto x1s = nans<TX>(N + offx);
  auto hs = nans<TA>(N + offx), xhs = nans<TA>(N + offx);
  auto mu = nans<float>(size_t(B) * T), rs = nans<float>(size_t(B) * T);
  TX* x1 = x1s.data() + offx;
  TA* h = hs.data() + offx;
  TA* xhat = keep_xhat ? xhs.data() + offx : nullptr;
  k::residual_adaln_forward<TX, TM, TA>(x, gt, ss, y, bias, sh, ss, sc, ss, x1, h, mu.data(), rs.data(), xhat, B, T, D,
                                        1e-6f, nullptr);
  auto G = [&](int b, int c) { return tod(gt[b * ss + c]); };
  auto A = [&](int b, int c) { return tod(sc[b * ss + c]); };
  auto M = [&](int b, int c) { return tod(sh[b * ss + c]); };
  auto Y = [&](size_t i, int c) { return tod(y[i]) + (bias ? double(bias[c]) : 0.0); };
  std::vector<double> x1r(N), hr(N), xh(N), mr(size_t(B) * T), rr(size_t(B) * T);
  for (int r = 0; r < B * T; ++r) {
    const int b = r / T;
    for (int c = 0; c < D; ++c) {
      const size_t i = size_t(r) * D + c;
      x1r[i] = tod(fromd<TX>(tod(x[i]) + G(b, c) * Y(i, c)));
    }
    ln_stats(&x1r[size_t(r) * D], D, mr[r], rr[r]);
    for (int c = 0; c < D; ++c) {
      const size_t i = size_t(r) * D + c;
      xh[i] = (x1r[i] - mr[r]) * rr[r];
      hr[i] = xh[i] * (1 + A(b, c)) + M(b, c);
    }
  }
  pad_intact("x1", x1s); pad_intact("h", hs); pad_intact("xhat", xhs); pad_intact("mean", mu); pad_intact("rstd", rs);
  close("x1", where, x1, x1r, is16<TX>() ? 2e-2 : 1e-5);
  close("h", where, h, hr, is16<TA>() ? 2e-2 : 1e-4);
  close("mean", where, mu.data(), mr, is16<TX>() ? 1e-3 : 1e-5);
  close("rstd", where, rs.data(), rr, is16<TX>() ? 1e-3 : 1e-5);
  if (xhat) close("xhat", where, xhat, xh, 2e-2);
  // backward
  auto es = rnd<TX>(N + offx, 1.0);
  auto dhs = rnd<TA>(N + offx, 1.0);
  const TX* ext = with_ext ? es.data() + offx : nullptr;
  const TA* dh = dhs.data() + offx;
  auto dxs = nans<TX>(N + offx);
  auto dys = nans<TA>(N + offx);
  auto dg = nans<TM>(size_t(B) * D), dsh = nans<TM>(size_t(B) * D), dsc = nans<TM>(size_t(B) * D);
  auto dbs = nans<float>(size_t(B) * D);
  const bool sums = bias != nullptr || want_dbias;
  const int tiles = k::residual_adaln_backward_tiles(B, T, D, sums, 132);
  auto parts = nans<float>(k::residual_adaln_backward_partials(B, tiles, D, sums) + offx);
  k::residual_adaln_backward<TX, TM, TA>(ext, dh, xhat ? nullptr : x1, xhat, y, bias, gt, ss, sc, ss,
                                         xhat ? nullptr : mu.data(), rs.data(), dxs.data() + offx, dys.data() + offx,
                                         dg.data(), dsh.data(), dsc.data(), want_dbias ? dbs.data() : nullptr,
                                         parts.data() + offx, B, T, D, tiles, nullptr);
  std::vector<double> dxr(N), dyr(N), dgr(size_t(B) * D, 0.0), dshr(size_t(B) * D, 0.0), dscr(size_t(B) * D, 0.0),
      dbr(size_t(B) * D, 0.0);
  std::vector<double> dln(D);
  for (int r = 0; r < B * T; ++r) {
    const int b = r / T;
    ln_backward_row(dh + size_t(r) * D, &xh[size_t(r) * D], rr[r], sc + b * ss, D, dln.data(),
                    &dscr[size_t(b) * D], &dshr[size_t(b) * D]);
    for (int c = 0; c < D; ++c) {
      const size_t i = size_t(r) * D + c;
      const double dx1 = (ext ? tod(ext[i]) : 0.0) + dln[c];
      dxr[i] = dx1;
      dyr[i] = dx1 * G(b, c);
      dgr[size_t(b) * D + c] += dx1 * Y(i, c);
      dbr[size_t(b) * D + c] += dx1 * G(b, c);
    }
  }
  pad_intact("dx", dxs); pad_intact("dy", dys); pad_intact("dgate", dg); pad_intact("dshift", dsh);
  pad_intact("dscale", dsc); pad_intact("dbias_ps", dbs); pad_intact("partials", parts);
  const bool loose = xhat != nullptr || is16<TX>();
  close("dx", where, dxs.data() + offx, dxr, is16<TX>() ? 2e-2 : (loose ? 5e-3 : 1e-4));
  close("dy", where, dys.data() + offx, dyr, is16<TA>() ? 2e-2 : (loose ? 5e-3 : 1e-4));
  const double st = loose ? 5e-3 : 1e-5;
  rel_l2("dgate", where, dg.data(), dgr, is16<TM>() ? 1e-2 : st);
  rel_l2("dshift", where, dsh.data(), dshr, is16<TM>() ? 1e-2 : st);
  rel_l2("dscale", where, dsc.data(), dscr, is16<TM>() ? 1e-2 : st);
  if (want_dbias) rel_l2("dbias_ps", where, dbs.data(), dbr, st);
}

int main() {
  struct S { int b, t, d; };
  // Widths that take each forward register budget (2..6 vectors a lane, a block per row),
  // the narrow-bias row-ahead backward (up to 4096) and the wide one, odd widths (scalar).
  const std::vector<S> shapes = {{1, 1, 37}, {2, 13, 72}, {2, 9, 384}, {2, 4, 640}, {1, 5, 1003}, {2, 6, 1152},
                                 {1, 5, 1544}, {1, 3, 4096}, {1, 2, 5000}, {1, 2, 8192}, {5, 20, 64}};
  for (auto s : shapes) {
    printf("shape [%d,%d,%d]\n", s.b, s.t, s.d); fflush(stdout);
    for (int off : {0, 1}) {
      test_ln<float, bf16, bf16>(s.b, s.t, s.d, off, off);
      test_ln<float, float, float>(s.b, s.t, s.d, off, 0);
      test_ln<float, float, float>(s.b, s.t, s.d, 0, off);
      test_ln<bf16, bf16, bf16>(s.b, s.t, s.d, off, off);
      test_ln<float, f16, f16>(s.b, s.t, s.d, off, off);
      for (int v = 0; v < 4; ++v) {
        const bool bias = v & 1, dbias = v & 2;
        for (bool ext : {true, false}) {
          test_res<float, bf16, bf16>(s.b, s.t, s.d, bias, true, ext, dbias, off, off);
          test_res<float, bf16, bf16>(s.b, s.t, s.d, bias, false, ext, dbias, off, off);
        }
        test_res<float, float, float>(s.b, s.t, s.d, bias, false, true, dbias, off, 0);
        test_res<float, float, float>(s.b, s.t, s.d, bias, false, false, dbias, 0, off);
        test_res<bf16, bf16, bf16>(s.b, s.t, s.d, bias, false, true, dbias, off, off);
        test_res<float, f16, f16>(s.b, s.t, s.d, bias, true, true, dbias, off, off);
      }
    }
  }
  return finish();
}
