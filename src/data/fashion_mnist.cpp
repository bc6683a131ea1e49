// Fashion-MNIST: 28x28 gray images kept as the idx file's bytes (47 MB for the
// training set, a quarter of float32) and converted while gathering.
#include <sys/stat.h>

#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "data/dataset.h"
#include "io/idx.h"

namespace perftrain::data {
namespace {

constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kSide = 28, kPadded = 32, kPad = (kPadded - kSide) / 2, kClasses = 10;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "<dir>/<stem>.gz" as Debian ships it, else the uncompressed "<dir>/<stem>".
std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const std::string& name : {stem + ".gz", stem}) {
    const std::string path = dir + "/" + name;
    if (is_file(path)) return path;
  }
  throw UsageError("Fashion-MNIST: " + base::printable(dir) + " has no " + stem + "[.gz]; install it with " +
                   "`apt-get install dataset-fashion-mnist` (files in " + kDefaultDir +
                   ") or pass a directory holding the four idx files");
}

class FashionMnist final : public Dataset {
 public:
  FashionMnist(const std::string& dir, bool train) : dir_(dir), train_(train) {
    const std::string prefix = train ? "train" : "t10k";
    const std::string images_path = find_idx(dir, prefix + "-images-idx3-ubyte");
    const std::string labels_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
    io::IdxArray images = io::read_idx(images_path);
    io::IdxArray labels = io::read_idx(labels_path);
    const std::string images_name = base::printable(images_path), labels_name = base::printable(labels_path);
    if (images.dims.size() != 3 || images.dims[1] != kSide || images.dims[2] != kSide) {
      throw RuntimeError(images_name + ": expected images [N, 28, 28], found " + dims_text(images.dims));
    }
    if (labels.dims.size() != 1) {
      throw RuntimeError(labels_name + ": expected labels [N], found " + dims_text(labels.dims));
    }
    if (labels.dims[0] != images.dims[0]) {
      throw RuntimeError("Fashion-MNIST: " + labels_name + " has " + std::to_string(labels.dims[0]) +
                         " labels but " + images_name + " has " + std::to_string(images.dims[0]) + " images");
    }
    for (size_t i = 0; i < labels.data.size(); ++i) {
      if (labels.data[i] >= kClasses) {
        throw RuntimeError(labels_name + ": label " + std::to_string(labels.data[i]) + " at byte " +
                           std::to_string(8 + i) + " is not in 0..9");
      }
    }
    size_ = images.dims[0];
    pixels_ = std::move(images.data);
    labels_ = std::move(labels.data);
  }

  int64_t size() const override { return size_; }
  std::array<int64_t, 3> sample_shape() const override { return {1, kPadded, kPadded}; }
  int64_t num_classes() const override { return kClasses; }

  std::string describe() const override {
    return std::string("Fashion-MNIST ") + (train_ ? "train" : "test") + " (" + summary("images") + ") from " +
           base::printable(dir_);
  }

 protected:
  int64_t read(int64_t i, float* out) const override {
    std::fill(out, out + kPadded * kPadded, -1.0f);  // background and padding are -1
    const uint8_t* src = pixels_.data() + i * kSide * kSide;
    for (int64_t y = 0; y < kSide; ++y) {
      for (int64_t x = 0; x < kSide; ++x) {
        out[(y + kPad) * kPadded + x + kPad] = src[y * kSide + x] * (2.0f / 255.0f) - 1.0f;
      }
    }
    return labels_[i];
  }

 private:
  static std::string dims_text(const std::vector<int64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }

  std::string dir_;
  bool train_;
  int64_t size_ = 0;
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
};

}  // namespace

std::unique_ptr<Dataset> open_fashion_mnist(const std::string& dir, bool train) {
  const std::string d = dir.empty() ? kDefaultDir : dir;
  struct stat st {};
  if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw UsageError("Fashion-MNIST: no directory " + base::printable(d) + "; install it with " +
                     "`apt-get install dataset-fashion-mnist` (files in " + kDefaultDir +
                     ") or pass a directory holding the four idx files");
  }
  return std::make_unique<FashionMnist>(d, train);
}

}  // namespace perftrain::data
