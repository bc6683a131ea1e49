// The TensorBoard event writer read back by the tests' own reader
// (support/event_reader.h: TFRecord framing with both CRCs computed bit by
// bit, not through base/crc32c, and a protobuf decoder for Event,
// Summary.Value, HistogramProto and Image).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/fs.h"
#include "io/png.h"
#include "observe/grad_health.h"
#include "observe/tensorboard/event_writer.h"
#include "observe/tensorboard/health_events.h"
#include "support/event_reader.h"
#include "support/test_support.h"

namespace tb = perftrain::observe::tensorboard;
using perftrain::testing::TempDir;
using namespace perftrain::testing::event_reader;

TEST(TensorBoardEvents, FileNameAndFirstRecordNameTheFormat) {
  TempDir dir;
  { tb::EventWriter w(dir.file("tb")); }
  const std::string path = only_event_file(dir.file("tb"));
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos) << path;
  EXPECT_NE(path.find("." + std::to_string(getpid())), std::string::npos) << path;
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.6e9);
}

TEST(TensorBoardEvents, TwoWritersInOneSecondGetTwoFiles) {
  TempDir dir;
  tb::EventWriter a(dir.path()), b(dir.path());
  EXPECT_NE(a.path(), b.path());
}

TEST(TensorBoardEvents, ScalarsHistogramsAndImagesReadBack) {
  TempDir dir;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.3, 2.0);
  std::vector<std::pair<int64_t, double>> scalars;
  for (int i = 0; i < 5; ++i) scalars.emplace_back(int64_t(1000) * i + (rng() % 1000) + 3'000'000'000LL, normal(rng));
  std::vector<double> values(1000);
  for (double& v : values) v = normal(rng);
  const tb::Histogram h = tb::histogram_of(values, 17);
  // A PNG of random pixels, through the PNG encoder the trainer's grids use.
  const int W = 13, H = 7;
  std::vector<uint8_t> pixels(W * H * 3);
  for (auto& p : pixels) p = uint8_t(rng());
  perftrain::io::save_png(dir.file("img.png"), pixels.data(), W, H, 3);
  const std::string png = read_all(dir.file("img.png"));

  std::string path;
  {
    tb::EventWriter w(dir.file("tb"));
    path = w.path();
    for (const auto& [step, v] : scalars) w.add_scalar("train/loss", step, v);
    w.add_histogram("weights/blocks.0.w", 42, h);
    w.add_png_file("samples", 43, dir.file("img.png"));
    w.add_histogram("skipped", 44, tb::Histogram{});  // num = 0: not written
    w.flush();
  }
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 1 + scalars.size() + 2);
  for (size_t i = 0; i < scalars.size(); ++i) {
    const Event& e = events[1 + i];
    EXPECT_EQ(e.tag, "train/loss");
    EXPECT_EQ(e.step, scalars[i].first);
    EXPECT_EQ(as_float(one(e.value, 2)), float(scalars[i].second));
  }
  const Event& he = events[1 + scalars.size()];
  EXPECT_EQ(he.tag, "weights/blocks.0.w");
  EXPECT_EQ(he.step, 42);
  const Message histo = decode(one(he.value, 5).bytes);
  const double mn = *std::min_element(values.begin(), values.end());
  const double mx = *std::max_element(values.begin(), values.end());
  double sum = 0, sumsq = 0;
  for (double v : values) sum += v, sumsq += v * v;
  EXPECT_EQ(as_double(one(histo, 1)), mn);
  EXPECT_EQ(as_double(one(histo, 2)), mx);
  EXPECT_EQ(as_double(one(histo, 3)), 1000.0);
  EXPECT_NEAR(as_double(one(histo, 4)), sum, 1e-9 * sumsq);
  EXPECT_NEAR(as_double(one(histo, 5)), sumsq, 1e-9 * sumsq);
  const auto limits = as_doubles(one(histo, 6));
  const auto counts = as_doubles(one(histo, 7));
  ASSERT_EQ(limits.size(), 17u);
  ASSERT_EQ(counts.size(), 17u);
  EXPECT_EQ(limits.back(), mx);
  // Every value counted once, in the bucket whose limits enclose it.
  std::vector<double> direct(17, 0);
  for (double v : values) {
    size_t b = std::lower_bound(limits.begin(), limits.end(), v) - limits.begin();
    ASSERT_LT(b, limits.size());
    direct[b] += 1;
  }
  double total = 0;
  for (size_t b = 0; b < 17; ++b) {
    total += counts[b];
    // A value on a limit may fall either side of it in floating point.
    EXPECT_NEAR(counts[b], direct[b], 1.0) << "bucket " << b;
  }
  EXPECT_EQ(total, 1000.0);

  const Event& ie = events[2 + scalars.size()];
  EXPECT_EQ(ie.tag, "samples");
  EXPECT_EQ(ie.step, 43);
  const Message image = decode(one(ie.value, 4).bytes);
  EXPECT_EQ(one(image, 1).varint, uint64_t(H));
  EXPECT_EQ(one(image, 2).varint, uint64_t(W));
  EXPECT_EQ(one(image, 3).varint, 3u);
  EXPECT_EQ(one(image, 4).bytes, png);
}

