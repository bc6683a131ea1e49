// rms_adaln and residual_rms_adaln kernels (their real source, tools/kernel_emu) against
// a float64 reference: every forward output and gradient, NaN-poisoned outputs and NaN
// past every buffer's end (a read there poisons a result, a write there is reported),
// aligned and one-element-misaligned pointers (16-byte and scalar paths), the training
// dtypes and pure fp32/bf16/fp16, with and without weights and scale, and for the
// residual op both outputs, h only and x1 only. Prints each failure; exit 1 if any.
// An argument: zero tokens instead (values are zero there, so only NaN/throws count).
#include "check.h"
#include "kernels/rms_adaln.h"
#include "kernels/residual_rms_adaln.h"

// offx: element offset of x/dh/... base pointers (misalignment); offm: extra column offset of the chunk.
// The SM count the backward's tiles are sized for: 132 (an H200), or 1 from 7 tokens on, so that
// a tile takes several rows (the row-ahead loads of the residual backward's EARLY path).
int sms(int T) { return T >= 7 ? 1 : 132; }

template <typename TX, typename TM, typename TY>
void test_rms(int B, int T, int D, bool with_w, bool with_s, bool keep_xhat, int offx, int offm) {
  const std::string where = std::string("rms_adaln ") + tn<TX>() + tn<TM>() + tn<TY>() +
      " [" + std::to_string(B) + "," + std::to_string(T) + "," + std::to_string(D) + "] w" + std::to_string(with_w) + " s" +
      std::to_string(with_s) + " xhat" + std::to_string(keep_xhat) + " off" + std::to_string(offx) + "," + std::to_string(offm);
  const size_t N = size_t(B) * T * D;
  auto xs = rnd<TX>(N + offx, 2.0, 0.3);
  auto ws = rnd<float>(D + offx, 0.3, 1.0);
  auto ms = rnd<TM>(size_t(B) * 3 * D + offm, 0.5);
  const TX* x = xs.data() + offx;
  const float* w = with_w ? ws.data() + offx : nullptr;
  const TM* sc = with_s ? ms.data() + D + offm : nullptr;
  const int64_t ss = 3 * D;
  auto hs = nans<TY>(N + offx), xhs = nans<TY>(N + offx);
  auto rs = nans<float>(size_t(B) * T);
  TY* h = hs.data() + offx;
  TY* xh = keep_xhat ? xhs.data() + offx : nullptr;
  perftrain::kernels::rms_adaln_forward<TX, TM, TY>(x, w, sc, ss, h, rs.data(), xh, B, T, D, 1e-6f, nullptr);
  std::vector<double> href(N), xhref(N), rref(size_t(B) * T);
  auto W = [&](int c) { return w ? double(w[c]) : 1.0; };
  auto A = [&](int b, int c) { return sc ? tod(sc[b * ss + c]) : 0.0; };
  for (int r = 0; r < B * T; ++r) {
    double s = 0; for (int c = 0; c < D; ++c) { double v = tod(x[size_t(r) * D + c]); s += v * v; }
    double rr = 1 / std::sqrt(s / D + 1e-6); rref[r] = rr;
    for (int c = 0; c < D; ++c) { double xv = tod(x[size_t(r) * D + c]) * rr; xhref[size_t(r) * D + c] = xv; href[size_t(r) * D + c] = xv * W(c) * (1 + A(r / T, c)); }
  }
  pad_intact("h", hs); pad_intact("xhat", xhs); pad_intact("rstd", rs);
  const double tv = is16<TY>() ? 2e-2 : 1e-4;
  close("h", where, h, href, tv);
  close("rstd", where, rs.data(), rref, 1e-5);
  if (xh) close("xhat", where, xh, xhref, 2e-2);
  // backward
  auto dhs = rnd<TY>(N + offx, 1.0);
  const TY* dh = dhs.data() + offx;
  auto dxs = nans<TX>(N + offx);
  TX* dx = dxs.data() + offx;
  auto dsc = nans<TM>(size_t(B) * D);
  auto dwps = nans<float>(size_t(B) * D);
  const int tiles = perftrain::kernels::rms_adaln_backward_tiles(B, T, D, sms(T));
  auto parts = nans<float>(perftrain::kernels::rms_adaln_backward_partials(B, tiles, D) + offx);
  perftrain::kernels::rms_adaln_backward<TX, TM, TY>(dh, xh ? nullptr : x, xh, w, sc, ss, rs.data(), dx, sc ? dsc.data() : nullptr,
                                                     w ? dwps.data() : nullptr, parts.data() + offx, B, T, D, tiles, nullptr);
  std::vector<double> dxr(N), Q(size_t(B) * D, 0.0), dsr(size_t(B) * D), dwr(size_t(B) * D);
  for (int r = 0; r < B * T; ++r) {
    const int b = r / T; double sg = 0;
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; double g = tod(dh[i]) * W(c) * (1 + A(b, c)); sg += g * xhref[i]; Q[size_t(b) * D + c] += tod(dh[i]) * xhref[i]; }
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; double g = tod(dh[i]) * W(c) * (1 + A(b, c)); dxr[i] = rref[r] * (g - xhref[i] * sg / D); }
  }
  for (int b = 0; b < B; ++b) for (int c = 0; c < D; ++c) { size_t i = size_t(b) * D + c; dsr[i] = W(c) * Q[i]; dwr[i] = (1 + A(b, c)) * Q[i]; }
  pad_intact("dx", dxs); pad_intact("dscale", dsc); pad_intact("dw_ps", dwps); pad_intact("partials", parts);
  close("dx", where, dx, dxr, is16<TX>() ? 2e-2 : (xh ? 5e-3 : 1e-4));
  const double st = (xh ? 5e-3 : 1e-5);
  if (sc) rel_l2("dscale", where, dsc.data(), dsr, is16<TM>() ? 1e-2 : st);
  if (w) rel_l2("dweight_ps", where, dwps.data(), dwr, st);
}

