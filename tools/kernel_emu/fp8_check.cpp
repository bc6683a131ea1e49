// fp8_cast and fp8_scaling kernels (their real source, tools/kernel_emu) against the
// correct-by-definition fp8 encoding (tests/ops/fp8_test_codes.h: nearest finite code to
// x * scale clamped to +-max, ties to even, NaN to NaN) and a direct reading of the
// scaling rule (kernels/fp8_scaling.h):
//   - fp8_cast and fp8_cast_transpose (with and without the row-major copy; q_t dense or
//     with a wider row pitch, as the column block of a larger q^T) on fp32 and
//     bf16, E4M3 and E5M2, sizes 1x1 to 130x257 (whole 64 x 64 tiles by the vector path,
//     partial ones element by element, tails of the 8-element vectors, more vectors than
//     the grid: the grid-stride loop), input pointers on and off 16-byte boundaries
//     (vector paths or not), values over the whole
//     range with NaN, +-Inf, huge and subnormal ones; every output byte, bytes past each
//     output untouched, the amax bits (NaN / Inf / max |x|, accumulated onto a start value);
//     both with the GELU prologue (bf16 x: the codes and amax of gelu_tanh(x) in bf16) and the
//     GELU-backward one (bf16 x and x2: of x * gelu_tanh'(x2) in bf16, x2 on and off 16-byte
//     boundaries apart from x); the cast-transpose's column partials (each 64-row tile's
//     column sums of the values cast, against float64; every partial written, none past them);
//     the SwiGLU prologues (forward: h = silu(gate) * up from gate_up [rows, 2 cols], by the
//     cast-transpose and by fp8_cast's row kernel; backward, the cast-transpose's: d(gate) and d(up) from d(h) and gate_up into q [rows, 2 cols]
//     and q_t [2 cols, rows], dense or with a wider q_t pitch), gates far out (exp over- and
//     underflow); the misuses the launchers refuse;
//   - fp8_scaling_update over slots with history lengths 1 .. 1024, amaxes NaN, Inf, 0,
//     subnormal and ordinary, margins 0 and 3: history, scale, scale_inv, events, amax.
// Exit 1 on any failure.
#include "storage.h"
#include "kernels/fp8_cast.h"
#include "kernels/fp8_scaling.h"
#include "kernels/device_info.h"
#include "../../tests/ops/fp8_test_codes.h"
#include <cmath>
#include <random>
#include <string>
#include <limits>
#include <stdexcept>

namespace k = perftrain::kernels;
namespace fp8_codes = perftrain::fp8_codes;
using k::Fp8Format;

// The kernels' host functions size grids by it; 2 "SMs" make the cast's grid-stride loop run.
namespace perftrain::kernels {
int multiprocessor_count() { return 2; }
}  // namespace perftrain::kernels

static std::mt19937_64 rng(9);
static int fails = 0, checks = 0;
constexpr size_t kPad = 64;
constexpr uint8_t kSentinel = 0xA5;

static void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) { ++fails; printf("FAIL %s\n", what.c_str()); }
}

static float wide_value() {
  std::normal_distribution<float> n;
  std::uniform_int_distribution<int> e(-24, 20);
  return std::ldexp(n(rng), e(rng));
}

static unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

static bool same_code(uint8_t got, uint8_t want, Fp8Format f) {
  return got == want || (fp8_codes::is_nan_code(got, f) && fp8_codes::is_nan_code(want, f));
}

// The GELU prologues' values (kernels/fp8_cast.h): ATen's tanh GELU and its backward in
// fp32, in ATen's order, rounded to bf16.
static const float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
static float gelu_bf16(float x) {
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return float(tod(fromd<bf16>(0.5f * x * (1.0f + std::tanh(inner)))));
}
static float gelu_backward_bf16(float dy, float x) {
  const float x_sq = x * x, x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float t = std::tanh(inner);
  const float left = 0.5f * x, right = 1.0f + t;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.0f - t * t;
  const float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return float(tod(fromd<bf16>(dy * (left_derivative + right_derivative))));
}

