// qk_norm_rope kernels (their real source, tools/kernel_emu) against a float64 reference
// written from the math: for each (row, head) of q and of k, RMSNorm over the head's hd
// values times the weight, then pairs (2k, 2k+1) rotated by cos/sin[t, k] (t = row % T);
// q and k read in place from the projection's rows of 3D (v not touched), written as a
// dense q | k, and in the packed layout (rows of 3D, the Python op's: v columns never
// written). Backward: the gradient as cuDNN writes it (dq, dk apart) or packed; the inverse
// rotation of the incoming gradient, then RMSNorm's
// backward; the weight gradients as the kernel's fp32 partials [2][tiles][hd] summed over
// tiles, plainly and by the op's reduce (column_sums_reduce, also emulated: run.sh
// qk_norm_rope_check.cpp qk_norm_rope column_sums). Head dims 32..256 (1 to 4 pairs a lane), T = 1, 5,
// 257, 288, several B and H, fp32/bf16/fp16 storage, with and without weights, with and
// without weight gradients, the op's tile count and odd ones (empty tiles), pointers on
// a pair boundary but not a 16-byte one; every even hd 2..256 on odd row counts, on the
// vector path (8 or 4 elements a lane) where shape and alignment allow it and on the pair
// kernel (forced, or by a misaligned pointer or table), checking which path was taken.
// Outputs start NaN, NaN before and past every
// buffer (a read there poisons a result, a write there is reported). Exit 1 on failure.
#include "storage.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/column_sums.h"
#include <random>
#include <string>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace k = perftrain::kernels;
template <typename T> const char* tn() { return std::is_same<T, float>::value ? "f32" : std::is_same<T, bf16>::value ? "bf16" : "f16"; }

static std::mt19937_64 rng(11);
constexpr size_t kPad = 64;
static int fails = 0, checks = 0;
static int path_runs[9] = {};  // by the vector path's elements a lane (0: the pair kernel)
static const double kNaN = std::numeric_limits<double>::quiet_NaN();

// n elements at element offset `off` from a 64-byte boundary; NaN before and kPad after.
template <typename T> struct Buf {
  std::vector<T> v; size_t off, n; T* base;
  Buf(size_t n_, size_t off_ = 0) : v(n_ + off_ + kPad + 64 / sizeof(T)), off(off_), n(n_) {
    for (auto& e : v) e = fromd<T>(kNaN);
    base = v.data() + (64 / sizeof(T)) - (reinterpret_cast<uintptr_t>(v.data()) % 64) / sizeof(T);
  }
  T* p() { return base + off; }
  const T& operator[](size_t i) const { return base[off + i]; }
  bool pads_nan() const {
    for (size_t i = 0; i < off; ++i) if (!std::isnan(tod(base[i]))) return false;
    for (size_t i = off + n; i < off + n + kPad; ++i) if (!std::isnan(tod(base[i]))) return false;
    return true;
  }
};
template <typename T> void fill(Buf<T>& b, double std, double mean = 0) {
  std::normal_distribution<double> d(mean, std);
  for (size_t i = 0; i < b.n; ++i) b.p()[i] = fromd<T>(d(rng));
}

// |got - ref| <= tol * (1 + |ref|), every element finite.
template <typename G>
void close(const std::string& where, const char* what, const G& got, const std::vector<double>& ref, double tol) {
  ++checks;
  double maxe = 0; size_t bad = 0, nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = tod(got[i]);
    if (!std::isfinite(g)) { ++nan; continue; }
    const double e = std::fabs(g - ref[i]);
    maxe = std::max(maxe, e);
    if (e > tol * (1 + std::fabs(ref[i]))) ++bad;
  }
  if (bad || nan) { ++fails; printf("FAIL %s %s: %zu bad, %zu non-finite of %zu, max err %g\n", where.c_str(), what, bad, nan, ref.size(), maxe); }
}
static void expect(bool ok, const std::string& where, const char* what) {
  ++checks;
  if (!ok) { ++fails; printf("FAIL %s: %s\n", where.c_str(), what); }
}

