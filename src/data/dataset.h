// A dataset is random access to (image-or-latent, label) samples, all of one
// shape [C, H, W] as float32 and labels as int64. Loaders (BatchLoader) draw
// batches from it in a seeded order on a background thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace perftrain::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::array<int64_t, 3> sample_shape() const = 0;  // C, H, W
  virtual int64_t num_classes() const = 0;                  // labels lie in [0, n)
  // Writes samples indices[0..n) as float32 into x_out (n*C*H*W values) and
  // their labels into y_out: each index checked (RuntimeError when outside
  // [0, size())), then read. Must be safe to call from several threads at
  // once (the loader's workers, each with its own rows).
  virtual void gather(const int64_t* indices, int64_t n, float* x_out, int64_t* y_out) const;
  virtual std::string describe() const = 0;  // one line, for logs and reports
  // Per-sample condition features (e.g. text-encoder outputs): {Tc, Dc},
  // or {0, 0} for a dataset without them.
  virtual std::array<int64_t, 2> cond_shape() const { return {0, 0}; }
  // Features of samples indices[0..n) as float32 into cond_out (n*Tc*Dc)
  // and their valid token counts (in [0, Tc]) into len_out. Thread-safe.
  virtual void gather_cond(const int64_t* indices, int64_t n, float* cond_out, int64_t* len_out) const {
    throw std::logic_error(describe() + " has no condition features");
  }

 protected:
  // Sample i (already checked) as C*H*W float32 values into out; its label.
  virtual int64_t read(int64_t i, float* out) const = 0;
  // "N samples CxHxW, K classes", for describe().
  std::string summary(const char* noun = "samples") const;
};

// Fashion-MNIST from idx files (optionally gzip'ed), e.g. Debian's
// dataset-fashion-mnist in /usr/share/datasets/fashion-mnist: 28x28 images
// padded to 32x32 and scaled to [-1, 1] (background -1), 10 classes. An
// empty dir means that Debian directory. Files are <train|t10k>-images-idx3-
// ubyte and -labels-idx1-ubyte, each with or without .gz.
// Throws UsageError when the files are missing (saying how to install them),
// RuntimeError naming the file and byte when one is corrupt or truncated.
std::unique_ptr<Dataset> open_fashion_mnist(const std::string& dir, bool train = true);

// Pre-extracted latents: one .safetensors file or a directory of them, each
// holding "latents" [N, C, H, W] (F32, F16 or BF16) and "labels" [N] (any
// integer type); read per sample with pread, not loaded (a NaN or inf in a sample
// is a data error naming the file and the sample). Optionally, in every shard or in
// none, condition features "cond" [N, Tc, Dc] (F32, F16 or BF16) with
// "cond_len" [N] (integers in [0, Tc]: the valid tokens, the rest padding).
std::unique_ptr<Dataset> open_latent_shards(const std::string& path);
// The shard files open_latent_shards reads: `path` itself, or the directory's
// *.safetensors files (hidden ones skipped) in name order. UsageError naming
// the path when it does not exist or holds none.
std::vector<std::string> latent_shard_files(const std::string& path);

// Images for pixel-space training: an image folder or WebDataset tar shards
// (data/image_set.h says which paths are which), each image decoded to RGB,
// centre-cropped to image_size x image_size as ADM and DiT do
// (data/adm_crop.h) and scaled to [-1, 1] as torchvision's ToTensor then
// Normalize(0.5, 0.5): (v / 255 - 0.5) / 0.5. Samples [3, image_size,
// image_size]. The flip is the loader's (LoaderOptions::flip). Open errors
// are those of ImageSet::open; an image that cannot be decoded is a
// RuntimeError naming its file (or shard and member) when it is read.
std::unique_ptr<Dataset> open_images(const std::string& path, int64_t image_size);

// Images for pixel-space training: an image folder or WebDataset tar shards
// (data/image_set.h says which paths are which), each image decoded to RGB,
// centre-cropped to image_size x image_size as ADM and DiT do
// (data/adm_crop.h) and scaled to [-1, 1] as torchvision's ToTensor then
// Normalize(0.5, 0.5): (v / 255 - 0.5) / 0.5. Samples [3, image_size,
// image_size]. The flip is the loader's (LoaderOptions::flip). Open errors
// are those of ImageSet::open; an image that cannot be decoded is a
// RuntimeError naming its file (or shard and member) when it is read.
std::unique_ptr<Dataset> open_images(const std::string& path, int64_t image_size);

// The most samples a synthetic dataset has: it stores none, but a loader
// keeps an 8-byte index per sample for each epoch's order (800 MB here).
constexpr int64_t kMaxSyntheticSize = 100000000;

// Deterministic random latents (for benchmarks and tests): sample i depends
// only on (seed, i). UsageError for a size outside [1, kMaxSyntheticSize].
std::unique_ptr<Dataset> make_synthetic(int64_t size, std::array<int64_t, 3> shape,
                                        int64_t num_classes, uint64_t seed);

// base with deterministic condition features [Tc, Dc] per sample: a fixed
// random token sequence per class (so the features carry the label), a
// length per sample in [1, Tc] and random values in the padding.
std::unique_ptr<Dataset> with_synthetic_cond(std::unique_ptr<Dataset> base, int64_t cond_tokens, int64_t cond_dim,
                                             uint64_t seed);

}  // namespace perftrain::data
