// Random latents that cost no I/O: every value is a hash of (seed, sample,
// element), so any sample can be made on any thread in any order. Each sample
// is 0.8 * its class's pattern (a plane wave, mean 0, variance 1) plus
// 0.6 * standard normal noise: unit variance overall, and learnable, so that a
// loss that falls on it says the model and trainer work.
#include <cmath>
#include <vector>

#include "base/error.h"
#include "data/dataset.h"

namespace perftrain::data {
namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Synthetic final : public Dataset {
 public:
  Synthetic(int64_t size, std::array<int64_t, 3> shape, int64_t num_classes, uint64_t seed)
      : size_(size), shape_(shape), num_classes_(num_classes), seed_(seed) {}

  int64_t size() const override { return size_; }
  std::array<int64_t, 3> sample_shape() const override { return shape_; }
  int64_t num_classes() const override { return num_classes_; }

  std::string describe() const override {
    return "synthetic (" + summary() + ", seed " + std::to_string(seed_) + ")";
  }

 protected:
  int64_t read(int64_t i, float* out) const override {
    const int64_t numel = shape_[0] * shape_[1] * shape_[2];
    const uint64_t key = mix(seed_ ^ mix(static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull));
    // Box-Muller: each pair of uniforms gives two independent normals.
    for (int64_t e = 0; e < numel; e += 2) {
      const uint64_t h1 = mix(key + 2 * static_cast<uint64_t>(e) + 1);
      const uint64_t h2 = mix(key + 2 * static_cast<uint64_t>(e) + 2);
      const double u1 = (static_cast<double>(h1 >> 11) + 1.0) * 0x1p-53;  // (0, 1]: log is finite
      const double u2 = static_cast<double>(h2 >> 11) * 0x1p-53;         // [0, 1)
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double a = 6.283185307179586 * u2;
      out[e] = static_cast<float>(kNoise * r * std::cos(a));
      if (e + 1 < numel) out[e + 1] = static_cast<float>(kNoise * r * std::sin(a));
    }
    const int64_t label = i % num_classes_;
    add_pattern(label, out);
    return label;
  }

 private:
  // sqrt(2) sin(2 pi (k1 h / H + k2 w / W) + phase): whole periods, so mean 0
  // and variance 1 over the image; frequencies and phase depend on the class.
  // sin(a + b) = sin a cos b + cos a sin b: H + W sines per channel, not H * W,
  // so the pattern costs the loader thread next to nothing.
  void add_pattern(int64_t label, float* out) const {
    const int64_t C = shape_[0], H = shape_[1], W = shape_[2];
    const double two_pi = 6.283185307179586, k1 = 1 + label % 3, k2 = 1 + (label / 3) % 3;
    std::vector<double> sin_w(W), cos_w(W);
    for (int64_t w = 0; w < W; ++w) {
      sin_w[w] = std::sin(two_pi * k2 * w / W);
      cos_w[w] = std::cos(two_pi * k2 * w / W);
    }
    const double amplitude = kPattern * std::sqrt(2.0);
    for (int64_t c = 0; c < C; ++c) {
      const double phase = 0.7 * static_cast<double>(label) + 1.3 * static_cast<double>(c);
      for (int64_t h = 0; h < H; ++h) {
        const double a = two_pi * k1 * h / H + phase, sin_a = std::sin(a), cos_a = std::cos(a);
        float* row = out + (c * H + h) * W;
        for (int64_t w = 0; w < W; ++w)
          row[w] += static_cast<float>(amplitude * (sin_a * cos_w[w] + cos_a * sin_w[w]));
      }
    }
  }
  static constexpr double kNoise = 0.6, kPattern = 0.8;

  int64_t size_;
  std::array<int64_t, 3> shape_;
  int64_t num_classes_;
  uint64_t seed_;
};

// Uniform in [-sqrt(3), sqrt(3)) (mean 0, variance 1) from a hash.
float unit_uniform(uint64_t h) { return static_cast<float>((static_cast<double>(h >> 11) * 0x1p-53 * 2 - 1) * 1.7320508075688772); }

class SyntheticCond final : public Dataset {
 public:
  SyntheticCond(std::unique_ptr<Dataset> base, int64_t tokens, int64_t dim, uint64_t seed)
      : base_(std::move(base)), tokens_(tokens), dim_(dim), seed_(seed) {}

  int64_t size() const override { return base_->size(); }
  std::array<int64_t, 3> sample_shape() const override { return base_->sample_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  std::string describe() const override {
    return base_->describe() + ", synthetic condition features " + std::to_string(tokens_) + "x" + std::to_string(dim_);
  }
  void gather(const int64_t* indices, int64_t n, float* x_out, int64_t* y_out) const override {
    base_->gather(indices, n, x_out, y_out);
  }
  std::array<int64_t, 2> cond_shape() const override { return {tokens_, dim_}; }
  void gather_cond(const int64_t* indices, int64_t n, float* cond_out, int64_t* len_out) const override {
    std::vector<float> x(static_cast<size_t>(sample_numel()));
    for (int64_t s = 0; s < n; ++s) {
      int64_t label = 0;
      base_->gather(indices + s, 1, x.data(), &label);
      const uint64_t sample_key = mix(seed_ ^ mix(static_cast<uint64_t>(indices[s]) + 0x51ED270B27AB2FAFull));
      len_out[s] = 1 + static_cast<int64_t>(sample_key % static_cast<uint64_t>(tokens_));
      const uint64_t class_key = mix(seed_ ^ mix(static_cast<uint64_t>(label) + 0x2545F4914F6CDD1Dull));
      float* out = cond_out + s * tokens_ * dim_;
      for (int64_t e = 0; e < tokens_ * dim_; ++e) {
        const bool padding = e / dim_ >= len_out[s];  // random there: the model must not read it
        out[e] = unit_uniform(mix((padding ? sample_key : class_key) + static_cast<uint64_t>(e)));
      }
    }
  }

 protected:
  int64_t read(int64_t, float*) const override { throw std::logic_error("SyntheticCond::read"); }

 private:
  int64_t sample_numel() const {
    const auto s = base_->sample_shape();
    return s[0] * s[1] * s[2];
  }
  std::unique_ptr<Dataset> base_;
  int64_t tokens_, dim_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<Dataset> with_synthetic_cond(std::unique_ptr<Dataset> base, int64_t cond_tokens, int64_t cond_dim,
                                             uint64_t seed) {
  if (cond_tokens < 1 || cond_dim < 1)
    throw UsageError("synthetic condition features: tokens and dim must be >= 1, got " + std::to_string(cond_tokens) +
                     "x" + std::to_string(cond_dim));
  return std::make_unique<SyntheticCond>(std::move(base), cond_tokens, cond_dim, seed);
}

std::unique_ptr<Dataset> make_synthetic(int64_t size, std::array<int64_t, 3> shape, int64_t num_classes,
                                        uint64_t seed) {
  if (size < 1 || size > kMaxSyntheticSize)
    throw UsageError("synthetic dataset: size must be from 1 to " + std::to_string(kMaxSyntheticSize) + ", got " +
                     std::to_string(size));
  if (shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
    throw UsageError("synthetic dataset: sample shape must be positive, got " + std::to_string(shape[0]) + "x" +
                     std::to_string(shape[1]) + "x" + std::to_string(shape[2]));
  }
  if (num_classes < 1) {
    throw UsageError("synthetic dataset: num_classes must be >= 1, got " + std::to_string(num_classes));
  }
  return std::make_unique<Synthetic>(size, shape, num_classes, seed);
}

}  // namespace perftrain::data
