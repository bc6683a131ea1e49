#include "observe/plot/svg_plot.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "io/atomic_file.h"
#include "observe/bench/subprocess.h"

namespace perftrain::observe::plot {
namespace {

const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;  // no control characters in XML 1.0
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The plot area inside the document: margins for the title, labels, ticks.
struct Frame {
  double left, top, width, height;
  double x0, x1, y0, y1;  // data range (y in log10 when log)
  double sx(double x) const { return left + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * width; }
  double sy(double y) const { return top + height - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * height; }
};

std::string header(double w, double h, const std::string& title) {
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << px(w) << "\" height=\"" << px(h) << "\" viewBox=\"0 0 "
    << px(w) << " " << px(h) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << px(w) << "\" height=\"" << px(h) << "\" fill=\"white\"/>\n"
    << "<text x=\"" << px(w / 2) << "\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">" << esc(title)
    << "</text>\n";
  return o.str();
}

// Axes box, y ticks (linear: 5 steps; log: the powers of ten in range) and labels.
std::string axes(const Frame& f, bool log_y, const std::string& x_label, const std::string& y_label) {
  std::ostringstream o;
  o << "<rect x=\"" << px(f.left) << "\" y=\"" << px(f.top) << "\" width=\"" << px(f.width) << "\" height=\""
    << px(f.height) << "\" fill=\"none\" stroke=\"black\"/>\n";
  std::vector<double> ticks;
  if (log_y) {
    for (double e = std::ceil(f.y0); e <= std::floor(f.y1) + 1e-9; e += 1) ticks.push_back(e);
  } else {
    for (int i = 0; i <= 5; ++i) ticks.push_back(f.y0 + (f.y1 - f.y0) * i / 5);
  }
  for (double t : ticks) {
    const double y = f.sy(t);
    o << "<line x1=\"" << px(f.left - 4) << "\" y1=\"" << px(y) << "\" x2=\"" << px(f.left + f.width) << "\" y2=\""
      << px(y) << "\" stroke=\"#dddddd\"/>\n"
      << "<text x=\"" << px(f.left - 6) << "\" y=\"" << px(y + 4) << "\" text-anchor=\"end\">"
      << (log_y ? "1e" + num(t) : num(t)) << "</text>\n";
  }
  o << "<text x=\"" << px(f.left + f.width / 2) << "\" y=\"" << px(f.top + f.height + 40)
    << "\" text-anchor=\"middle\">" << esc(x_label) << "</text>\n"
    << "<text transform=\"translate(16," << px(f.top + f.height / 2) << ") rotate(-90)\" text-anchor=\"middle\">"
    << esc(y_label) << "</text>\n";
  return o.str();
}

}  // namespace

std::string line_plot_svg(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<Series>& series, bool log_y) {
  const double W = 900, H = 500;
  Frame f{80, 40, W - 110, H - 110, 0, 1, 0, 1};
  bool any = false;
  auto keep = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0); };
  for (const Series& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!keep(s.x[i], s.y[i])) continue;
      const double y = log_y ? std::log10(s.y[i]) : s.y[i];
      if (!any) f.x0 = f.x1 = s.x[i], f.y0 = f.y1 = y;
      any = true;
      f.x0 = std::min(f.x0, s.x[i]), f.x1 = std::max(f.x1, s.x[i]);
      f.y0 = std::min(f.y0, y), f.y1 = std::max(f.y1, y);
    }
  if (log_y) {
    f.y0 = std::floor(f.y0), f.y1 = std::ceil(f.y1);
    if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
  } else if (f.y1 <= f.y0) {
    f.y0 -= 0.5, f.y1 += 0.5;
  }
  std::ostringstream o;
  o << header(W, H, title) << axes(f, log_y, x_label, y_label);
  o << "<text x=\"" << px(f.left) << "\" y=\"" << px(f.top + f.height + 18) << "\" text-anchor=\"start\">" << num(f.x0)
    << "</text>\n<text x=\"" << px(f.left + f.width) << "\" y=\"" << px(f.top + f.height + 18)
    << "\" text-anchor=\"end\">" << num(f.x1) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const char* color = kColors[k % 6];
    o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    bool first = true;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!keep(s.x[i], s.y[i])) continue;
      o << (first ? "" : " ") << px(f.sx(s.x[i])) << "," << px(f.sy(log_y ? std::log10(s.y[i]) : s.y[i]));
      first = false;
    }
    o << "\"><title>" << esc(s.name) << "</title></polyline>\n";
    o << "<text x=\"" << px(f.left + f.width - 8) << "\" y=\"" << px(f.top + 16 + 16 * k) << "\" text-anchor=\"end\" fill=\""
      << color << "\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::vector<Series> loss_series_from_metrics(const std::string& metrics_jsonl_path) {
  std::ifstream in(metrics_jsonl_path);
  if (!in) throw RuntimeError("cannot read " + metrics_jsonl_path);
  Series loss{"loss", {}, {}};
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j.contains("loss") || !j["step"].is_number() ||
        !j["loss"].is_number())
      continue;
    loss.x.push_back(j["step"].get<double>());
    loss.y.push_back(j["loss"].get<double>());
  }
  return {loss};
}

