// What the row-norm checks (rms_adaln_check.cpp, layernorm_check.cpp) share: storage
// conversions, random inputs with NaN past every buffer's end, NaN-poisoned outputs, the
// comparisons against a float64 reference, and a hash of every output compared, so that
// two versions of a kernel can be seen to give the same bits (the last line printed).
#pragma once
#include "storage.h"
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

template <typename T> bool is16() { return sizeof(T) == 2; }
template <typename T> const char* tn() { return std::is_same<T, float>::value ? "f" : std::is_same<T, bf16>::value ? "b" : "h"; }

static std::mt19937_64 rng(42);
constexpr size_t kPad = 64;  // NaN past every buffer's end: a read there poisons a result, a write there is seen
static int fails = 0;
static uint64_t output_hash = 1469598103934665603ull;  // FNV-1a over the bytes of every output compared

template <typename T> void hash_bytes(const T* p, size_t n) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n * sizeof(T); ++i) output_hash = (output_hash ^ b[i]) * 1099511628211ull;
}
template <typename T> void pad_intact(const char* what, const std::vector<T>& v) {
  for (size_t i = v.size() - kPad; i < v.size(); ++i)
    if (!std::isnan(tod(v[i]))) { ++fails; printf("FAIL write past the end of %s\n", what); return; }
}
template <typename T> std::vector<T> rnd(size_t n, double std, double mean = 0) {
  std::normal_distribution<double> d(mean, std);
  std::vector<T> v(n + kPad);
  for (auto& e : v) e = fromd<T>(d(rng));
  for (size_t i = n; i < n + kPad; ++i) v[i] = fromd<T>(std::numeric_limits<double>::quiet_NaN());
  return v;
}
template <typename T> std::vector<T> nans(size_t n) { return std::vector<T>(n + kPad, fromd<T>(std::numeric_limits<double>::quiet_NaN())); }

// Every element within tol (absolute plus relative) of the reference, none NaN.
template <typename T>
void close(const char* what, const std::string& where, const T* got, const std::vector<double>& ref, double tol) {
  hash_bytes(got, ref.size());
  double maxe = 0; size_t bad = 0, nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = tod(got[i]);
    if (std::isnan(g)) { ++nan; continue; }
    double e = std::fabs(g - ref[i]);
    maxe = std::max(maxe, e);
    if (e > tol + tol * std::fabs(ref[i])) ++bad;
  }
  if (bad || nan) { ++fails; printf("FAIL %s %s: %zu bad, %zu NaN of %zu, max err %g\n", where.c_str(), what, bad, nan, ref.size(), maxe); }
}
// The relative L2 error under tol, none NaN (for sums whose terms cancel).
template <typename T>
void rel_l2(const char* what, const std::string& where, const T* got, const std::vector<double>& ref, double tol) {
  hash_bytes(got, ref.size());
  double n = 0, d = 0; size_t nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) { double g = tod(got[i]); if (std::isnan(g)) ++nan; n += (g - ref[i]) * (g - ref[i]); d += ref[i] * ref[i]; }
  double r = d > 0 ? std::sqrt(n / d) : std::sqrt(n);
  if (nan || !(r < tol)) { ++fails; printf("FAIL %s %s: rel L2 %g, %zu NaN\n", where.c_str(), what, r, nan); }
}

// Both: every element within tol of the reference, and the relative L2 error under l2_tol.
template <typename T>
void matches(const char* what, const std::string& where, const T* got, const std::vector<double>& ref, double tol,
             double l2_tol) {
  close(what, where, got, ref, tol);
  rel_l2(what, where, got, ref, l2_tol);
}

inline std::string case_name(const char* op, const char* types, int B, int T, int D) {
  return std::string(op) + " " + types + " [" + std::to_string(B) + "," + std::to_string(T) + "," + std::to_string(D) + "]";
}

// Run 0: the emulator's default schedule; run 1: TMA loads landing at issue and the fibers
// in reverse order. A kernel's results must be right in both, and the same bits.
inline void set_schedule(int run) {
  emu::loads_land_early = run == 1;
  emu::fibers_reversed = run == 1;
}
// The bytes of some output vectors, one after another.
template <typename... V> std::vector<unsigned char> bits_of(const V&... v) {
  std::vector<unsigned char> out;
  auto add = [&](const auto& x) {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(x.data());
    out.insert(out.end(), b, b + x.size() * sizeof(x[0]));
  };
  (add(v), ...);
  return out;
}
// run(check) launches a case on fresh outputs, compares them with the reference when `check`
// and returns their bits_of: on schedule 0 checked, on schedule 1 it must give the same bits.
template <typename Run> void on_two_schedules(const std::string& where, Run run) {
  set_schedule(0);
  const std::vector<unsigned char> first = run(true);
  set_schedule(1);
  if (run(false) != first) { ++fails; printf("FAIL %s: the other schedule gave other bits\n", where.c_str()); }
  set_schedule(0);
  printf("%s done, %d failures so far\n", where.c_str(), fails);
}

inline int finish() {
  printf("output hash %016llx\n", (unsigned long long)output_hash);
  printf("%d failures\n", fails);
  return fails != 0;
}
