// Plots of a training run as standalone SVG documents (no plotting library):
// the loss curve from metrics.jsonl and the gradient-flow plot (mean and max
// |grad| per layer as bars, on a log scale). write_plot() also renders a PNG
// beside the SVG when rsvg-convert or ImageMagick is on the PATH.
#pragma once

#include <string>
#include <vector>

#include "observe/grad_health.h"

namespace perftrain::observe::plot {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points are left out
};

// A line plot, one polyline per series (class "series", one <polyline>
// each, with one point per finite (x, y)), y on a log scale when log_y.
std::string line_plot_svg(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<Series>& series, bool log_y = false);

// The loss curve of a run: every line of metrics.jsonl with "step" and
// "loss" is a point (a line that is not JSON is skipped). RuntimeError if
// the file cannot be read.
std::vector<Series> loss_series_from_metrics(const std::string& metrics_jsonl_path);

struct LayerGrad {
  std::string name;
  double mean_abs = 0, max_abs = 0;  // mean and max |grad| over the layer's parameters
};

// The classic gradient-flow plot: per layer in model order a wide bar of
// max |grad| (class "max") and a narrow one of mean |grad| (class "mean"),
// log y axis; a layer with a non-finite value gets a red bar to the top.
std::string gradient_flow_svg(const std::vector<LayerGrad>& layers, const std::string& title);

// The layers of a gradient-health sample for the plot: its modules (a DiT
// block, an embedder, the final layer) in model order.
std::vector<LayerGrad> gradient_flow_layers(const GradHealthSample& sample);
// The gradient-flow plot of a sample written by write_plot, titled with its
// step; returns the PNG's path or "".
std::string write_gradient_flow(const GradHealthSample& sample, const std::string& svg_path);

// Writes `svg` to svg_path atomically and, when a converter is present,
// the same path with ".png" for ".svg". Returns the PNG's path or "".
std::string write_plot(const std::string& svg_path, const std::string& svg);

// The loss curve of metrics.jsonl written by write_plot; returns the PNG's
// path or "".
std::string write_loss_curve(const std::string& metrics_jsonl_path, const std::string& svg_path);

}  // namespace perftrain::observe::plot