using k::Fp8Prologue;
static const char* prologue_name(Fp8Prologue p) {
  return p == Fp8Prologue::kGeluTanh ? " GELU prologue" : p == Fp8Prologue::kGeluTanhBackward ? " GELU-backward prologue" : "";
}

// A 16-byte aligned start in `v` plus `offset` elements (v holds n + offset + 16).
template <typename T>
static T* placed(std::vector<T>& v, size_t offset) {
  return v.data() + (16 - reinterpret_cast<uintptr_t>(v.data()) % 16) / sizeof(T) % (16 / sizeof(T)) + offset;
}

// The column partials against float64 (kernels/fp8_cast.h): row t, column c the sum of the
// values cast over rows [64 t, 64 t + 64); every one written, nothing past them. Sums over a
// non-finite or huge value are only required not to be finite or to be written.
static void check_partials(const std::vector<float>& parts, const std::vector<float>& values, int64_t rows,
                           int64_t cols, const std::string& where) {
  const int64_t tiles = k::fp8_cast_partial_rows(rows);
  int bad = 0, unwritten = 0;
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      double want = 0, scale = 0;
      bool finite = true;
      for (int64_t r = 64 * t; r < std::min(rows, 64 * t + 64); ++r) {
        const float v = values[r * cols + c];
        finite = finite && std::isfinite(v) && std::fabs(v) < 1e30f;
        want += v;
        scale += std::fabs(double(v));
      }
      const float got = parts[t * cols + c];
      if (__float_as_uint(got) == 0x7fbadbadu) { ++unwritten; continue; }
      if (finite) bad += !(std::fabs(double(got) - want) <= 1e-6 * scale + 1e-30);
    }
  bool pads = true;
  for (size_t i = tiles * cols; i < parts.size(); ++i) pads = pads && __float_as_uint(parts[i]) == 0x7fbadbadu;
  expect(bad == 0 && unwritten == 0 && pads, where + ": column partials: " + std::to_string(bad) + " off, " +
                                                std::to_string(unwritten) + " unwritten" + (pads ? "" : ", a write past them"));
}