template <typename TX, typename TM, typename TA>
void test_res(int B, int T, int D, bool with_opt, bool keep_xhat, bool with_ext, bool with_dh, int offx, int offm) {
  const std::string where = std::string("residual ") + tn<TX>() + tn<TM>() + tn<TA>() +
      " [" + std::to_string(B) + "," + std::to_string(T) + "," + std::to_string(D) + "] opt" + std::to_string(with_opt) + " xhat" +
      std::to_string(keep_xhat) + " ext" + std::to_string(with_ext) + " dh" + std::to_string(with_dh) + " off" + std::to_string(offx) + "," + std::to_string(offm);
  const size_t N = size_t(B) * T * D;
  auto xs = rnd<TX>(N + offx, 2.0, 0.3);
  auto ys = rnd<TA>(N + offx, 3.0);
  auto pws = rnd<float>(D + offx, 0.3, 1.0), qws = rnd<float>(D + offx, 0.3, 1.0);
  auto mas = rnd<TM>(size_t(B) * 4 * D + offm, 0.7), mbs = rnd<TM>(size_t(B) * 4 * D + offm, 0.5);
  const TX* x = xs.data() + offx; const TA* y = ys.data() + offx;
  const float* pw = with_opt ? pws.data() + offx : nullptr; const float* qw = with_opt ? qws.data() + offx : nullptr;
  const TM* gt = mas.data() + D + offm; const TM* sc = with_opt ? mbs.data() + 2 * D + offm : nullptr;
  const int64_t ss = 4 * D;
  auto x1s = nans<TX>(N + offx); auto hs = nans<TA>(N + offx), xhs = nans<TA>(N + offx);
  auto yr = nans<float>(size_t(B) * T), rr = nans<float>(size_t(B) * T);
  TX* x1 = x1s.data() + offx; TA* h = hs.data() + offx; TA* xh = keep_xhat ? xhs.data() + offx : nullptr;
  perftrain::kernels::residual_rms_adaln_forward<TX, TM, TA>(x, gt, ss, y, pw, qw, sc, ss, x1, h, yr.data(), rr.data(), xh, B, T, D, 1e-6f, nullptr);
  auto PW = [&](int c) { return pw ? double(pw[c]) : 1.0; };
  auto QW = [&](int c) { return qw ? double(qw[c]) : 1.0; };
  auto A = [&](int b, int c) { return sc ? tod(sc[b * ss + c]) : 0.0; };
  auto TG = [&](int b, int c) { return std::tanh(tod(gt[b * ss + c])); };
  std::vector<double> x1r(N), hr(N), yhat(N), x1hat(N), ryr(size_t(B) * T), r1r(size_t(B) * T);
  for (int r = 0; r < B * T; ++r) {
    const int b = r / T; double s = 0;
    for (int c = 0; c < D; ++c) { double v = tod(y[size_t(r) * D + c]); s += v * v; }
    ryr[r] = 1 / std::sqrt(s / D + 1e-6); s = 0;
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; yhat[i] = tod(y[i]) * ryr[r]; x1r[i] = tod(fromd<TX>(tod(x[i]) + TG(b, c) * yhat[i] * PW(c))); s += x1r[i] * x1r[i]; }
    r1r[r] = 1 / std::sqrt(s / D + 1e-6);
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; x1hat[i] = x1r[i] * r1r[r]; hr[i] = x1hat[i] * QW(c) * (1 + A(b, c)); }
  }
  pad_intact("x1", x1s); pad_intact("h", hs); pad_intact("xhat", xhs); pad_intact("y_rstd", yr); pad_intact("rstd", rr);
  close("x1", where, x1, x1r, is16<TX>() ? 2e-2 : 1e-5);
  close("h", where, h, hr, is16<TA>() ? 2e-2 : 1e-4);
  close("y_rstd", where, yr.data(), ryr, 1e-5);
  close("rstd", where, rr.data(), r1r, is16<TX>() ? 1e-3 : 1e-5);
  auto e1s = rnd<TX>(N + offx, 1.0); auto dhs = rnd<TA>(N + offx, 1.0);
  const TX* ext = with_ext ? e1s.data() + offx : nullptr; const TA* dh = with_dh ? dhs.data() + offx : nullptr;
  auto dxs = nans<TX>(N + offx); auto dys = nans<TA>(N + offx);
  auto dg = nans<TM>(size_t(B) * D), ds = nans<TM>(size_t(B) * D); auto dpw = nans<float>(size_t(B) * D), dqw = nans<float>(size_t(B) * D);
  const int tiles = perftrain::kernels::residual_rms_adaln_backward_tiles(B, T, D, sms(T));
  auto parts = nans<float>(perftrain::kernels::residual_rms_adaln_backward_partials(B, tiles, D) + offx);
  perftrain::kernels::residual_rms_adaln_backward<TX, TM, TA>(ext, dh, xh ? nullptr : x1, xh, y, pw, qw, gt, ss, sc, ss, yr.data(), rr.data(),
      dxs.data() + offx, dys.data() + offx, dg.data(), (dh && sc) ? ds.data() : nullptr, pw ? dpw.data() : nullptr, (dh && qw) ? dqw.data() : nullptr,
      parts.data() + offx, B, T, D, tiles, nullptr);
  std::vector<double> dxr(N), dyr(N), Q1(size_t(B) * D, 0), Q2(size_t(B) * D, 0);
  for (int r = 0; r < B * T; ++r) {
    const int b = r / T; double s1 = 0, s2 = 0;
    std::vector<double> e(D);
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; if (dh) { double g = tod(dh[i]) * QW(c) * (1 + A(b, c)); s1 += g * x1hat[i]; Q1[size_t(b) * D + c] += tod(dh[i]) * x1hat[i]; } }
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; e[c] = ext ? tod(ext[i]) : 0; if (dh) { double g = tod(dh[i]) * QW(c) * (1 + A(b, c)); e[c] += r1r[r] * (g - x1hat[i] * s1 / D); }
      dxr[i] = e[c]; double g2 = e[c] * TG(b, c) * PW(c); s2 += g2 * yhat[i]; Q2[size_t(b) * D + c] += e[c] * yhat[i]; }
    for (int c = 0; c < D; ++c) { size_t i = size_t(r) * D + c; double g2 = e[c] * TG(b, c) * PW(c); dyr[i] = ryr[r] * (g2 - yhat[i] * s2 / D); }
  }
  std::vector<double> dgr(size_t(B) * D), dsr(size_t(B) * D), dpr(size_t(B) * D), dqr(size_t(B) * D);
  for (int b = 0; b < B; ++b) for (int c = 0; c < D; ++c) { size_t i = size_t(b) * D + c; double tg = TG(b, c);
    dgr[i] = (1 - tg * tg) * PW(c) * Q2[i]; dpr[i] = tg * Q2[i]; dsr[i] = QW(c) * Q1[i]; dqr[i] = (1 + A(b, c)) * Q1[i]; }
  pad_intact("dx", dxs); pad_intact("dy", dys); pad_intact("dgate", dg); pad_intact("dscale", ds); pad_intact("dpw", dpw); pad_intact("dqw", dqw); pad_intact("partials", parts);
  const bool loose = is16<TX>() || (xh && dh);
  close("dx", where, dxs.data() + offx, dxr, is16<TX>() ? 2e-2 : (loose ? 5e-3 : 1e-4));
  close("dy", where, dys.data() + offx, dyr, is16<TA>() ? 2e-2 : (loose ? 2e-3 : 1e-4));
  const double st = loose ? 5e-3 : 1e-5;
  rel_l2("dgate", where, dg.data(), dgr, is16<TM>() ? 1e-2 : st);
  if (pw) rel_l2("dpost_ps", where, dpw.data(), dpr, st);
  if (dh && sc) rel_l2("dscale", where, ds.data(), dsr, is16<TM>() ? 1e-2 : st);
  if (dh && qw) rel_l2("dpre_ps", where, dqw.data(), dqr, st);
}

