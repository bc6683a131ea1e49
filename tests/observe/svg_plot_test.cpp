// The SVG plots: one mean and one max bar per layer, one point per finite
// metric, markup escaped, and the loss series read from a metrics.jsonl.
// (tests/python/test_tensorboard_events.py parses a run's plots as XML.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include "base/error.h"
#include "observe/plot/svg_plot.h"
#include "support/test_support.h"

namespace plot = perftrain::observe::plot;
using perftrain::testing::TempDir;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

// The points attribute of the k-th polyline.
std::vector<std::pair<double, double>> points(const std::string& svg, size_t k) {
  std::regex re("<polyline class=\"series\"[^>]*points=\"([^\"]*)\"");
  auto it = std::sregex_iterator(svg.begin(), svg.end(), re);
  for (size_t i = 0; i < k; ++i) ++it;
  std::vector<std::pair<double, double>> out;
  std::istringstream in((*it)[1].str());
  std::string pt;
  while (in >> pt) {
    const size_t comma = pt.find(',');
    out.emplace_back(std::stod(pt.substr(0, comma)), std::stod(pt.substr(comma + 1)));
  }
  return out;
}

}  // namespace

TEST(SvgPlot, GradientFlowHasOneMeanAndOneMaxBarPerLayer) {
  std::mt19937 rng(3);
  std::vector<plot::LayerGrad> layers;
  for (int i = 0; i < 23; ++i) {
    const double mean = std::pow(10.0, -6.0 + 4.0 * (rng() % 1000) / 1000.0);
    layers.push_back({"blocks." + std::to_string(i) + ".attn<&>", mean, mean * (1 + rng() % 50)});
  }
  layers[4].mean_abs = 0;  // a dead layer: drawn at the axis
  layers[7].max_abs = NAN;
  const std::string svg = plot::gradient_flow_svg(layers, "gradient flow \"step 5\"");
  EXPECT_EQ(count(svg, "class=\"mean\""), layers.size());
  EXPECT_EQ(count(svg, "class=\"max\""), layers.size());
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_EQ(count(svg, "</svg>"), 1u);
  EXPECT_EQ(count(svg, "attn<&>"), 0u) << "names are escaped";
  EXPECT_EQ(count(svg, "attn&lt;&amp;&gt;"), 2 * layers.size() + layers.size());  // 2 tooltips + 1 label
  EXPECT_EQ(count(svg, "#d62728"), 1u) << "the non-finite bar is red";
  // Taller bars for larger values: the bar heights follow log10 of the values.
  std::regex re("class=\"mean\" x=\"[^\"]*\" y=\"[^\"]*\" width=\"[^\"]*\" height=\"([^\"]*)\"");
  std::vector<double> heights;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    heights.push_back(std::stod((*it)[1].str()));
  ASSERT_EQ(heights.size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    for (size_t j = 0; j < layers.size(); ++j) {
      if (layers[i].mean_abs > 2 * layers[j].mean_abs) {
        EXPECT_GT(heights[i], heights[j]) << i << " vs " << j;
      }
    }
  }
}

TEST(SvgPlot, LineHasOnePointPerFiniteValueInOrder) {
  plot::Series a{"loss", {}, {}}, b{"other", {}, {}};
  std::mt19937 rng(5);
  for (int i = 0; i < 40; ++i) {
    a.x.push_back(10 * (i + 1));
    a.y.push_back(0.1 + (rng() % 1000) / 1000.0);
  }
  a.y[3] = NAN;
  b.x = {1, 2, 3};
  b.y = {3, 2, 1};
  const std::string svg = plot::line_plot_svg("t", "step", "loss", {a, b});
  const auto pa = points(svg, 0), pb = points(svg, 1);
  EXPECT_EQ(pa.size(), 39u);
  EXPECT_EQ(pb.size(), 3u);
  for (size_t i = 1; i < pa.size(); ++i) EXPECT_GT(pa[i].first, pa[i - 1].first);
  // SVG's y grows downwards: the largest value is highest.
  size_t top = 0;
  for (size_t i = 0, k = 0; i < a.y.size(); ++i) {
    if (std::isnan(a.y[i])) continue;
    if (pa[k].second < pa[top].second) top = k;
    ++k;
  }
  double max_y = 0;
  size_t max_k = 0;
  for (size_t i = 0, k = 0; i < a.y.size(); ++i) {
    if (std::isnan(a.y[i])) continue;
    if (a.y[i] > max_y) max_y = a.y[i], max_k = k;
    ++k;
  }
  EXPECT_EQ(top, max_k);
  const std::string log_svg = plot::line_plot_svg("t", "step", "loss", {b}, /*log_y=*/true);
  EXPECT_EQ(points(log_svg, 0).size(), 3u);
}