template <typename T>
static void check_cast(int64_t rows, int64_t cols, Fp8Format f, size_t offset, bool transpose, bool with_rows,
                       int64_t pitch_extra = 0, Fp8Prologue prologue = Fp8Prologue::kNone, bool sums = false,
                       size_t offset2 = 0) {
  const int64_t ld = rows + pitch_extra;  // q_t's row pitch
  const bool backward = prologue == Fp8Prologue::kGeluTanhBackward;
  const std::string where = std::to_string(rows) + "x" + std::to_string(cols) + (sizeof(T) == 4 ? " f32 " : " bf16 ") +
                            k::fp8_format_name(f) + " offset " + std::to_string(offset) +
                            (backward ? " x2 offset " + std::to_string(offset2) : "") +
                            (transpose ? (with_rows ? " cast-transpose" : " transpose-only") : " cast") +
                            (pitch_extra ? " q_t pitch " + std::to_string(ld) : "") + prologue_name(prologue) +
                            (sums ? " with column partials" : "");
  const int64_t n = rows * cols;
  std::vector<T> xs(n + offset + 16), x2s(n + offset2 + 16);
  T* x = placed(xs, offset);
  T* x2 = placed(x2s, offset2);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 3e38f, 1e-40f, -0.f};
  for (int64_t i = 0; i < n; ++i) x[i] = fromd<T>(wide_value());
  // GELU's input of ordinary size (its tails and its middle), some huge.
  std::normal_distribution<float> pre_value(0.f, 3.f);
  for (int64_t i = 0; i < n; ++i) x2[i] = fromd<T>(i % 97 == 5 ? 1e4f * pre_value(rng) : pre_value(rng));
  // Specials only in some cases, so that the amax is also checked finite.
  if ((rows + cols) % 3 == 0)
    for (int i = 0; i < 6 && 5 * i < n; ++i) x[5 * i] = fromd<T>(special[i]);
  const float scale = 2.75f, start_amax = 0.125f;
  std::vector<uint8_t> q(n + kPad, kSentinel), qt(cols * ld + kPad, kSentinel);
  std::vector<float> parts(k::fp8_cast_partial_rows(rows) * cols + kPad, __uint_as_float(0x7fbadbadu));
  float scale_dev = scale, amax = start_amax;
  k::Fp8CastArgs a;
  a.x = x;
  a.x_type = sizeof(T) == 4 ? k::Fp8Source::kF32 : k::Fp8Source::kBF16;
  a.rows = rows;
  a.cols = cols;
  a.format = f;
  a.scale = &scale_dev;
  a.q = (!transpose || with_rows) ? q.data() : nullptr;
  a.q_t = transpose ? qt.data() : nullptr;
  a.q_t_ld = pitch_extra ? ld : 0;
  a.amax = &amax;
  a.prologue = prologue;
  if (backward) a.x2 = x2;
  if (sums) a.col_partials = parts.data();
  if (transpose) k::fp8_cast_transpose(a, nullptr); else k::fp8_cast(a, nullptr);
  unsigned want_amax = abs_bits(start_amax);
  int bad = 0, bad_t = 0;
  std::vector<float> values(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float xv = float(tod(x[r * cols + c]));
      const float v = prologue == Fp8Prologue::kGeluTanh ? gelu_bf16(xv)
                      : backward                          ? gelu_backward_bf16(xv, float(tod(x2[r * cols + c])))
                                                          : xv;
      values[r * cols + c] = v;
      want_amax = std::max(want_amax, abs_bits(v));
      const uint8_t want = std::isnan(v) ? 0x7f : fp8_codes::encode(v * scale, f);
      if (a.q) bad += !same_code(q[r * cols + c], want, f);
      if (a.q_t) bad_t += !same_code(qt[c * ld + r], want, f);
    }
  expect(bad == 0, where + ": " + std::to_string(bad) + " q codes differ");
  expect(bad_t == 0, where + ": " + std::to_string(bad_t) + " q_t codes differ");
  bool pads = true;
  for (size_t i = n; i < q.size(); ++i) pads = pads && q[i] == kSentinel;
  for (size_t i = 0; i < qt.size(); ++i)
    if (!a.q_t || int64_t(i) >= cols * ld || int64_t(i) % ld >= rows) pads = pads && qt[i] == kSentinel;
  if (!a.q) for (int64_t i = 0; i < n; ++i) pads = pads && q[i] == kSentinel;
  expect(pads, where + ": a write past an output (or into q when not asked)");
  expect(abs_bits(amax) == want_amax || __float_as_uint(amax) == want_amax,
         where + ": amax bits " + std::to_string(__float_as_uint(amax)) + ", want " + std::to_string(want_amax));
  if (sums) check_partials(parts, values, rows, cols, where);
}

