// TensorBoard event files written without protobuf or TensorFlow: each record
// is TFRecord-framed (uint64 length, masked CRC32C of the length, the bytes,
// masked CRC32C of the bytes) and holds a hand-encoded tensorflow.Event. The
// first record names the format ("brain.Event:2"); then one Event per value:
// Summary.Value with simple_value (scalars), histo (HistogramProto) or image
// (PNG bytes). TensorBoard's legacy readers take these without plugin
// metadata. Writes are buffered by stdio until flush().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::observe::tensorboard {

// A HistogramProto: bucket i counts the values in (bucket_limit[i-1],
// bucket_limit[i]], the first from min.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};

// Equal-width buckets between the values' min and max (one bucket when they
// are equal). Empty or non-finite input gives num = 0.
Histogram histogram_of(const std::vector<double>& values, int buckets = 30);
// The same for each tensor (any dtype, any device), computed where the
// tensors live and read back in one copy. A tensor with a non-finite value
// gives num = 0 (the caller skips it).
std::vector<Histogram> histograms_of(const std::vector<at::Tensor>& tensors, int buckets = 30);

// One TFRecord around `data` (for the writer and its tests).
std::string tfrecord(const std::string& data);

class EventWriter {
 public:
  // Creates `dir` and events.out.tfevents.<unix time>.<host>.<pid> in it
  // (with a ".<n>" suffix if that name is taken); RuntimeError if it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  const std::string& path() const { return path_; }

  // One encoded Summary.Value (a plugin's summary: observe/tensorboard/plugins.h).
  void add_value(int64_t step, const std::string& value);
  void add_scalar(const std::string& tag, int64_t step, double value);
  // Skips a histogram with num = 0.
  void add_histogram(const std::string& tag, int64_t step, const Histogram& h);
  // PNG bytes with their size (channels: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA).
  void add_image(const std::string& tag, int64_t step, const std::string& png, int width, int height, int channels);
  // A PNG file as an image; its size and channels from its IHDR chunk.
  // RuntimeError if it is not a readable PNG.
  void add_png_file(const std::string& tag, int64_t step, const std::string& png_path);
  // Hands the buffered records to the file system.
  void flush();

 private:
  void write_event(int64_t step, const std::string& summary);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// A histogram per tensor, tagged prefix + "/" + name (one read-back for all).
std::vector<std::pair<std::string, Histogram>> named_histograms(
    const std::string& prefix, const std::vector<std::pair<std::string, at::Tensor>>& named, int buckets = 30);

}  // namespace perftrain::observe::tensorboard
