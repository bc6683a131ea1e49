// swiglu kernels (their real source, tools/kernel_emu) against a float64 reference of
//   out = silu(g) * u,  dg = dout * u * s * (1 + g * (1 - s)),  du = dout * silu(g),  s = sigmoid(g)
// forward and backward on fp32, bf16 and fp16 storage; widths F that take every vector
// width (8, 4, 2, 1), narrow rows (several rows per warp) and wide ones (threads loop);
// base pointers offset by 0..7 elements (each width's alignment rule, checked against
// swiglu_vector_width); gates far out (|g| = 100, 1000: exp over- and underflow) that
// must give finite results. Outputs start NaN, NaN before and past every buffer (a read
// there poisons a result, a write there is reported). Exit 1 on any failure.
// An argument "big": also the grid-stride loop (more rows than 65536 blocks hold).
#include "storage.h"
#include "kernels/swiglu.h"
#include <random>
#include <string>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace k = perftrain::kernels;
template <typename T> const char* tn() { return std::is_same<T, float>::value ? "f32" : std::is_same<T, bf16>::value ? "bf16" : "f16"; }

static std::mt19937_64 rng(7);
constexpr size_t kPad = 64;
static int fails = 0, checks = 0;
static const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A buffer of n elements at element offset `off` from an allocation aligned to 64 bytes,
// with NaN in the `off` elements before and kPad after.
template <typename T> struct Buf {
  std::vector<T> v; size_t off, n;
  Buf(size_t n_, size_t off_) : v(n_ + off_ + kPad + 64 / sizeof(T)), off(off_), n(n_) {
    for (auto& e : v) e = fromd<T>(kNaN);
    base = (v.data() + (64 / sizeof(T)) - (reinterpret_cast<uintptr_t>(v.data()) % 64) / sizeof(T));
  }
  T* base;
  T* p() { return base + off; }
  bool pads_nan() const {
    for (size_t i = 0; i < off; ++i) if (!std::isnan(tod(base[i]))) return false;
    for (size_t i = off + n; i < off + n + kPad; ++i) if (!std::isnan(tod(base[i]))) return false;
    return true;
  }
};

template <typename T> void fill(Buf<T>& b, double std) {
  std::normal_distribution<double> d(0, std);
  for (size_t i = 0; i < b.n; ++i) b.p()[i] = fromd<T>(d(rng));
}

// |got - ref| <= tol * (1 + scale): scale = the size of the terms (cancellation near silu's minimum).
template <typename T>
void close(const std::string& where, const char* what, const T* got, const std::vector<double>& ref,
           const std::vector<double>& scale, double tol) {
  ++checks;
  double maxe = 0; size_t bad = 0, nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = tod(got[i]);
    if (!std::isfinite(g)) { ++nan; continue; }
    const double e = std::fabs(g - ref[i]);
    maxe = std::max(maxe, e);
    if (e > tol * (1 + scale[i])) ++bad;
  }
  if (bad || nan) { ++fails; printf("FAIL %s %s: %zu bad, %zu non-finite of %zu, max err %g\n", where.c_str(), what, bad, nan, ref.size(), maxe); }
}
static void expect(bool ok, const std::string& where, const char* what) {
  ++checks;
  if (!ok) { ++fails; printf("FAIL %s: %s\n", where.c_str(), what); }
}

static int widths_seen[3][9];
template <typename T> int tix() { return std::is_same<T, float>::value ? 0 : std::is_same<T, bf16>::value ? 1 : 2; }

// The width the rule gives: the widest of 8, 4, 2 dividing F with every pointer on a
// min(16, vec * e)-byte boundary (offsets count elements from a 64-byte boundary).
template <typename T> int expected_width(int F, std::initializer_list<size_t> offs) {
  for (int vec : {8, 4, 2}) {
    const size_t bytes = std::min<size_t>(16, vec * sizeof(T));
    bool ok = F % vec == 0;
    for (size_t o : offs) ok = ok && (o * sizeof(T)) % bytes == 0;
    if (ok) return vec;
  }
  return 1;
}