// What the launchers refuse (std::invalid_argument): x2 without the GELU-backward prologue
// and the reverse, a GELU prologue on fp32 x, column partials from fp8_cast.
static void check_misuse() {
  std::vector<bf16> x(64), x2(64);
  std::vector<uint8_t> q(64), qt(64);
  std::vector<float> parts(64);
  float scale = 1.f, amax = 0.f;
  auto args = [&] {
    k::Fp8CastArgs a;
    a.x = x.data();
    a.rows = 8;
    a.cols = 8;
    a.scale = &scale;
    a.amax = &amax;
    a.q = q.data();
    a.q_t = qt.data();
    return a;
  };
  auto refused = [](const k::Fp8CastArgs& a, bool transpose) {
    try {
      transpose ? k::fp8_cast_transpose(a, nullptr) : k::fp8_cast(a, nullptr);
    } catch (const std::invalid_argument&) {
      return true;
    }
    return false;
  };
  k::Fp8CastArgs a = args();
  a.x2 = x2.data();
  expect(refused(a, true), "misuse: x2 without the GELU-backward prologue");
  a = args();
  a.prologue = Fp8Prologue::kGeluTanhBackward;
  expect(refused(a, true), "misuse: the GELU-backward prologue without x2");
  a.x2 = x2.data();
  a.x_type = k::Fp8Source::kF32;
  expect(refused(a, true), "misuse: the GELU-backward prologue on fp32 x");
  a = args();
  a.q_t = nullptr;
  a.col_partials = parts.data();
  expect(refused(a, false), "misuse: column partials from fp8_cast");
  a = args();
  a.q_t = nullptr;
  a.prologue = Fp8Prologue::kSwigluBackward;
  a.x2 = x2.data();
  expect(refused(a, false), "misuse: SwiGLU's backward prologue in fp8_cast");
  a = args();
  a.prologue = Fp8Prologue::kSwigluBackward;
  a.x2 = x2.data();
  a.q = nullptr;
  expect(refused(a, true), "misuse: SwiGLU's backward without q");
  a = args();
  a.prologue = Fp8Prologue::kSwigluBackward;
  a.x2 = x2.data();
  a.col_partials = parts.data();
  expect(refused(a, true), "misuse: SwiGLU's backward with column partials");
}

// SwiGLU's values as kernels/swiglu stores them (bf16): h, d(gate), d(up).
static float swiglu_bf16(float g, float u) { return float(tod(fromd<bf16>(g / (1.f + std::exp(-g)) * u))); }
static void swiglu_backward_bf16(float dy, float g, float u, float& dgate, float& dup) {
  const float s = 1.f / (1.f + std::exp(-g));
  dgate = float(tod(fromd<bf16>(dy * u * (s * (1.f + g * (1.f - s))))));
  dup = float(tod(fromd<bf16>(dy * (g * s))));
}

