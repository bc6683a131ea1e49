#include "data/adm_crop.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"

namespace perftrain::data {
namespace {

// Pillow's fixed point: 8 bits of result, 2 of headroom for negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis's taps: output pixel o reads inputs [first[o], first[o] + count[o])
// with weights[o * ksize + k], as Pillow's precompute_coeffs and
// normalize_coeffs_8bpc make them.
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

Taps taps(int in_size, int out_size, PilFilter filter) {
  const double support_1 = filter == PilFilter::kBox ? 0.5 : 2.0;
  double (*const f)(double) = filter == PilFilter::kBox ? box_filter : bicubic_filter;
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = support_1 * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.ksize, 0);
  std::vector<double> k(t.ksize);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = hi - lo;
    double sum = 0.0;
    for (int x = 0; x < n; ++x) sum += k[x] = f((x + lo - center + 0.5) * ss);
    for (int x = 0; x < n; ++x) {
      const double w = sum != 0.0 ? k[x] / sum : k[x];
      const double scaled = w * (1 << kPrecisionBits);
      t.weights[static_cast<size_t>(o) * t.ksize + x] = static_cast<int32_t>(w < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    t.first[o] = lo;
    t.count[o] = n;
  }
  return t;
}

uint8_t clip8(int v) {
  const int s = v >> kPrecisionBits;  // arithmetic: negative sums stay negative
  return static_cast<uint8_t>(std::clamp(s, 0, 255));
}

// Rows [row0, row0 + rows) of in (width w_in, c channels) resampled along x.
void horizontal(const uint8_t* in, int w_in, int c, int row0, int rows, const Taps& t, int w_out, uint8_t* out) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = in + static_cast<size_t>(row0 + y) * w_in * c;
    uint8_t* dst = out + static_cast<size_t>(y) * w_out * c;
    for (int o = 0; o < w_out; ++o) {
      const int32_t* k = &t.weights[static_cast<size_t>(o) * t.ksize];
      for (int ch = 0; ch < c; ++ch) {
        int acc = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < t.count[o]; ++x) acc += src[(t.first[o] + x) * c + ch] * k[x];
        dst[o * c + ch] = clip8(acc);
      }
    }
  }
}

// in (rows of width w, c channels; row 0 is input row `row0`) resampled along y.
void vertical(const uint8_t* in, int w, int c, int row0, const Taps& t, int h_out, uint8_t* out) {
  const size_t stride = static_cast<size_t>(w) * c;
  for (int o = 0; o < h_out; ++o) {
    const int32_t* k = &t.weights[static_cast<size_t>(o) * t.ksize];
    const uint8_t* src = in + static_cast<size_t>(t.first[o] - row0) * stride;
    uint8_t* dst = out + static_cast<size_t>(o) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int acc = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < t.count[o]; ++y) acc += src[y * stride + i] * k[y];
      dst[i] = clip8(acc);
    }
  }
}

// The order of the two passes (each rounds to uint8, so it shows): Pillow 13
// runs the vertical one first when the height shrinks by more than twice as
// many pixels as the width does (found by comparing both orders with it over
// 30 000 size pairs, none off); earlier releases always start horizontally.
bool vertical_first(int h_in, int w_in, int h_out, int w_out) {
  return h_out < h_in && h_in - h_out > 2 * (w_in - w_out);
}

void check_image(const at::Tensor& rgb, const char* what) {
  if (!rgb.defined() || rgb.dim() != 3 || rgb.scalar_type() != at::kByte || !rgb.device().is_cpu())
    throw UsageError(std::string(what) + ": expected a CPU uint8 image [H, W, C]");
  if (rgb.size(0) < 1 || rgb.size(1) < 1 || rgb.size(2) < 1)
    throw UsageError(std::string(what) + ": the image is empty");
}

}  // namespace

at::Tensor pil_resize(const at::Tensor& rgb, int64_t width, int64_t height, PilFilter filter) {
  check_image(rgb, "pil_resize");
  if (width < 1 || height < 1) throw UsageError("pil_resize: the size must be at least 1x1");
  const at::Tensor in = rgb.contiguous();
  const int h_in = static_cast<int>(in.size(0)), w_in = static_cast<int>(in.size(1)), c = static_cast<int>(in.size(2));
  const int w_out = static_cast<int>(width), h_out = static_cast<int>(height);
  if (w_out == w_in && h_out == h_in) return in.clone();
  const Taps ty = taps(h_in, h_out, filter);
  // The input rows the vertical pass reads: the horizontal pass makes only these.
  const int row0 = ty.first.front(), row_end = ty.first.back() + ty.count.back();
  at::Tensor out = at::empty({h_out, w_out, c}, at::kByte);
  const uint8_t* src = in.data_ptr<uint8_t>();
  if (w_out == w_in) {
    vertical(src, w_in, c, 0, ty, h_out, out.data_ptr<uint8_t>());
    return out;
  }
  const Taps tx = taps(w_in, w_out, filter);
  if (h_out == h_in) {
    horizontal(src, w_in, c, 0, h_in, tx, w_out, out.data_ptr<uint8_t>());
    return out;
  }
  if (vertical_first(h_in, w_in, h_out, w_out)) {
    std::vector<uint8_t> mid(static_cast<size_t>(h_out) * w_in * c);
    vertical(src, w_in, c, 0, ty, h_out, mid.data());
    horizontal(mid.data(), w_in, c, 0, h_out, tx, w_out, out.data_ptr<uint8_t>());
    return out;
  }
  std::vector<uint8_t> mid(static_cast<size_t>(row_end - row0) * w_out * c);
  horizontal(src, w_in, c, row0, row_end - row0, tx, w_out, mid.data());
  vertical(mid.data(), w_out, c, row0, ty, h_out, out.data_ptr<uint8_t>());
  return out;
}

at::Tensor adm_center_crop(const at::Tensor& rgb, int64_t size) {
  check_image(rgb, "adm_center_crop");
  if (size < 1) throw UsageError("adm_center_crop: the crop size must be >= 1, got " + std::to_string(size));
  at::Tensor img = rgb;
  while (std::min(img.size(0), img.size(1)) >= 2 * size)
    img = pil_resize(img, img.size(1) / 2, img.size(0) / 2, PilFilter::kBox);
  const double scale = static_cast<double>(size) / static_cast<double>(std::min(img.size(0), img.size(1)));
  // Python's round(): half to even, which nearbyint does in the default mode.
  const auto w = static_cast<int64_t>(std::nearbyint(static_cast<double>(img.size(1)) * scale));
  const auto h = static_cast<int64_t>(std::nearbyint(static_cast<double>(img.size(0)) * scale));
  img = pil_resize(img, w, h, PilFilter::kBicubic);
  const int64_t y0 = (h - size) / 2, x0 = (w - size) / 2;
  return img.slice(0, y0, y0 + size).slice(1, x0, x0 + size).contiguous();
}

}  // namespace perftrain::data