int main(int argc, char** argv) {
  struct S { int b, t, d; };
  std::vector<S> shapes = {{1, 1, 37}, {2, 3, 200}, {2, 13, 72}, {2, 9, 384}, {2, 5, 1003}, {2, 6, 1152}, {1, 5, 1544}, {2, 3, 2048}, {1, 3, 4104}, {1, 2, 8192}, {1, 2, 5003}, {5, 20, 64}, {2, 7, 768}, {1, 9, 1024}, {2, 4, 1536}};
  if (argc > 1) shapes = {{2, 0, 64}};
  for (auto s : shapes) {
    printf("shape [%d,%d,%d]\n", s.b, s.t, s.d); fflush(stdout);
    for (int off : {0, 1}) {
      for (bool w : {true, false}) for (bool sc : {true, false}) {
        test_rms<float, bf16, bf16>(s.b, s.t, s.d, w, sc, true, off, off);
        test_rms<float, bf16, bf16>(s.b, s.t, s.d, w, sc, false, off, off);
      }
      test_rms<float, float, float>(s.b, s.t, s.d, true, true, false, off, 0);
      test_rms<float, float, float>(s.b, s.t, s.d, true, true, false, 0, off);
      test_rms<bf16, bf16, bf16>(s.b, s.t, s.d, true, true, false, off, off);
      test_rms<float, f16, f16>(s.b, s.t, s.d, true, true, true, off, off);
      for (bool opt : {true, false}) for (int use = 0; use < 3; ++use) {
        const bool ext = use != 1, dh = use != 2;
        test_res<float, bf16, bf16>(s.b, s.t, s.d, opt, true, ext, dh, off, off);
        test_res<float, bf16, bf16>(s.b, s.t, s.d, opt, false, ext, dh, off, off);
        test_res<float, float, float>(s.b, s.t, s.d, opt, false, ext, dh, off, 0);
        test_res<float, float, float>(s.b, s.t, s.d, opt, false, ext, dh, 0, off);
        test_res<bf16, bf16, bf16>(s.b, s.t, s.d, opt, false, ext, dh, off, off);
        test_res<float, f16, f16>(s.b, s.t, s.d, opt, true, ext, dh, off, off);
      }
    }
  }
  return finish();
}