// The SwiGLU prologues: forward (x = gate_up [rows, 2 cols] -> h's codes [rows, cols], and
// q_t with the cast-transpose; `transpose` false: fp8_cast's row kernel, q alone) and backward
// (cast-transpose only: x = d(h) [rows, cols], x2 = gate_up -> d(gate_up)'s codes [rows,
// 2 cols] and q_t [2 cols, ld]); every byte, nothing past the outputs, the amax.
static void check_swiglu(int64_t rows, int64_t cols, Fp8Format f, size_t offset, bool backward,
                         int64_t pitch_extra = 0, bool transpose = true) {
  const int64_t out_cols = backward ? 2 * cols : cols, ld = rows + pitch_extra;
  const std::string where = std::to_string(rows) + "x" + std::to_string(cols) + " " + k::fp8_format_name(f) +
                            " offset " + std::to_string(offset) + (backward ? " SwiGLU backward" : " SwiGLU") +
                            (transpose ? "" : " fp8_cast") + (pitch_extra ? " q_t pitch " + std::to_string(ld) : "");
  std::vector<bf16> gus(rows * 2 * cols + offset + 16), dhs(rows * cols + offset + 16);
  bf16* gu = placed(gus, offset);
  bf16* dh = placed(dhs, offset);
  std::normal_distribution<float> gate_value(0.f, 3.f);
  for (int64_t i = 0; i < rows * 2 * cols; ++i) {
    const bool gate = i % (2 * cols) < cols;
    gu[i] = fromd<bf16>(gate ? (i % 89 == 7 ? 100.f * gate_value(rng) : gate_value(rng)) : wide_value());
  }
  for (int64_t i = 0; i < rows * cols; ++i) dh[i] = fromd<bf16>(wide_value());
  const float scale = 2.75f, start_amax = 0.125f;
  float scale_dev = scale, amax = start_amax;
  std::vector<uint8_t> q(rows * out_cols + kPad, kSentinel), qt(out_cols * ld + kPad, kSentinel);
  k::Fp8CastArgs a;
  a.x = backward ? static_cast<const void*>(dh) : static_cast<const void*>(gu);
  a.x2 = backward ? gu : nullptr;
  a.rows = rows;
  a.cols = cols;
  a.format = f;
  a.scale = &scale_dev;
  a.q = q.data();
  a.q_t = transpose ? qt.data() : nullptr;
  a.q_t_ld = pitch_extra ? ld : 0;
  a.amax = &amax;
  a.prologue = backward ? Fp8Prologue::kSwigluBackward : Fp8Prologue::kSwiglu;
  transpose ? k::fp8_cast_transpose(a, nullptr) : k::fp8_cast(a, nullptr);
  unsigned want_amax = abs_bits(start_amax);
  int bad = 0, bad_t = 0;
  auto expect_code = [&](int64_t r, int64_t c, float v) {
    want_amax = std::max(want_amax, abs_bits(v));
    const uint8_t want = std::isnan(v) ? 0x7f : fp8_codes::encode(v * scale, f);
    bad += !same_code(q[r * out_cols + c], want, f);
    if (transpose) bad_t += !same_code(qt[c * ld + r], want, f);
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float g = float(tod(gu[r * 2 * cols + c])), u = float(tod(gu[r * 2 * cols + cols + c]));
      if (!backward) {
        expect_code(r, c, swiglu_bf16(g, u));
      } else {
        float dgate, dup;
        swiglu_backward_bf16(float(tod(dh[r * cols + c])), g, u, dgate, dup);
        expect_code(r, c, dgate);
        expect_code(r, cols + c, dup);
      }
    }
  expect(bad == 0, where + ": " + std::to_string(bad) + " q codes differ");
  expect(bad_t == 0, where + ": " + std::to_string(bad_t) + " q_t codes differ");
  bool pads = true;
  for (size_t i = rows * out_cols; i < q.size(); ++i) pads = pads && q[i] == kSentinel;
  for (size_t i = 0; i < qt.size(); ++i)
    if (!transpose || int64_t(i) >= out_cols * ld || int64_t(i) % ld >= rows) pads = pads && qt[i] == kSentinel;
  expect(pads, where + ": a write past an output");
  expect(abs_bits(amax) == want_amax || __float_as_uint(amax) == want_amax,
         where + ": amax bits " + std::to_string(__float_as_uint(amax)) + ", want " + std::to_string(want_amax));
}

// The rule of kernels/fp8_scaling.h, written out on one slot.
struct Slot {
  float amax;
  std::vector<float> history;
  float scale, scale_inv, events[2];
  Fp8Format f;
};

static void apply_rule(Slot& s, int margin) {
  const float a = s.amax;
  std::vector<float> h(s.history.size());
  h[0] = a;
  for (size_t i = 1; i < h.size(); ++i) h[i] = s.history[i - 1];
  float m = 0;
  for (const float v : h) if (std::isfinite(v)) m = std::max(m, v);
  s.history = h;
  if (!std::isfinite(a)) {
    s.events[0] += 1;
  } else if (a == 0) {
    s.events[1] += 1;
  } else {
    const float next = k::fp8_max(s.f) / (m * std::ldexp(1.0f, margin));
    if (std::isfinite(next)) s.scale = next; else s.events[1] += 1;
  }
  s.scale_inv = 1.f / s.scale;
  s.amax = 0;
}