TEST(TensorBoardEvents, ACorruptedByteFailsItsCrc) {
  TempDir dir;
  std::string path;
  {
    tb::EventWriter w(dir.path());
    path = w.path();
    w.add_scalar("x", 1, 2.5);
  }
  const std::string good = read_all(path);
  std::vector<std::string> recs;
  ASSERT_EQ(split_records(good, recs), "");
  ASSERT_EQ(recs.size(), 2u);
  const size_t second = 12 + recs[0].size() + 4;
  std::string bad = good;
  bad[bad.size() - 5] ^= 0x01;  // the last data byte
  recs.clear();
  EXPECT_EQ(split_records(bad, recs), "record 1: data CRC");
  // A flipped bit in the second record's length.
  bad = good;
  bad[second] ^= 0x01;
  recs.clear();
  EXPECT_EQ(split_records(bad, recs), "record 1: length CRC");
}

TEST(TensorBoardEvents, DeviceHistogramsMatchTheHostOnes) {
  at::manual_seed(11);
  const std::vector<at::Tensor> ts = {at::randn({33, 5}) * 3 + 1, at::rand({257}), at::full({4}, 0.25),
                                      at::randn({6}).to(at::kDouble)};
  const auto got = tb::histograms_of(ts, 10);
  ASSERT_EQ(got.size(), ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    at::Tensor c = ts[k].to(at::kDouble).contiguous();
    std::vector<double> v(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    const tb::Histogram want = tb::histogram_of(v, 10);
    EXPECT_EQ(got[k].num, want.num) << k;
    EXPECT_NEAR(got[k].min, want.min, 1e-6) << k;
    EXPECT_NEAR(got[k].max, want.max, 1e-6) << k;
    EXPECT_NEAR(got[k].sum, want.sum, 1e-4 * (1 + want.sum_squares)) << k;
    EXPECT_NEAR(got[k].sum_squares, want.sum_squares, 1e-5 * want.sum_squares) << k;
    ASSERT_EQ(got[k].bucket.size(), want.bucket.size()) << k;
    double total = 0;
    for (size_t b = 0; b < want.bucket.size(); ++b) {
      EXPECT_NEAR(got[k].bucket[b], want.bucket[b], 1.0) << k << " bucket " << b;  // edge rounding
      EXPECT_NEAR(got[k].bucket_limit[b], want.bucket_limit[b], 1e-5) << k << " bucket " << b;
      total += got[k].bucket[b];
    }
    EXPECT_EQ(total, want.num) << k;
  }
  EXPECT_EQ(got[2].bucket.size(), 1u);  // a constant tensor: one bucket
  const auto bad = tb::histograms_of({at::tensor({1.0f, NAN})}, 10);
  EXPECT_EQ(bad[0].num, 0);
}

TEST(TensorBoardEvents, GradHealthSampleAsScalars) {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(1e-4, 2.0);
  perftrain::observe::GradHealthSample s;
  s.step = 250;
  for (const char* name : {"x_embedder.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.bias",
                           "blocks.1.attn.qkv.weight", "final_layer.linear.weight"}) {
    perftrain::observe::GradStats g;
    g.numel = 100 + rng() % 1000;
    g.norm = u(rng), g.mean_abs = u(rng) / 10, g.max_abs = u(rng) * 3, g.zero_share = u(rng) / 4;
    g.weight_norm = u(rng) * 10, g.update_norm = u(rng) / 100;
    s.params.push_back({name, g});
  }
  s.params[2].stats.nonfinite = 3;
  perftrain::observe::summarize_modules(s);
  ASSERT_EQ(s.modules.size(), 4u);

  TempDir dir;
  std::string path;
  {
    tb::EventWriter w(dir.path());
    path = w.path();
    for (const auto& [tag, value] : tb::grad_health_scalars(s)) w.add_scalar(tag, s.step, value);
  }
  std::map<std::string, float> got;
  for (const Event& e : read_events(path)) {
    if (e.tag.empty()) continue;
    EXPECT_EQ(e.step, 250);
    EXPECT_EQ(got.count(e.tag), 0u) << e.tag;
    got[e.tag] = as_float(one(e.value, 2));
  }
  EXPECT_EQ(got.at("grad/global_norm"), float(s.global.norm));
  EXPECT_EQ(got.at("grad/global_update_ratio"), float(s.global.update_ratio()));
  EXPECT_EQ(got.at("grad/nonfinite"), 3.0f);
  for (const auto& m : s.modules) {
    EXPECT_EQ(got.at("grad_norm/" + m.name), float(m.stats.norm)) << m.name;
    EXPECT_EQ(got.at("grad_max/" + m.name), float(m.stats.max_abs)) << m.name;
    EXPECT_EQ(got.at("grad_zero_share/" + m.name), float(m.stats.zero_share)) << m.name;
    EXPECT_EQ(got.at("update_ratio/" + m.name), float(m.stats.update_ratio())) << m.name;
    EXPECT_EQ(got.count("grad_nonfinite/" + m.name), m.name == "blocks.0" ? 1u : 0u) << m.name;
  }
  EXPECT_EQ(got.size(), 3 + 4 * s.modules.size() + 1);
}
