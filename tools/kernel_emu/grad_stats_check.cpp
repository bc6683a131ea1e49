// kernel_emu check of src/kernels/grad_stats.cu (run.sh grad_stats_check.cpp grad_stats): the
// two launches of kernels::grad_stats on the CPU against a direct computation in double per
// gradient: the statistics row (||g||_2, sum |g|, max |g|, nonzero, non-finite) and the
// histogram row (min, max, sum, then per bucket the finite elements x with e[i-1] < x <= e[i],
// found by a linear scan of the edges). Gradients fp32, bf16 and fp16 with values exactly on
// every edge and one float step either side, zeros of both signs, subnormals, NaN, +-Inf,
// huge and tiny magnitudes, many decades of both signs; sizes 0 (and no pointer) to three
// chunks and odd, a pointer off the 16-byte boundary; with and without histograms; with a
// loss scale (edges times it, the first three columns divided by it); more tensors than one
// table holds is the op's business (not here). Counts, min and max must match exactly,
// sums to 1e-5 relative. Exit 1 on any mismatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/grad_stats.h"

using namespace perftrain::kernels;

namespace {

int failures = 0;

// observe::grad_histogram_limits() but the last, as float32 (the monitor's boundaries).
std::vector<float> monitor_edges() {
  std::vector<float> e;
  for (int k = 56; k >= 0; --k) e.push_back(static_cast<float>(-std::pow(10.0, -12.0 + k / 4.0)));
  for (int k = 0; k < 57; ++k) e.push_back(static_cast<float>(std::pow(10.0, -12.0 + k / 4.0)));
  return e;
}

struct Grad {
  std::string name;
  GradDtype dtype;
  std::vector<float> values;  // as the kernel sees them (after the storage rounding)
  std::vector<unsigned char> storage;  // the bytes, with `offset` elements of padding in front
  int offset = 0;
  bool null = false;  // no pointer at all (an undefined gradient)
};

size_t elem_size(GradDtype d) { return d == GradDtype::kFloat ? 4 : 2; }

Grad make_grad(const std::string& name, GradDtype dtype, const std::vector<float>& want, int offset) {
  Grad g;
  g.name = name;
  g.dtype = dtype;
  g.offset = offset;
  const size_t es = elem_size(dtype);
  g.storage.assign((want.size() + offset) * es + 16, 0);
  // 16-byte aligned base: the vector has its own alignment, so align by hand.
  for (size_t i = 0; i < want.size(); ++i) {
    float v = want[i];
    unsigned char* p = g.storage.data() + (i + offset) * es;
    if (dtype == GradDtype::kFloat) {
      std::memcpy(p, &v, 4);
    } else if (dtype == GradDtype::kBFloat16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(v);
      std::memcpy(p, &b, 2);
      v = __bfloat162float(b);
    } else {
      const __half h = __float2half_rn(v);
      std::memcpy(p, &h, 2);
      v = __half2float(h);
    }
    g.values.push_back(v);
  }
  return g;
}

struct Want {
  double stats[kGradStatCols];
  double hist[kGradHistLead + kGradHistBuckets];
};

Want direct(const std::vector<float>& v, const std::vector<float>& edges, float scale) {
  Want w{};
  if (v.empty()) {  // a row of zeros (divided by the scale, as the op does)
    for (double& x : w.stats) x = 0;
    for (double& x : w.hist) x = 0;
    return w;
  }
  double sq = 0, ab = 0, sum = 0;
  float amax = 0, mn = INFINITY, mx = -INFINITY;
  bool amax_nan = false, mn_nan = false;
  int64_t nz = 0, nf = 0;
  std::vector<float> se(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) se[i] = edges[i] * scale;  // fp32, as boundaries * scale
  std::vector<int64_t> counts(kGradHistBuckets, 0);
  for (float x : v) {
    sq += double(x) * x;
    ab += std::fabs(double(x));
    sum += x;
    if (std::isnan(x)) amax_nan = mn_nan = true;
    else {
      amax = std::max(amax, std::fabs(x));
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    nz += x != 0.f;
    if (!std::isfinite(x)) {
      ++nf;
      continue;
    }
    size_t b = 0;
    while (b < se.size() && se[b] < x) ++b;
    ++counts[b];
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  w.stats[0] = float(std::sqrt(sq)) / scale;
  w.stats[1] = float(ab) / scale;
  w.stats[2] = amax_nan ? nan : double(amax / scale);
  w.stats[3] = double(nz);
  w.stats[4] = double(nf);
  w.hist[0] = mn_nan ? nan : double(mn / scale);
  w.hist[1] = mn_nan ? nan : double(mx / scale);
  w.hist[2] = float(sum) / scale;
  for (int b = 0; b < kGradHistBuckets; ++b) w.hist[kGradHistLead + b] = double(counts[b]);
  return w;
}

// exact: bit-for-bit as float (NaN == NaN); else relative 1e-5, with the same
// non-finite class (a sum over an Inf is Inf, over +Inf and -Inf NaN).
void expect(const std::string& what, float got, double want, bool exact) {
  bool ok;
  if (std::isnan(want) || std::isnan(got)) ok = std::isnan(want) && std::isnan(got);
  else if (std::isinf(want) || std::isinf(got)) ok = double(got) == want;
  else if (exact) ok = double(got) == double(float(want));
  else ok = std::fabs(double(got) - want) <= 1e-5 * std::fabs(want) + 1e-30;
  if (!ok) {
    if (++failures <= 30) std::printf("MISMATCH %s: got %.9g want %.9g\n", what.c_str(), got, want);
  }
}

// Values that exercise the histogram's edges and the statistics' special cases.
std::vector<float> special_values(const std::vector<float>& edges, float scale) {
  std::vector<float> v;
  for (float e : edges) {
    const float s = e * scale;
    v.push_back(s);
    v.push_back(std::nextafter(s, INFINITY));
    v.push_back(std::nextafter(s, -INFINITY));
  }
  const float specials[] = {0.f, -0.f, 1e-45f, -1e-45f, 1.2e-38f, -3e-39f, 1e-30f, -1e-20f, 5e-13f,
                            99.99f, 100.f, -100.f, 1e30f, -1e35f, 3.3e38f, -3.4e38f, 1.f, -1.f};
  for (float s : specials) v.push_back(s);
  return v;
}

std::vector<float> random_values(std::mt19937& rng, size_t n, bool with_specials, const std::vector<float>& sv) {
  std::uniform_real_distribution<float> dec(-15.f, 3.f);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = nrm(rng) * std::pow(10.f, dec(rng));
  if (with_specials)
    for (size_t i = 0; i < sv.size() && i < n; ++i) v[(i * 7919) % n] = sv[i];
  return v;
}

void run_case(const std::string& label, std::vector<Grad>& grads, bool hist, float scale) {
  const std::vector<float> edges = monitor_edges();
  GradStatsTable table{};
  int chunks = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    Grad& g = grads[i];
    GradStatsTensor t{};
    t.row = int(i);
    t.dtype = int(g.dtype);
    if (!g.null && !g.values.empty()) {
      // Put the data at a 16-byte boundary + offset elements.
      const uintptr_t base = reinterpret_cast<uintptr_t>(g.storage.data());
      const uintptr_t aligned = (base + 15) / 16 * 16;
      std::vector<unsigned char> copy(g.storage.begin(), g.storage.end() - 16);
      std::memcpy(reinterpret_cast<void*>(aligned), copy.data(), copy.size());
      t.g = reinterpret_cast<const void*>(aligned + g.offset * elem_size(g.dtype));
      t.n = int64_t(g.values.size());
    }
    chunks += int((t.n + kGradStatsChunk - 1) / kGradStatsChunk);
    table.chunk_end[table.count] = chunks;
    table.t[table.count++] = t;
  }
  table.chunks = chunks;
  const int n = int(grads.size());
  const int64_t stats_stride = 7, hist_stride = kGradHistLead + kGradHistBuckets;
  const float poison = std::nanf("");
  std::vector<float> stats(size_t(n) * stats_stride, poison), hrows(size_t(n) * hist_stride, poison);
  std::vector<float> partials(size_t(std::max(chunks, 1)) * kGradPartialColumns, poison);
  GradStatsOut out{};
  out.stats = stats.data();
  out.stats_stride = stats_stride;
  out.hist = hist ? hrows.data() : nullptr;
  out.hist_stride = hist_stride;
  out.edges = edges.data();
  out.scale = scale != 1.f ? &scale : nullptr;
  grad_stats(table, out, partials.data(), nullptr);
  for (int i = 0; i < n; ++i) {
    const Want w = direct(grads[i].null ? std::vector<float>{} : grads[i].values, edges, scale);
    const std::string who = label + " " + grads[i].name;
    const char* cols[] = {"norm", "abs_sum", "max_abs", "nonzero", "nonfinite"};
    for (int k = 0; k < kGradStatCols; ++k)
      expect(who + " " + cols[k], stats[size_t(i) * stats_stride + k], w.stats[k], k >= 2);
    for (int k = kGradStatCols; k < stats_stride; ++k)  // left alone
      if (!std::isnan(stats[size_t(i) * stats_stride + k])) expect(who + " untouched column", 0.f, 1.0, true);
    if (!hist) continue;
    const char* lead[] = {"min", "max", "sum"};
    for (int k = 0; k < kGradHistLead; ++k)
      expect(who + " " + lead[k], hrows[size_t(i) * hist_stride + k], w.hist[k], k < 2);
    for (int b = 0; b < kGradHistBuckets; ++b)
      expect(who + " bucket " + std::to_string(b), hrows[size_t(i) * hist_stride + kGradHistLead + b],
             w.hist[kGradHistLead + b], true);
  }
  std::printf("%-28s %2d gradients, %3d chunks: %s\n", label.c_str(), n, chunks, failures ? "FAILURES" : "ok");
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  const std::vector<float> edges = monitor_edges();
  for (const float scale : {1.f, 1024.f}) {
    const std::vector<float> sv = special_values(edges, scale);
    for (const bool hist : {true, false}) {
      std::vector<Grad> g;
      // Every edge and its neighbours, fp32, aligned and not.
      g.push_back(make_grad("edges_f32", GradDtype::kFloat, sv, 0));
      g.push_back(make_grad("edges_f32_off1", GradDtype::kFloat, sv, 1));
      g.push_back(make_grad("edges_bf16", GradDtype::kBFloat16, sv, 0));
      g.push_back(make_grad("edges_f16_off3", GradDtype::kHalf, sv, 3));
      // Empty, a missing gradient, tiny and odd sizes.
      g.push_back(make_grad("empty", GradDtype::kFloat, {}, 0));
      Grad none = make_grad("undefined", GradDtype::kFloat, {}, 0);
      none.null = true;
      g.push_back(none);
      g.push_back(make_grad("one", GradDtype::kFloat, {-3.5e-7f}, 0));
      g.push_back(make_grad("seven_bf16", GradDtype::kBFloat16, random_values(rng, 7, false, sv), 1));
      g.push_back(make_grad("zeros", GradDtype::kFloat, std::vector<float>(1000, 0.f), 0));
      // Chunk boundaries: one short, exact, one over, three chunks with specials.
      g.push_back(make_grad("65535_f32", GradDtype::kFloat, random_values(rng, 65535, true, sv), 0));
      g.push_back(make_grad("65536_bf16", GradDtype::kBFloat16, random_values(rng, 65536, true, sv), 0));
      g.push_back(make_grad("65537_f16_off1", GradDtype::kHalf, random_values(rng, 65537, true, sv), 1));
      std::vector<float> big = random_values(rng, 2 * 65536 + 4099, true, sv);
      big[70000] = NAN;  // a NaN in the second chunk only
      big[131100] = INFINITY;  // and an Inf in the third
      g.push_back(make_grad("3chunks_f32_nan", GradDtype::kFloat, big, 0));
      std::vector<float> inf_only = random_values(rng, 70001, false, sv);
      inf_only[5] = -INFINITY;
      g.push_back(make_grad("2chunks_f32_-inf", GradDtype::kFloat, inf_only, 2));
      std::vector<float> both = random_values(rng, 999, false, sv);
      both[3] = INFINITY;
      both[4] = -INFINITY;
      g.push_back(make_grad("+inf_-inf_f32", GradDtype::kFloat, both, 0));
      run_case(std::string(hist ? "hist" : "stats") + " scale " + std::to_string(int(scale)), g, hist, scale);
    }
  }
  if (failures) {
    std::printf("grad_stats: %d mismatches\n", failures);
    return 1;
  }
  std::printf("grad_stats: all rows match\n");
  return 0;
}
