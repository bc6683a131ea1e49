// perftrain graph: a model as Graphviz DOT, from one forward run through
// nn::Module's hooks (on the meta device: shapes only).
//   module graph:   one box per module down to `depth` (deeper modules folded
//                   into it), containers as clusters, edges where one
//                   module's output reaches another's input (found through
//                   the autograd graph, so the residual adds and other plain
//                   ops between modules are crossed, not drawn).
//   autograd graph: the backward nodes from the loss (grad_fn, next_edges),
//                   the parameters as leaves named by their state_dict names,
//                   each node placed in the cluster of the module whose
//                   forward created it (by autograd sequence number); each
//                   module at `depth` drawn as one box holding the nodes of
//                   its subtree.
// Both roll up repeated blocks: consecutive children of a list with the same
// structure ("blocks.0".."blocks.27") are drawn once, labelled
// "blocks.0..27 x28" (module graph: the edge into the next block dashed;
// autograd graph: the first block's nodes, the others as one box).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "nn/module.h"

namespace perftrain::models::views {

struct GraphOptions {
  int depth = 1 << 20;  // module nesting shown (module graph: deeper modules fold into their ancestor's box)
  bool saved = false;   // autograd graph: list the tensors each node saved for backward
  bool roll_up = true;  // draw repeated blocks once
  std::string title;
};

// forward runs the model once and returns its output (module graph) or a
// scalar loss (autograd graph); the model's parameters must require grad.
std::string module_graph_dot(const nn::Module& model, const std::function<at::Tensor()>& forward,
                             const GraphOptions& options);
std::string autograd_graph_dot(const nn::Module& model, const std::function<at::Tensor()>& forward,
                               const GraphOptions& options);

// Whether Graphviz's `dot` is on the PATH.
bool have_graphviz();
// Writes the DOT text to path ("dot"), or renders it with `dot -T<format>`
// ("svg", "png"). Throws RuntimeError when dot is missing or fails.
void write_graph(const std::string& dot_text, const std::string& path, const std::string& format);

}  // namespace perftrain::models::views