static void check_scaling() {
  const int lengths[] = {1, 2, 5, 127, 128, 129, 1024};
  const float amaxes[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.f,
                          1e-40f, 3.5f, 0.02f, 1000.f};
  std::vector<Slot> slots;
  for (int i = 0; i < 21; ++i) {
    Slot s;
    s.history.resize(lengths[i % 7]);
    for (auto& v : s.history) v = std::fabs(wide_value());
    if (i % 4 == 0 && s.history.size() > 1) s.history[s.history.size() / 2] = std::numeric_limits<float>::infinity();
    s.amax = amaxes[(i / 3) % 7];
    s.scale = 1.5f;
    s.scale_inv = 1 / 1.5f;
    s.events[0] = s.events[1] = float(i);
    s.f = i % 2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
    slots.push_back(s);
  }
  for (const int margin : {0, 3}) {
    std::vector<Slot> dev = slots;
    k::Fp8ScalingTable table{};
    table.count = int(dev.size());
    for (size_t i = 0; i < dev.size(); ++i)
      table.slot[i] = {&dev[i].amax, dev[i].history.data(), &dev[i].scale, &dev[i].scale_inv, dev[i].events,
                       int32_t(dev[i].history.size()), k::fp8_max(dev[i].f)};
    k::fp8_scaling_update(table, margin, nullptr);
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot want = slots[i];
      apply_rule(want, margin);
      const Slot& got = dev[i];
      const std::string where = "scaling slot " + std::to_string(i) + " margin " + std::to_string(margin);
      bool hist = true;
      for (size_t j = 0; j < want.history.size(); ++j)
        hist = hist && __float_as_uint(got.history[j]) == __float_as_uint(want.history[j]);
      expect(hist, where + ": history");
      expect(__float_as_uint(got.scale) == __float_as_uint(want.scale), where + ": scale " + std::to_string(got.scale) +
                                                                          ", want " + std::to_string(want.scale));
      expect(__float_as_uint(got.scale_inv) == __float_as_uint(want.scale_inv), where + ": scale_inv");
      expect(got.events[0] == want.events[0] && got.events[1] == want.events[1], where + ": events");
      expect(got.amax == 0.f, where + ": amax not zeroed");
    }
  }
}

int main() {
  // Whole 16-aligned tiles take the cast-transpose's vector path (at offset 0), edges the scalar one.
  const int64_t shapes[][2] = {{1, 1}, {3, 5}, {7, 13}, {64, 64}, {65, 63}, {130, 257}, {1, 1000}, {33, 8},
                               {257, 16}, {16, 16}, {128, 192}, {80, 144}};
  for (const auto& s : shapes)
    for (const Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (const size_t offset : {0, 1}) {
        check_cast<float>(s[0], s[1], f, offset, false, true);
        check_cast<bf16>(s[0], s[1], f, offset, false, true);
        check_cast<bf16>(s[0], s[1], f, offset, true, true);
        check_cast<float>(s[0], s[1], f, offset, true, offset == 0);
        // q_t as a column block of a wider q^T: a pitch of 16 more keeps the vector path.
        for (const int64_t extra : {3, 16}) check_cast<bf16>(s[0], s[1], f, offset, true, true, extra);
        // GELU's output cast from its input (bf16), both kernels.
        check_cast<bf16>(s[0], s[1], f, offset, false, true, 0, Fp8Prologue::kGeluTanh);
        check_cast<bf16>(s[0], s[1], f, offset, true, true, 0, Fp8Prologue::kGeluTanh);
        // GELU's backward cast from d(act) and pre (x2 aligned, then 1 element off), both kernels;
        // the cast-transpose with the column partials, which any prologue may take.
        for (const size_t offset2 : {0, 1}) {
          check_cast<bf16>(s[0], s[1], f, offset, false, true, 0, Fp8Prologue::kGeluTanhBackward, false, offset2);
          check_cast<bf16>(s[0], s[1], f, offset, true, true, 0, Fp8Prologue::kGeluTanhBackward, true, offset2);
        }
        check_cast<bf16>(s[0], s[1], f, offset, true, offset == 0, 0, Fp8Prologue::kNone, true);
        check_cast<float>(s[0], s[1], f, offset, true, true, 16, Fp8Prologue::kNone, true);
        for (const bool backward : {false, true})
          for (const int64_t extra : {0, 16}) check_swiglu(s[0], s[1], f, offset, backward, extra);
        // SwiGLU's forward by the row kernel (no transpose): cols a multiple of 8 at offset 0 takes
        // its vector path, the others the scalar one.
        check_swiglu(s[0], s[1], f, offset, false, 0, false);
      }
  check_misuse();
  check_scaling();
  printf("%d of %d checks failed\n", fails, checks);
  return fails ? 1 : 0;
}