// The q | k of an operand: q heads at column qc, k heads at column kc of rows
// `stride` apart, in one buffer or two (the gradient as cuDNN writes it).
template <typename T> struct Operand {
  Buf<T>* qb; size_t qc; Buf<T>* kb; size_t kc; int64_t stride;
  double at(int part, int r, int64_t j) const { return tod(part == 0 ? (*qb)[r * stride + qc + j] : (*kb)[r * stride + kc + j]); }
  template <typename P> k::QkRows<P> rows() const { return {qb->p() + qc, kb->p() + kc, stride}; }
};

// off: element offset of every data buffer (a multiple of 2: the kernels' rule).
// packed: every operand q | k | v rows of 3D (the Python op's packed layout); else x rows of
// 3D (the projection's output), out and dx dense [rows, 2D], dout two [rows, D] (cuDNN's dq, dk).
// tiles_mode: 0 = the op's count (132 SMs), 1 = 7 (or fewer if fewer items), 2 = one per item.
// vec: let the kernels take the vector path where they can (else the pair kernel);
// tab_off: float offset of the weights and tables (not 16-byte aligned: the pair kernel).
template <typename T>
void test(int B, int Tn, int H, int hd, bool with_w, bool want_dw, int tiles_mode, size_t off, bool vec = true,
          size_t tab_off = 0, bool packed = false) {
  const std::string where = std::string("qk_norm_rope ") + tn<T>() + " B=" + std::to_string(B) + " T=" + std::to_string(Tn) +
      " H=" + std::to_string(H) + " hd=" + std::to_string(hd) + " w" + std::to_string(with_w) + " dw" + std::to_string(want_dw) +
      " tiles" + std::to_string(tiles_mode) + " off" + std::to_string(off) + " vec" + std::to_string(vec) +
      " taboff" + std::to_string(tab_off) + (packed ? " packed" : "");
  const int rows = B * Tn, half = hd / 2;
  const int64_t D = int64_t(H) * hd, W = 3 * D, WO = packed ? W : 2 * D;
  const double eps = 1e-6;
  Buf<T> xb(size_t(rows) * W, off), ob(size_t(rows) * WO, off), dxb(size_t(rows) * WO, off);
  Buf<T> gq(size_t(rows) * (packed ? W : D), off), gk(size_t(rows) * D, off);
  fill(xb, 1.7, 0.2);
  fill(gq, 1.0);
  fill(gk, 1.0);
  const Operand<T> x{&xb, 0, &xb, size_t(D), W}, out{&ob, 0, &ob, size_t(D), WO}, dx{&dxb, 0, &dxb, size_t(D), WO};
  const Operand<T> g = packed ? Operand<T>{&gq, 0, &gq, size_t(D), W} : Operand<T>{&gq, 0, &gk, 0, D};
  Buf<float> qw(hd, tab_off), kw(hd, tab_off), cs(size_t(Tn) * half, tab_off), sn(size_t(Tn) * half, tab_off),
      rstd(size_t(rows) * 2 * H);
  fill(qw, 0.3, 1.0);
  fill(kw, 0.3, 0.9);
  for (int t = 0; t < Tn; ++t)
    for (int j = 0; j < half; ++j) {  // rope angles t * 10000^(-j / half), plus a random phase
      const double a = t * std::pow(10000.0, -double(j) / half) + std::uniform_real_distribution<double>(0, 6.3)(rng);
      cs.p()[t * half + j] = float(std::cos(a));
      sn.p()[t * half + j] = float(std::sin(a));
    }
  const float* qwp = with_w ? qw.p() : nullptr;
  const float* kwp = with_w ? kw.p() : nullptr;
  {  // the path the kernels take (the same rule for the backward's pointers, which share the offset)
    auto a = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    const uintptr_t strides = uintptr_t((W | WO | D) * int64_t(sizeof(T)));
    const int v = vec ? k::qk_norm_rope_vector_elems(hd, int(sizeof(T)), a(xb.p()) | a(ob.p()) | a(gq.p()) | a(gk.p()) | a(dxb.p()) | strides,
                                                     a(qwp) | a(kwp) | a(cs.p()) | a(sn.p()))
                      : 0;
    const int expect_v = !vec || tab_off % 4 != 0 ? 0
                         : hd % 8 == 0 && (off * sizeof(T)) % std::min<size_t>(16, 8 * sizeof(T)) == 0 ? 8
                         : hd % 4 == 0 && hd <= 128 && (off * sizeof(T)) % std::min<size_t>(16, 4 * sizeof(T)) == 0 ? 4
                                                                                                               : 0;
    expect(v == expect_v, where, "unexpected kernel path");
    ++path_runs[v];
  }
  k::qk_norm_rope_forward<T>(x.template rows<const T>(), qwp, kwp, cs.p(), sn.p(), out.template rows<T>(), rstd.p(), rows, Tn, H,
                             hd, float(eps), nullptr, vec);

  // float64 reference, [rows][2][D] (q heads, then k heads)
  const size_t N = size_t(rows) * 2 * D;
  std::vector<double> rout(N), rr(size_t(rows) * 2 * H), rdx(N), rdw(2 * size_t(hd), 0.0);
  auto wt = [&](int part, int j) { return with_w ? double((part == 0 ? qw : kw)[j]) : 1.0; };
  for (int r = 0; r < rows; ++r) {
    const int t = r % Tn;
    for (int h = 0; h < H; ++h) {
      for (int part = 0; part < 2; ++part) {
        const int64_t c0 = int64_t(h) * hd;
        const size_t b0 = size_t(r) * 2 * D + part * D + c0;
        double ss = 0;
        for (int j = 0; j < hd; ++j) ss += x.at(part, r, c0 + j) * x.at(part, r, c0 + j);
        const double rs = 1 / std::sqrt(ss / hd + eps);
        rr[size_t(r) * 2 * H + part * H + h] = rs;
        std::vector<double> xh(hd), gy(hd), dxh(hd);
        for (int kk = 0; kk < half; ++kk) {
          const double c = cs[t * half + kk], s = sn[t * half + kk];
          const double y0 = x.at(part, r, c0 + 2 * kk) * rs * wt(part, 2 * kk), y1 = x.at(part, r, c0 + 2 * kk + 1) * rs * wt(part, 2 * kk + 1);
          rout[b0 + 2 * kk] = y0 * c - y1 * s;
          rout[b0 + 2 * kk + 1] = y0 * s + y1 * c;
          // backward: out = R y, so gy = R^T g
          const double g0 = g.at(part, r, c0 + 2 * kk), g1 = g.at(part, r, c0 + 2 * kk + 1);
          gy[2 * kk] = c * g0 + s * g1;
          gy[2 * kk + 1] = -s * g0 + c * g1;
        }
        // RMSNorm backward with the kernel's own stored rstd (the forward's fp32 value)
        const double rk = rstd[size_t(r) * 2 * H + part * H + h];
        double m = 0;
        for (int j = 0; j < hd; ++j) { xh[j] = x.at(part, r, c0 + j) * rk; dxh[j] = gy[j] * wt(part, j); m += dxh[j] * xh[j]; }
        m /= hd;
        for (int j = 0; j < hd; ++j) {
          rdx[b0 + j] = rk * (dxh[j] - xh[j] * m);
          rdw[size_t(part) * hd + j] += gy[j] * xh[j];
        }
      }
    }
  }
  // An operand's q | k as [rows][2][D]; in the packed layout its v columns must still be NaN (never written).
  auto qk_of = [&](const Operand<T>& o) {
    std::vector<double> v(N);
    for (int r = 0; r < rows; ++r)
      for (int part = 0; part < 2; ++part)
        for (int64_t j = 0; j < D; ++j) v[size_t(r) * 2 * D + part * D + j] = o.at(part, r, j);
    return v;
  };
  auto v_untouched = [&](const Buf<T>& b) {
    bool nan = true;
    for (int r = 0; packed && r < rows; ++r)
      for (int64_t j = 2 * D; j < W; ++j) nan = nan && std::isnan(tod(b[size_t(r) * W + j]));
    return nan;
  };
  const bool lo = sizeof(T) == 2;
  close(where, "out", qk_of(out), rout, lo ? 1e-2 : 2e-6);
  close(where, "rstd", rstd, rr, 2e-6);
  expect(ob.pads_nan() && v_untouched(ob), where, "write outside out's q | k");
  expect(rstd.pads_nan(), where, "write outside rstd");

  const int64_t items = int64_t(rows) * H;
  int tiles = k::qk_norm_rope_backward_tiles(rows, H, 132);
  if (tiles_mode == 1) tiles = int(std::min<int64_t>(7, std::max<int64_t>(items, 1)));
  if (tiles_mode == 2) tiles = int(std::max<int64_t>(items, 1));
  Buf<float> parts(want_dw ? size_t(k::qk_norm_rope_backward_partials(tiles, hd)) : 1);
  k::qk_norm_rope_backward<T>(g.template rows<const T>(), x.template rows<const T>(), rstd.p(), qwp, kwp, cs.p(), sn.p(),
                              dx.template rows<T>(), want_dw ? parts.p() : nullptr, rows, Tn, H, hd, tiles, nullptr, vec);
  close(where, "dx", qk_of(dx), rdx, lo ? 1e-2 : 1e-5);
  expect(dxb.pads_nan() && v_untouched(dxb), where, "write outside dx's q | k");
  if (want_dw) {
    expect(parts.pads_nan(), where, "write outside the partials");
    // the reduce as the op does it (ops::batch_sums_into: kernels::column_sums_reduce on each
    // plane), and a plain fp32 sum over tiles in tile order
    Buf<float> red_q(hd), red_k(hd);
    float* oq[1] = {red_q.p()};
    float* ok[1] = {red_k.p()};
    k::column_sums_reduce(parts.p(), oq, 1, tiles, hd, nullptr);
    k::column_sums_reduce(parts.p() + size_t(tiles) * hd, ok, 1, tiles, hd, nullptr);
    expect(red_q.pads_nan() && red_k.pads_nan(), where, "write outside the reduced weight gradients");
    std::vector<float> dw(2 * size_t(hd), 0.f), dwk(2 * size_t(hd));
    for (int p = 0; p < 2; ++p)
      for (int t = 0; t < tiles; ++t)
        for (int j = 0; j < hd; ++j) dw[size_t(p) * hd + j] += parts[(size_t(p) * tiles + t) * hd + j];
    for (int j = 0; j < hd; ++j) { dwk[j] = red_q[j]; dwk[hd + j] = red_k[j]; }
    // error scale of a sum of items terms: the sum of their sizes
    double scale = 0;
    for (double v : rdw) scale = std::max(scale, std::fabs(v));
    std::vector<double> rel(rdw.size());
    for (size_t i = 0; i < rdw.size(); ++i) rel[i] = rdw[i] / std::max(scale, 1.0);
    std::vector<double> got(rdw.size()), gotk(rdw.size());
    for (size_t i = 0; i < rdw.size(); ++i) got[i] = dw[i] / std::max(scale, 1.0);
    for (size_t i = 0; i < rdw.size(); ++i) gotk[i] = dwk[i] / std::max(scale, 1.0);
    close(where, "dweight (partials summed over tiles)", got, rel, 1e-5);
    close(where, "dweight (column_sums_reduce)", gotk, rel, 1e-5);
  }
}