template <typename T>
void test(int64_t rows, int F, size_t o_gu, size_t o_out, size_t o_d, bool extremes) {
  const std::string where = std::string("swiglu ") + tn<T>() + " rows=" + std::to_string(rows) + " F=" + std::to_string(F) +
      " off=" + std::to_string(o_gu) + "," + std::to_string(o_out) + "," + std::to_string(o_d) + (extremes ? " far" : "");
  const size_t N = size_t(rows) * F;
  Buf<T> gu(2 * N, o_gu), out(N, o_out), dout(N, o_d), dgu(2 * N, o_out);
  fill(gu, 1.5);
  if (extremes)  // gates only: a far u times a far g overflows fp16 in any implementation
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < F; c += 7) gu.p()[r * 2 * F + c] = fromd<T>(std::vector<double>{100, -100, 1000, -1000, 30, -30}[(r + c) % 6]);
  fill(dout, 1.0);
  const int wf = k::swiglu_vector_width<T>(F, gu.p(), out.p(), nullptr);
  const int wb = k::swiglu_vector_width<T>(F, dout.p(), gu.p(), dgu.p());
  expect(wf == expected_width<T>(F, {o_gu, o_out}), where, "forward vector width is not the documented rule's");
  expect(wb == expected_width<T>(F, {o_gu, o_out, o_d}), where, "backward vector width is not the documented rule's");
  widths_seen[tix<T>()][wf] = widths_seen[tix<T>()][wb] = 1;
  k::swiglu_forward<T>(gu.p(), out.p(), rows, F, nullptr);
  k::swiglu_backward<T>(dout.p(), gu.p(), dgu.p(), rows, F, nullptr);
  std::vector<double> ro(N), rdg(N), rdu(N), so(N), sdg(N), sdu(N);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < F; ++c) {
      const double g = tod(gu.p()[r * 2 * F + c]), u = tod(gu.p()[r * 2 * F + F + c]), dy = tod(dout.p()[r * F + c]);
      const double s = 1 / (1 + std::exp(-g));
      ro[r * F + c] = g * s * u;
      rdg[r * F + c] = dy * u * (s + g * s * (1 - s));
      rdu[r * F + c] = dy * g * s;
      so[r * F + c] = std::fabs(g * s * u);
      sdg[r * F + c] = std::fabs(dy * u) * (s + std::fabs(g) * s * (1 - s));
      sdu[r * F + c] = std::fabs(dy * g * s);
    }
  const double tol = sizeof(T) == 2 ? 1e-2 : 2e-6;
  close(where, "out", out.p(), ro, so, tol);
  std::vector<T> dg(N), du(N);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < F; ++c) { dg[r * F + c] = dgu.p()[r * 2 * F + c]; du[r * F + c] = dgu.p()[r * 2 * F + F + c]; }
  close(where, "dgate", dg.data(), rdg, sdg, tol);
  close(where, "dup", du.data(), rdu, sdu, tol);
  expect(gu.pads_nan() && dout.pads_nan(), where, "an input's padding changed");
  expect(out.pads_nan(), where, "write outside out");
  expect(dgu.pads_nan(), where, "write outside dgate_up");
}

template <typename T> void suite() {
  // F: vec 8 (aligned), 4, 2, 1; narrow (<= 32 vectors: power-of-two threads per row, several rows a warp)
  // and wide (one row over 512 threads: loops), e.g. 3072 = 8/3 * 1152, 4104 = 513 vectors of 8.
  const int Fs[] = {1, 2, 3, 4, 6, 8, 12, 24, 40, 100, 250, 256, 264, 772, 1026, 3072, 4104, 4100, 5003};
  const int64_t rows_list[] = {1, 3, 37};
  for (int F : Fs)
    for (int64_t rows : rows_list) {
      if (int64_t(F) * rows > 60000 && rows > 3) continue;
      test<T>(rows, F, 0, 0, 0, rows == 3);
      for (size_t off = 1; off < 8; ++off) test<T>(rows, F, off, 0, 0, false);
      test<T>(rows, F, 0, 1, 0, false);
      test<T>(rows, F, 0, 0, 2, false);
      test<T>(rows, F, 0, 4, 4, true);
    }
  test<T>(700, 8, 0, 0, 0, true);  // several blocks of narrow rows (ty = 256)
  test<T>(300, 1152 * 4, 0, 0, 0, false);
}

int main(int argc, char** argv) {
  suite<float>();
  printf("f32 done, %d failures\n", fails); fflush(stdout);
  suite<bf16>();
  printf("bf16 done, %d failures\n", fails); fflush(stdout);
  suite<f16>();
  // Zero rows: nothing to do, nothing written; bad sizes throw.
  {
    Buf<bf16> gu(16, 0), out(8, 0);
    k::swiglu_forward<bf16>(gu.p(), out.p(), 0, 8, nullptr);
    expect(out.pads_nan() && std::isnan(tod(out.p()[0])), "swiglu rows=0", "something written");
    int thrown = 0;
    try { k::swiglu_forward<bf16>(gu.p(), out.p(), 1, 0, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    try { k::swiglu_backward<bf16>(out.p(), gu.p(), gu.p(), -1, 8, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    try { k::swiglu_forward<bf16>(nullptr, out.p(), 1, 8, nullptr); } catch (const std::invalid_argument&) { ++thrown; }
    expect(thrown == 3, "swiglu bad arguments", "not all thrown");
  }
  if (argc > 1 && std::string(argv[1]) == "big") {
    // More rows than 65536 blocks of 256 one-column rows: the grid-stride loop.
    test<bf16>(int64_t(65536) * 256 + 37, 1, 0, 0, 0, false);
  }
  const char* names[] = {"f32", "bf16", "f16"};
  for (int t = 0; t < 3; ++t)
    for (int w : {8, 4, 2, 1})
      if (!widths_seen[t][w]) { ++fails; printf("FAIL %s: vector width %d never taken\n", names[t], w); }
  printf("%d checks, %d failures\n", checks, fails);
  return fails != 0;
}
