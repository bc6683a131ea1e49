// perftrain graph: a model's module graph or autograd graph as Graphviz DOT,
// rendered to SVG or PNG with `dot` when it is installed.
#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/command.h"
#include "cli/view_options.h"
#include "models/views/graph.h"
#include "models/views/view_model.h"

namespace perftrain::cli {
namespace {

struct GraphArgs {
  std::string kind = "modules";
  std::string format;  // default: from -o's extension, else dot
  int depth = -1;
  bool saved = false, all_blocks = false;
};

std::string format_of(const ViewArgs& v, const GraphArgs& a) {
  if (!a.format.empty()) return a.format;
  for (const char* ext : {"svg", "png"}) {
    const std::string e = std::string(".") + ext;
    if (v.out.size() > e.size() && v.out.compare(v.out.size() - e.size(), e.size(), e) == 0) return ext;
  }
  return "dot";
}

void run_graph(const ViewArgs& v, const GraphArgs& a) {
  const train::TrainConfig cfg = resolve_view_config(v);
  const std::string format = format_of(v, a);
  if (format != "dot" && v.out.empty()) throw UsageError("--format " + format + " needs -o FILE");
  const int64_t batch = v.batch > 0 ? v.batch : 2;
  const models::views::ViewModel model = models::views::meta_model(cfg.model, batch);
  models::views::GraphOptions o;
  o.saved = a.saved;
  o.roll_up = !a.all_blocks;
  if (a.depth >= 0) o.depth = a.depth;  // default: every module
  o.title = cfg.model.name + " " + (a.kind == "modules" ? "module graph" : "autograd graph (backward of an MSE loss)") +
            ", batch " + std::to_string(batch);
  const std::string dot = a.kind == "modules"
                              ? models::views::module_graph_dot(*model.model, [&] { return model.forward(); }, o)
                              : models::views::autograd_graph_dot(*model.model, [&] { return model.loss(); }, o);
  if (v.out.empty()) write_view_output(v, dot);
  else models::views::write_graph(dot, v.out, format);
}

}  // namespace

void add_graph_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("graph", "a model's module graph or autograd graph as Graphviz DOT, SVG or PNG");
  auto v = std::make_shared<ViewArgs>();
  auto a = std::make_shared<GraphArgs>();
  add_view_options(cmd, v);
  cmd->add_option("-k,--kind", a->kind, "modules: modules and the data flow between them; autograd: backward nodes")
      ->check(CLI::IsMember({"modules", "autograd"}));
  cmd->add_option("-d,--depth", a->depth,
                  "module nesting drawn: a module at this depth is one box (default: every module)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--saved", a->saved, "autograd: list the tensors each backward node saved");
  cmd->add_flag("--all-blocks", a->all_blocks, "draw every repeated block instead of the first with a count");
  cmd->add_option("-f,--format", a->format, "dot, svg or png (default: from -o's extension, else dot)")
      ->check(CLI::IsMember({"dot", "svg", "png"}));
  cmd->add_option("-b,--batch-size,--batch", v->batch, "batch size of the traced forward")->check(CLI::PositiveNumber);
  cmd->callback([v, a] { run_graph(*v, *a); });
}

}  // namespace perftrain::cli