std::string gradient_flow_svg(const std::vector<LayerGrad>& layers, const std::string& title) {
  const double slot = 14;
  const double W = std::max(600.0, 110 + slot * layers.size()), H = 560;
  // Labels below the bars need room: about 6 px a character, rotated.
  size_t longest = 0;
  for (const auto& l : layers) longest = std::max(longest, l.name.size());
  const double label_room = std::min(260.0, 20 + 5.0 * longest);
  Frame f{80, 40, W - 110, H - 80 - label_room, 0, 1, -8, 0};
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& l : layers)
    for (double v : {l.mean_abs, l.max_abs})
      if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  if (std::isfinite(lo)) f.y0 = std::floor(std::log10(lo)), f.y1 = std::ceil(std::log10(hi));
  if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
  std::ostringstream o;
  o << header(W, H, title) << axes(f, true, "", "|grad|");
  auto bar = [&](const char* cls, const char* color, double x, double w, double v, const std::string& tip) {
    const bool bad = !std::isfinite(v);
    const double top = bad ? f.top : f.sy(v > 0 ? std::max(std::log10(v), f.y0) : f.y0);
    o << "<rect class=\"" << cls << "\" x=\"" << px(x) << "\" y=\"" << px(top) << "\" width=\"" << px(w)
      << "\" height=\"" << px(f.top + f.height - top) << "\" fill=\"" << (bad ? "#d62728" : color) << "\"><title>"
      << esc(tip) << ": " << num(v) << "</title></rect>\n";
  };
  const double step = layers.empty() ? slot : f.width / layers.size();
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    const double x = f.left + step * i;
    bar("max", "#9ecae1", x + step * 0.1, step * 0.8, l.max_abs, l.name + " max |grad|");
    bar("mean", "#08519c", x + step * 0.3, step * 0.4, l.mean_abs, l.name + " mean |grad|");
    const double lx = x + step * 0.5, ly = f.top + f.height + 8;
    o << "<text transform=\"translate(" << px(lx) << "," << px(ly) << ") rotate(60)\" font-size=\"9\">" << esc(l.name)
      << "</text>\n";
  }
  o << "<rect x=\"" << px(f.left + f.width - 150) << "\" y=\"" << px(f.top + 8)
    << "\" width=\"10\" height=\"10\" fill=\"#9ecae1\"/><text x=\"" << px(f.left + f.width - 135) << "\" y=\""
    << px(f.top + 17) << "\">max |grad|</text>\n"
    << "<rect x=\"" << px(f.left + f.width - 150) << "\" y=\"" << px(f.top + 24)
    << "\" width=\"10\" height=\"10\" fill=\"#08519c\"/><text x=\"" << px(f.left + f.width - 135) << "\" y=\""
    << px(f.top + 33) << "\">mean |grad|</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string write_plot(const std::string& svg_path, const std::string& svg) {
  io::write_text_atomic(svg_path, svg);
  std::string png_path = svg_path;
  if (png_path.size() > 4 && png_path.compare(png_path.size() - 4, 4, ".svg") == 0) png_path.resize(png_path.size() - 4);
  png_path += ".png";
  using bench::run_command_capture;
  using bench::shell_quote;
  const std::string in = shell_quote(svg_path), out = shell_quote(png_path);
  if (run_command_capture("command -v rsvg-convert").ok &&
      run_command_capture("rsvg-convert -b white -o " + out + " " + in).ok)
    return png_path;
  for (const char* magick : {"magick", "convert"})
    if (run_command_capture(std::string("command -v ") + magick).ok &&
        run_command_capture(std::string(magick) + " " + in + " " + out).ok)
      return png_path;
  return "";
}

std::vector<LayerGrad> gradient_flow_layers(const GradHealthSample& sample) {
  std::vector<LayerGrad> out;
  for (const NamedGradStats& m : sample.modules) {
    const bool bad = !m.stats.finite();
    out.push_back({m.name, bad ? NAN : m.stats.mean_abs, bad ? NAN : m.stats.max_abs});
  }
  return out;
}

std::string write_gradient_flow(const GradHealthSample& sample, const std::string& svg_path) {
  return write_plot(svg_path, gradient_flow_svg(gradient_flow_layers(sample),
                                                "gradient flow at step " + std::to_string(sample.step)));
}

std::string write_loss_curve(const std::string& metrics_jsonl_path, const std::string& svg_path) {
  return write_plot(svg_path, line_plot_svg("training loss", "step", "loss (mean over each log window)",
                                            loss_series_from_metrics(metrics_jsonl_path)));
}

}  // namespace perftrain::observe::plot
