#include "data/dataset.h"

#include "base/error.h"

namespace perftrain::data {

void Dataset::gather(const int64_t* indices, int64_t n, float* x_out, int64_t* y_out) const {
  const auto s = sample_shape();
  const int64_t numel = s[0] * s[1] * s[2];
  const int64_t count = size();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = indices[k];
    if (i < 0 || i >= count) throw RuntimeError(describe() + ": sample index " + std::to_string(i) + " out of range");
    y_out[k] = read(i, x_out + k * numel);
  }
}

std::string Dataset::summary(const char* noun) const {
  const auto s = sample_shape();
  return std::to_string(size()) + " " + noun + " " + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" +
         std::to_string(s[2]) + ", " + std::to_string(num_classes()) + " classes";
}

}  // namespace perftrain::data
