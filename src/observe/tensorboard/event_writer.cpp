#include "observe/tensorboard/event_writer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/fs.h"
#include "observe/tensorboard/proto.h"

namespace perftrain::observe::tensorboard {

using namespace proto;

namespace {

// Summary { repeated Value value = 1; } around one Value.
std::string summary_of(const std::string& value) {
  std::string s;
  put_bytes(s, 1, value);
  return s;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

Histogram from_counts(double mn, double mx, double num, double sum, double sumsq, const double* counts, int buckets) {
  Histogram h;
  if (num <= 0 || !std::isfinite(mn) || !std::isfinite(mx) || !std::isfinite(sum) || !std::isfinite(sumsq)) return h;
  h.min = mn;
  h.max = mx;
  h.num = num;
  h.sum = sum;
  h.sum_squares = sumsq;
  if (mx <= mn) {
    h.bucket_limit = {mx};
    h.bucket = {num};
    return h;
  }
  const double width = (mx - mn) / buckets;
  for (int i = 0; i < buckets; ++i) {
    h.bucket_limit.push_back(i + 1 == buckets ? mx : mn + width * (i + 1));
    h.bucket.push_back(counts[i]);
  }
  return h;
}

}  // namespace

Histogram histogram_of(const std::vector<double>& values, int buckets) {
  if (buckets < 1) throw UsageError("histogram_of: buckets must be positive");
  if (values.empty()) return {};
  double mn = values[0], mx = values[0], sum = 0, sumsq = 0;
  for (double v : values) {
    if (!std::isfinite(v)) return {};
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
    sumsq += v * v;
  }
  std::vector<double> counts(buckets, 0.0);
  if (mx > mn)
    for (double v : values) {
      int i = static_cast<int>((v - mn) / (mx - mn) * buckets);
      counts[std::min(std::max(i, 0), buckets - 1)] += 1;
    }
  return from_counts(mn, mx, double(values.size()), sum, sumsq, counts.data(), buckets);
}

std::vector<Histogram> histograms_of(const std::vector<at::Tensor>& tensors, int buckets) {
  if (buckets < 1) throw UsageError("histograms_of: buckets must be positive");
  if (tensors.empty()) return {};
  // Per tensor on its device: [min, max, sum, sum of squares, counts...],
  // the counts from histc over the values mapped to [0, 1] so that no
  // min/max has to come to the host first.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> rows;
  rows.reserve(tensors.size());
  for (const at::Tensor& t_in : tensors) {
    at::Tensor t = t_in.detach().reshape({-1}).to(at::kFloat);
    if (t.numel() == 0) {
      rows.push_back(at::full({4 + buckets}, NAN, t.options()));
      continue;
    }
    at::Tensor mn = t.min(), mx = t.max();
    at::Tensor unit = (t - mn) / (mx - mn).clamp_min(1e-30);
    at::Tensor counts = at::histc(unit, buckets, 0, 1);
    rows.push_back(at::cat({at::stack({mn, mx, t.sum(), t.square().sum()}), counts}));
  }
  // One copy back per device (the tensors normally share one).
  std::vector<Histogram> out;
  out.reserve(tensors.size());
  at::Tensor all = at::stack(rows).to(at::kCPU, at::kDouble).contiguous();
  const double* p = all.data_ptr<double>();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const double* r = p + i * (4 + buckets);
    out.push_back(from_counts(r[0], r[1], double(tensors[i].numel()), r[2], r[3], r + 4, buckets));
  }
  return out;
}

std::string tfrecord(const std::string& data) {
  std::string out;
  const uint64_t len = data.size();
  char len_bytes[8];
  std::memcpy(len_bytes, &len, 8);
  const uint32_t len_crc = base::crc32c_masked(base::crc32c(len_bytes, 8));
  const uint32_t data_crc = base::crc32c_masked(base::crc32c(data.data(), data.size()));
  out.append(len_bytes, 8);
  out.append(reinterpret_cast<const char*>(&len_crc), 4);
  out += data;
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

EventWriter::EventWriter(const std::string& dir) {
  fs::create_directories(dir);
  const long long now = static_cast<long long>(std::time(nullptr));
  const std::string base =
      dir + "/events.out.tfevents." + std::to_string(now) + "." + host_name() + "." + std::to_string(getpid());
  path_ = base;
  for (int n = 1; fs::exists(path_); ++n) path_ = base + "." + std::to_string(n);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw RuntimeError("cannot create " + path_ + ": " + std::strerror(errno));
  std::string event;
  put_double(event, 1, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  put_bytes(event, 3, "brain.Event:2");
  const std::string rec = tfrecord(event);
  std::fwrite(rec.data(), 1, rec.size(), file_);
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_event(int64_t step, const std::string& summary) {
  std::string event;
  put_double(event, 1, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  put_int(event, 2, step);
  put_bytes(event, 5, summary);
  const std::string rec = tfrecord(event);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    throw RuntimeError("cannot write " + path_ + ": " + std::strerror(errno));
}

void EventWriter::add_value(int64_t step, const std::string& value) { write_event(step, summary_of(value)); }

void EventWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, static_cast<float>(value));
  write_event(step, summary_of(v));
}

void EventWriter::add_histogram(const std::string& tag, int64_t step, const Histogram& h) {
  if (h.num <= 0) return;
  std::string histo;
  put_double(histo, 1, h.min);
  put_double(histo, 2, h.max);
  put_double(histo, 3, h.num);
  put_double(histo, 4, h.sum);
  put_double(histo, 5, h.sum_squares);
  put_packed_doubles(histo, 6, h.bucket_limit);
  put_packed_doubles(histo, 7, h.bucket);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 5, histo);
  write_event(step, summary_of(v));
}

void EventWriter::add_image(const std::string& tag, int64_t step, const std::string& png, int width, int height,
                            int channels) {
  std::string image;
  put_int(image, 1, height);
  put_int(image, 2, width);
  put_int(image, 3, channels);
  put_bytes(image, 4, png);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 4, image);
  write_event(step, summary_of(v));
}

void EventWriter::add_png_file(const std::string& tag, int64_t step, const std::string& png_path) {
  std::ifstream in(png_path, std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Signature (8 bytes), then IHDR: length, "IHDR", width, height (big-endian), depth, color type.
  if (png.size() < 26 || png.compare(1, 3, "PNG") != 0 || png.compare(12, 4, "IHDR") != 0)
    throw RuntimeError(png_path + " is not a readable PNG");
  auto be32 = [&](size_t at) {
    const auto* b = reinterpret_cast<const unsigned char*>(png.data() + at);
    return int((uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3]);
  };
  const int color_type = static_cast<unsigned char>(png[25]);
  const int channels = color_type == 0 ? 1 : color_type == 4 ? 2 : color_type == 6 ? 4 : 3;
  add_image(tag, step, png, be32(16), be32(20), channels);
}

void EventWriter::flush() {
  if (std::fflush(file_) != 0) throw RuntimeError("cannot write " + path_ + ": " + std::strerror(errno));
}

std::vector<std::pair<std::string, Histogram>> named_histograms(
    const std::string& prefix, const std::vector<std::pair<std::string, at::Tensor>>& named, int buckets) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(named.size());
  for (const auto& [name, t] : named) tensors.push_back(t);
  const auto hists = histograms_of(tensors, buckets);
  std::vector<std::pair<std::string, Histogram>> out;
  out.reserve(named.size());
  for (size_t i = 0; i < named.size(); ++i) out.emplace_back(prefix + "/" + named[i].first, hists[i]);
  return out;
}

}  // namespace perftrain::observe::tensorboard