int main(int argc, char** argv) {
  struct S { int b, t, h; };
  // Shapes per T: (B, H); rows * H from 1 to ~1700 items.
  const std::vector<S> shapes = {{1, 1, 1}, {3, 1, 5}, {2, 5, 3}, {1, 5, 16}, {1, 257, 2}, {2, 257, 3}, {1, 288, 3}, {2, 288, 1}};
  const int hds[] = {32, 64, 72, 96, 128};
  int n = 0;
  for (auto s : shapes) {
    for (int hd : hds) {
      const bool big = int64_t(s.b) * s.t * s.h > 300;
      test<bf16>(s.b, s.t, s.h, hd, true, true, 0, 0);
      test<float>(s.b, s.t, s.h, hd, true, true, 0, 2);
      test<bf16>(s.b, s.t, s.h, hd, n % 2 == 0, n % 3 != 0, 1, 2);  // pair-aligned, not 16-byte
      test<float>(s.b, s.t, s.h, hd, false, true, 1, 0, true, 0, /*packed=*/true);
      if (!big) {
        test<f16>(s.b, s.t, s.h, hd, true, true, 2, 4);
        test<bf16>(s.b, s.t, s.h, hd, true, false, 2, 0);
      }
      ++n;
    }
    printf("B=%d T=%d H=%d done, %d failures\n", s.b, s.t, s.h, fails); fflush(stdout);
  }
  // the widest heads: 3 and 4 pairs a lane, and an hd that is not a multiple of 64
  for (int hd : {2, 34, 130, 192, 200, 256}) {
    test<bf16>(2, 5, 3, hd, true, true, 0, 0);
    test<float>(1, 257, 2, hd, true, true, 1, 2);
  }
  // every even head dim, odd row counts (B*T = 5, 7): each path the shape and offset allow
  // (8 or 4 elements a lane, or pairs), and the pair kernel forced; hd 4 (one lane a
  // head), 72 (16 lanes, 9 working), 132 (the pair kernel: 33 words of 4)
  for (int hd = 2; hd <= 256; hd += 2) {
    test<bf16>(1, 5, 3, hd, true, true, 1, 0);
    test<bf16>(1, 7, 2, hd, hd % 4 == 0, hd % 3 != 0, 0, 4, true, 0, hd % 4 == 2);  // 8 bytes: V = 4 at most
    test<float>(1, 5, 3, hd, hd % 8 != 0, true, 1, 4, hd % 16 == 0);
    if (hd % 8 == 0 || hd <= 16) test<f16>(1, 5, 2, hd, true, hd % 16 == 0, 2, 0, true, hd % 32 == 0 ? 1 : 0);
  }
  printf("every even hd done, %d failures\n", fails); fflush(stdout);
  // the SS shape's head count and its neighbours, the vector path against the pair one's grid
  for (int hd : {64, 72, 96, 128})
    for (bool vec : {true, false})
      for (bool packed : {false, true}) test<bf16>(1, 37, 12, hd, true, true, 0, 0, vec, 0, packed);
  printf("paths: vector 8 x%d, vector 4 x%d, pairs x%d\n", path_runs[8], path_runs[4], path_runs[0]);
  expect(path_runs[8] > 0 && path_runs[4] > 0 && path_runs[0] > 0, "paths", "a path never ran");
  // no rows: the backward writes zero partials
  {
    Buf<bf16> x(8), y(8);
    Buf<float> r(8), c(16), s(16), parts(size_t(k::qk_norm_rope_backward_partials(1, 32)));
    fill(c, 1.0); fill(s, 1.0);
    auto in = [](Buf<bf16>& b, int64_t k_off, int64_t stride) { return k::QkRows<const bf16>{b.p(), b.p() + k_off, stride}; };
    auto to = [](Buf<bf16>& b, int64_t k_off, int64_t stride) { return k::QkRows<bf16>{b.p(), b.p() + k_off, stride}; };
    k::qk_norm_rope_forward<bf16>(in(x, 2, 6), nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), r.p(), 0, 1, 1, 32, 1e-6f, nullptr);
    expect(k::qk_norm_rope_backward_tiles(0, 4, 132) == 1, "rows=0", "tiles != 1");
    k::qk_norm_rope_backward<bf16>(in(x, 2, 6), in(x, 2, 6), r.p(), nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), parts.p(), 0, 1, 1,
                                   32, 1, nullptr);
    bool zero = true;
    for (size_t i = 0; i < parts.n; ++i) zero = zero && parts[i] == 0.f;
    expect(zero && parts.pads_nan(), "rows=0", "partials not zero");
    int thrown = 0;
    const k::QkRows<const bf16> odd_k{x.p(), x.p() + 1, 4}, odd_stride{x.p(), x.p() + 2, 3};
    try { k::qk_norm_rope_forward<bf16>(odd_k, nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), r.p(), 1, 1, 1, 2, 1e-6f, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    try { k::qk_norm_rope_forward<bf16>(odd_stride, nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), r.p(), 2, 2, 1, 2, 1e-6f, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    try { k::qk_norm_rope_forward<bf16>(in(x, 2, 4), nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), r.p(), 1, 1, 1, 3, 1e-6f, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    try { k::qk_norm_rope_backward<bf16>(in(x, 2, 4), in(x, 2, 4), r.p(), nullptr, nullptr, c.p(), s.p(), to(y, 2, 4), nullptr, 1, 1, 1, 2, 2, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    expect(thrown == 4, "bad arguments", "not all thrown");
  }
  printf("%d checks, %d failures\n", checks, fails);
  return fails != 0;
}
