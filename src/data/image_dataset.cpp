// The image inputs as a Dataset (open_images, data/dataset.h): the listing
// is an ImageSet; each read decodes, crops and scales one image.
#include <ATen/core/Tensor.h>

#include "base/error.h"
#include "data/adm_crop.h"
#include "data/dataset.h"
#include "data/image_set.h"

namespace perftrain::data {
namespace {

class Images final : public Dataset {
 public:
  Images(ImageSet set, int64_t size) : set_(std::move(set)), size_(size) {}

  int64_t size() const override { return set_.size(); }
  std::array<int64_t, 3> sample_shape() const override { return {3, size_, size_}; }
  int64_t num_classes() const override { return set_.num_classes(); }
  std::string describe() const override {
    return set_.describe() + ": " + summary("images") + ", ADM centre crop";
  }

 protected:
  int64_t read(int64_t i, float* out) const override {
    const at::Tensor crop = adm_center_crop(set_.read_rgb(i), size_);  // [size, size, 3]
    const uint8_t* p = crop.data_ptr<uint8_t>();
    const int64_t plane = size_ * size_;
    // HWC uint8 to CHW float, as ToTensor then Normalize(0.5, 0.5) compute it.
    for (int64_t k = 0; k < plane; ++k)
      for (int64_t c = 0; c < 3; ++c) out[c * plane + k] = (static_cast<float>(p[k * 3 + c]) / 255.0f - 0.5f) / 0.5f;
    return set_.item(i).label;
  }

 private:
  ImageSet set_;
  int64_t size_;
};

}  // namespace

std::unique_ptr<Dataset> open_images(const std::string& path, int64_t image_size) {
  if (image_size < 1) throw UsageError("images: model.image_size must be >= 1, got " + std::to_string(image_size));
  return std::make_unique<Images>(ImageSet::open(path), image_size);
}

}  // namespace perftrain::data