TEST(SvgPlot, LossSeriesFromMetricsSkipsLinesWithoutLoss) {
  TempDir dir;
  {
    std::ofstream out(dir.file("metrics.jsonl"));
    out << "{\"step\": 50, \"loss\": 0.9}\n{\"step\": 100, \"loss\": 0.7, \"lr\": 1e-4}\n"
        << "{\"step\": 120, \"event\": \"warning\"}\nnot json\n{\"step\": 150, \"loss\": 0.5}\n";
  }
  const auto s = plot::loss_series_from_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].x, (std::vector<double>{50, 100, 150}));
  EXPECT_EQ(s[0].y, (std::vector<double>{0.9, 0.7, 0.5}));
  EXPECT_THROW(plot::loss_series_from_metrics(dir.file("missing.jsonl")), perftrain::RuntimeError);
}

TEST(SvgPlot, WritePlotWritesTheSvgAndAPngOnlyWithAConverter) {
  TempDir dir;
  const std::string svg = plot::gradient_flow_svg({{"a", 1e-3, 1e-2}, {"b", 1e-4, 1e-3}}, "g");
  const std::string png = plot::write_plot(dir.file("g.svg"), svg);
  std::ifstream in(dir.file("g.svg"));
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), svg);
  if (!png.empty()) {
    EXPECT_EQ(png, dir.file("g.png"));
    std::ifstream p(png, std::ios::binary);
    char sig[4] = {0};
    p.read(sig, 4);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  }
}

TEST(SvgPlot, GradientFlowOfAHealthSampleHasOneBarPairPerModule) {
  perftrain::observe::GradHealthSample s;
  s.step = 40;
  std::mt19937 rng(9);
  const std::vector<std::string> names = {"x_embedder.proj.weight", "t_embedder.mlp.0.weight", "blocks.0.attn.qkv.weight",
                                          "blocks.0.mlp.fc2.weight", "blocks.1.attn.qkv.weight", "blocks.2.mlp.fc1.bias",
                                          "final_layer.linear.weight"};
  for (const auto& name : names) {
    perftrain::observe::GradStats g;
    g.numel = 10 + rng() % 100;
    g.mean_abs = 1e-5 * (1 + rng() % 100);
    g.max_abs = g.mean_abs * (2 + rng() % 10);
    s.params.push_back({name, g});
  }
  s.params[4].stats.nonfinite = 1;
  perftrain::observe::summarize_modules(s);
  const auto layers = plot::gradient_flow_layers(s);
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers[2].name, "blocks.0");
  // blocks.0: numel-weighted mean and the max of its two parameters.
  const auto& a = s.params[2].stats;
  const auto& b = s.params[3].stats;
  EXPECT_NEAR(layers[2].mean_abs, (a.mean_abs * a.numel + b.mean_abs * b.numel) / (a.numel + b.numel), 1e-15);
  EXPECT_EQ(layers[2].max_abs, std::max(a.max_abs, b.max_abs));
  EXPECT_TRUE(std::isnan(layers[3].max_abs)) << "blocks.1 has a NaN gradient";
  TempDir dir;
  plot::write_gradient_flow(s, dir.file("gradient_flow.svg"));
  std::ifstream in(dir.file("gradient_flow.svg"));
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(count(svg, "class=\"mean\""), 6u);
  EXPECT_EQ(count(svg, "class=\"max\""), 6u);
  EXPECT_NE(svg.find("gradient flow at step 40"), std::string::npos);
}
