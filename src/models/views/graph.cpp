#include "models/views/graph.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
// Compiled autograd's node description: the only way C++ can list what a
// node saved; internal to torch (present in 2.11), so --saved degrades to
// "not listed" where the header is gone.
#if __has_include(<torch/csrc/dynamo/compiled_autograd.h>)
#include <torch/csrc/dynamo/compiled_autograd.h>
#define PERFTRAIN_HAVE_COMPILED_AUTOGRAD 1
#endif

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"

namespace perftrain::models::views {
namespace {

using torch::autograd::Node;

struct TreeNode {
  const nn::Module* module;
  std::string name;
  int parent;
  std::vector<int> children;
  bool ran = false;
  int display_depth = 0;  // modules that ran above it (lists that never run do not count)
  // Roll-up: which group this node heads or belongs to (-1: none), its index in it.
  int group = -1;
  int member = 0;
};

struct Group {
  std::string label;  // "blocks.0..27"
  std::string range;  // "0..27"
  int count;
};

struct Call {
  int node;
  int enclosing = -1;  // the call that was running when this one began
  uint64_t seq_begin = 0, seq_end = 0;
  std::vector<at::Tensor> inputs;
  at::Tensor output;
};

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"') out += '\\';  // labels keep their \n line breaks
    out += c;
  }
  return out;
}

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string count_text(int64_t n) {
  char buf[32];
  if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof buf, "%.1f k", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The model's tree, the roll-up groups and the calls of one forward.
class Recording {
 public:
  Recording(const nn::Module& model, const std::function<at::Tensor()>& forward, bool roll_up) {
    walk(model, "", -1);
    if (roll_up) find_groups();
    std::vector<size_t> open;
    auto pre = model.add_forward_pre_hook([&](const std::string& name, const nn::Module&, at::TensorList in) {
      Call c;
      c.node = index.at(name);
      c.seq_begin = at::sequence_number::peek();
      c.inputs.assign(in.begin(), in.end());
      c.enclosing = open.empty() ? -1 : static_cast<int>(open.back());
      open.push_back(calls.size());
      calls.push_back(std::move(c));
    });
    auto post = model.add_forward_hook([&](const std::string&, const nn::Module&, at::TensorList, at::TensorList out) {
      Call& c = calls[open.back()];
      open.pop_back();
      c.seq_end = at::sequence_number::peek();
      if (!out.empty()) c.output = out[0];
    });
    result = forward();
    for (const Call& c : calls) nodes[c.node].ran = true;
    set_display_depth(0, 0);
  }

  // The name as drawn: each rolled member replaced by its group's label.
  std::string display_name(int i) const {
    std::vector<int> chain;
    for (int k = i; k >= 0; k = nodes[k].parent) chain.push_back(k);
    std::string name;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const TreeNode& n = nodes[*it];
      if (n.parent < 0) continue;
      const std::string leaf = n.name.substr(n.name.rfind('.') == std::string::npos ? 0 : n.name.rfind('.') + 1);
      const std::string part = n.group >= 0 ? groups[n.group].range : leaf;
      name += (name.empty() ? "" : ".") + part;
    }
    return name;
  }
  // Whether the node is (inside) a rolled member other than the first.
  bool hidden(int i) const {
    for (int k = i; k >= 0; k = nodes[k].parent) {
      if (nodes[k].group >= 0 && nodes[k].member > 0) return true;
    }
    return false;
  }
  // The outermost rolled group above (or at) i with its member index, or (-1, 0).
  std::pair<int, int> outer_group(int i) const {
    std::pair<int, int> g{-1, 0};
    for (int k = i; k >= 0; k = nodes[k].parent) {
      if (nodes[k].group >= 0) g = {nodes[k].group, nodes[k].member};
    }
    return g;
  }
  // The ancestor (or self) drawn at the given depth for a node deeper than it.
  int at_depth(int i, int depth) const {
    while (nodes[i].parent >= 0 && (!nodes[i].ran || nodes[i].display_depth > depth)) i = nodes[i].parent;
    return i;
  }
  std::vector<int> ran_children(int i) const {
    std::vector<int> out;
    for (int c : nodes[i].children) {
      if (nodes[c].ran) out.push_back(c);
      else for (int g : ran_children(c)) out.push_back(g);
    }
    return out;
  }
  std::string label_of(int i) const {
    const TreeNode& n = nodes[i];
    std::string label = n.parent < 0 ? n.module->type_name() : display_name(i) + " (" + n.module->type_name() + ")";
    if (n.group >= 0) label += " x" + std::to_string(groups[n.group].count);
    return label;
  }

  std::vector<TreeNode> nodes;
  std::vector<Group> groups;
  std::map<std::string, int> index;
  std::vector<Call> calls;
  at::Tensor result;

 private:
  void walk(const nn::Module& m, const std::string& name, int parent) {
    const int i = static_cast<int>(nodes.size());
    nodes.push_back({&m, name, parent, {}});
    index[name] = i;
    if (parent >= 0) nodes[parent].children.push_back(i);
    for (const auto& [child_name, child] : m.named_children())
      walk(*child, name.empty() ? child_name : name + "." + child_name, i);
  }
  std::string signature(int i) const {
    std::string s = nodes[i].module->type_name() + "(";
    for (const auto& [n, t, trainable] : nodes[i].module->own_tensors())
      s += n + (t.defined() ? shape_text(t.sizes()) : "-") + ";";
    for (int c : nodes[i].children) s += nodes[c].name.substr(nodes[c].name.rfind('.') + 1) + ":" + signature(c) + ";";
    return s + ")";
  }
  void find_groups() {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto& ch = nodes[i].children;
      size_t a = 0;
      while (a < ch.size()) {
        const std::string leaf_a = nodes[ch[a]].name.substr(nodes[ch[a]].name.rfind('.') + 1);
        size_t b = a + 1;
        if (is_index(leaf_a)) {
          const std::string sig = signature(ch[a]);
          while (b < ch.size() && is_index(nodes[ch[b]].name.substr(nodes[ch[b]].name.rfind('.') + 1)) &&
                 signature(ch[b]) == sig)
            ++b;
        }
        if (b - a >= 2) {
          const std::string& first = nodes[ch[a]].name;
          const std::string last = nodes[ch[b - 1]].name.substr(nodes[ch[b - 1]].name.rfind('.') + 1);
          groups.push_back({first + ".." + last, leaf_a + ".." + last, static_cast<int>(b - a)});
          for (size_t k = a; k < b; ++k) {
            nodes[ch[k]].group = static_cast<int>(groups.size()) - 1;
            nodes[ch[k]].member = static_cast<int>(k - a);
          }
        }
        a = b;
      }
    }
  }
  void set_display_depth(int i, int depth) {
    nodes[i].display_depth = depth;
    for (int c : nodes[i].children) set_display_depth(c, nodes[i].ran ? depth + 1 : depth);
  }
};

std::string graph_header(const GraphOptions& o) {
  std::string s = "digraph G {\n  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=11, compound=true";
  if (!o.title.empty()) s += ", label=\"" + dot_escape(o.title) + "\", labelloc=t";
  return s + "];\n  node [fontname=\"Helvetica\", fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=9];\n";
}

// The tensors a backward node saved, through the node's compiled-autograd
// description of itself (what torch.compile's backward reads); nodes that
// cannot describe themselves give nullopt.
std::optional<std::vector<at::Tensor>> saved_tensors(const std::shared_ptr<Node>& fn) {
#ifndef PERFTRAIN_HAVE_COMPILED_AUTOGRAD
  return std::nullopt;
#else
  try {
    torch::dynamo::autograd::AutogradCompilerCall compiler(torch::dynamo::autograd::SizeInput::STATIC);
    torch::dynamo::autograd::NodeCall call(0, fn);
    torch::dynamo::autograd::CompiledNodeArgs args(compiler, call);
    fn->compiled_args(args);
    return compiler.tensor_args.inputs;
  } catch (const std::exception&) {
    return std::nullopt;
  }
#endif
}

// DOT text being written, and the node ids it gives out: "n<k>" for each key,
// in the order the keys are first drawn.
class DotText {
 protected:
  std::string id(const std::string& key) {
    auto it = ids_.find(key);
    if (it != ids_.end()) return it->second;
    return ids_[key] = "n" + std::to_string(ids_.size());
  }
  std::ostringstream out_;

 private:
  std::map<std::string, std::string> ids_;
};

// The module graph of one recording at a display depth. Units are what is
// drawn: leaves (node index), container outputs (-2 - node index) and the
// model's inputs (-1000 - k); edges run from the unit that produced each
// unit's inputs, crossing the plain ops between modules.
class ModuleGraph : DotText {
 public:
  ModuleGraph(const Recording& r, int depth) : r_(r), depth_(depth) {
    index_outputs();
    collect_edges();
  }

  // Clusters for containers, boxes for leaves, the model's inputs and output.
  std::string dot(const GraphOptions& o) {
    out_ << graph_header(o);
    for (size_t k = 0; k < root_call_->inputs.size(); ++k) {
      const at::Tensor& t = root_call_->inputs[k];
      if (!t.defined()) continue;
      out_ << "  " << id("in" + std::to_string(k)) << " [shape=note, label=\"input " << k << "\\n"
           << shape_text(t.sizes()) << " " << dot_escape(std::string(c10::toString(t.scalar_type()))) << "\"];\n";
    }
    emit(0, "  ");
    emit_weight_lists();
    for (const auto& [e, info] : edges_) {
      out_ << "  " << id(e.first) << " -> " << id(e.second);
      if (info.loop) out_ << " [style=dashed, label=\"next block\"]";
      else if (info.again > 0) out_ << " [style=dashed, label=\"next loop ×" << info.again << "\"]";
      out_ << ";\n";
    }
    out_ << "}\n";
    return out_.str();
  }

 private:
  struct EdgeInfo {
    bool loop = false;
    int again = 0;  // a unit feeding itself: the calls after its first (a looped model's next loop)
  };

  bool is_leaf(int i) const {
    const TreeNode& n = r_.nodes[i];
    return n.ran && n.parent >= 0 && (n.display_depth == depth_ || r_.ran_children(i).empty());
  }
  bool is_container(int i) const {
    const TreeNode& n = r_.nodes[i];
    return n.ran && (n.parent < 0 || (n.display_depth < depth_ && !r_.ran_children(i).empty()));
  }
  int unit_of_call(const Call& c) const { return is_leaf(c.node) ? c.node : -2 - c.node; }
  std::string key_of(int unit) const {
    if (unit <= -1000) return "in" + std::to_string(-1000 - unit);
    if (unit <= -2) return "out:" + r_.display_name(-2 - unit);
    return "m:" + r_.display_name(unit);
  }
  static int node_of(int unit) { return unit <= -1000 ? -1 : (unit <= -2 ? -2 - unit : unit); }

  // Which unit produced each output (by tensor and by grad_fn), the model's
  // inputs, and the containers whose output is their own (not a child's).
  void index_outputs() {
    // Containers first, then leaves: an output that a container returns from a
    // child belongs to the child.
    for (int pass = 0; pass < 2; ++pass) {
      for (const Call& c : r_.calls) {
        if (!(pass == 0 ? is_container(c.node) : is_leaf(c.node)) || !c.output.defined()) continue;
        by_impl_[c.output.unsafeGetTensorImpl()] = unit_of_call(c);
        if (c.output.grad_fn()) by_fn_[c.output.grad_fn().get()] = unit_of_call(c);
        call_of_[c.output.unsafeGetTensorImpl()] = &c;
        if (c.output.grad_fn()) call_of_[c.output.grad_fn().get()] = &c;
      }
    }
    for (const Call& c : r_.calls) {
      if (c.node == 0) root_call_ = &c;
    }
    if (root_call_ == nullptr) throw RuntimeError("module graph: the model's forward did not run through its hooks");
    for (size_t k = 0; k < root_call_->inputs.size(); ++k) {
      if (root_call_->inputs[k].defined())
        by_impl_[root_call_->inputs[k].unsafeGetTensorImpl()] = -1000 - static_cast<int>(k);
    }
    for (const Call& c : r_.calls) {
      if (is_container(c.node) && c.output.defined() && by_impl_.at(c.output.unsafeGetTensorImpl()) == -2 - c.node)
        own_output_.insert(c.node);
    }
  }

  // The units that produced `starts` (walking back through the plain ops),
  // else those that produced `fallback`.
  std::vector<int> producers(int consumer, const std::vector<at::Tensor>& starts, const Node* self,
                             const std::vector<at::Tensor>* fallback, const Call* call = nullptr) const {
    std::vector<int> found;
    // A leaf fed by another call of itself (a looped model's shared block:
    // the loop before): the unit feeds itself.
    auto earlier_call_of_self = [&](const void* key, int unit) {
      if (call == nullptr || unit != consumer) return false;
      auto it = call_of_.find(key);
      return it != call_of_.end() && it->second != call;
    };
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> todo;
    for (const at::Tensor& t : starts) {
      if (!t.defined()) continue;
      auto it = by_impl_.find(t.unsafeGetTensorImpl());
      if (it != by_impl_.end() && (it->second != consumer || earlier_call_of_self(t.unsafeGetTensorImpl(), it->second))) {
        found.push_back(it->second);
        continue;
      }
      if (t.grad_fn()) todo.push_back(t.grad_fn().get());
    }
    auto search = [&] {
      while (!todo.empty() && seen.size() < 100000) {
        const Node* n = todo.back();
        todo.pop_back();
        if (!seen.insert(n).second) continue;
        auto it = by_fn_.find(n);
        if (n != self && it != by_fn_.end() && (it->second != consumer || earlier_call_of_self(n, it->second))) {
          found.push_back(it->second);
          continue;
        }
        for (const auto& e : n->next_edges()) {
          if (e.function) todo.push_back(e.function.get());
        }
      }
    };
    search();
    // Inputs made from nothing a module produced (t_embedder.mlp.0's sinusoid
    // of t): drawn from what feeds the enclosing module instead.
    if (found.empty() && fallback != nullptr) {
      for (const at::Tensor& t : *fallback) {
        if (!t.defined()) continue;
        auto it = by_impl_.find(t.unsafeGetTensorImpl());
        if (it != by_impl_.end()) found.push_back(it->second);
        else if (t.grad_fn()) todo.push_back(t.grad_fn().get());
      }
      search();
    }
    return found;
  }

  void add_edges(int consumer, const std::vector<int>& found) {
    for (int p : found) {
      const int pn = node_of(p), cn = node_of(consumer);
      if (pn >= 0 && r_.hidden(pn) && cn >= 0 && r_.hidden(cn)) continue;  // drawn once, from the first member
      EdgeInfo& e = edges_[{key_of(p), key_of(consumer)}];
      if (p == consumer) ++e.again;
      // Between two members of one rolled group: the edge into the next block.
      if (pn >= 0 && cn >= 0) {
        const auto gp = r_.outer_group(pn), gc = r_.outer_group(cn);
        if (gp.first >= 0 && gp.first == gc.first && gp.second != gc.second) e.loop = true;
      }
    }
  }

  // Producers of each unit's inputs.
  void collect_edges() {
    for (size_t k = 0; k < r_.calls.size(); ++k) {
      const Call& c = r_.calls[k];
      const std::vector<at::Tensor>* outer = c.enclosing >= 0 ? &r_.calls[c.enclosing].inputs : nullptr;
      if (is_leaf(c.node)) {
        add_edges(c.node, producers(c.node, c.inputs, nullptr, outer, &c));
      } else if (own_output_.count(c.node)) {
        const Node* self = c.output.grad_fn() ? c.output.grad_fn().get() : nullptr;
        add_edges(-2 - c.node, producers(-2 - c.node, {c.output}, self, nullptr));
      }
    }
  }

  const Call* first_call(int node) const {
    for (const Call& c : r_.calls) {
      if (c.node == node) return &c;
    }
    return nullptr;
  }
  int calls_of(int node) const {
    int n = 0;
    for (const Call& c : r_.calls) n += c.node == node;
    return n;
  }

  // A child of the model that never runs but holds parameters (a looped
  // model's per-loop adapters and routers, read as weights): one box, and
  // from the adapters a dashed edge to each shared block they adapt (the
  // looped model's names, models/looped.h).
  void emit_weight_lists() {
    for (int c : r_.nodes[0].children) {
      const TreeNode& n = r_.nodes[c];
      const int64_t params = n.module->parameter_count();
      if (n.ran || !r_.ran_children(c).empty() || params == 0) continue;  // a list of blocks that ran is drawn
      std::string label = n.name + " (" + n.module->type_name() + ")";
      const auto& ch = n.children;
      if (!ch.empty() && r_.nodes[ch[0]].group >= 0) {
        const Group& g = r_.groups[r_.nodes[ch[0]].group];
        label += "\\n" + g.label + " ×" + std::to_string(g.count);
      }
      label += "\\nnot called: read as weights\\nparams " + count_text(params);
      out_ << "  " << id("w:" + n.name) << " [shape=folder, style=filled, fillcolor=\"#fbe7c6\", label=\""
           << dot_escape(label) << "\"];\n";
      auto shared = r_.index.find("shared");
      if (n.name != "adapters" || shared == r_.index.end()) continue;
      std::set<std::string> targets;
      for (int k : r_.nodes[shared->second].children)
        if (r_.nodes[k].ran) targets.insert("m:" + r_.display_name(r_.at_depth(k, depth_)));
      for (const auto& t : targets)
        out_ << "  " << id("w:" + n.name) << " -> " << id(t) << " [style=dashed, label=\"each loop's LoRA\"];\n";
    }
  }

  void emit_leaf(int i, const std::string& indent) {
    const Call* c = first_call(i);
    std::string label = r_.label_of(i);
    if (c && c->output.defined()) label += "\\n" + shape_text(c->output.sizes());
    const int64_t params = r_.nodes[i].module->parameter_count();
    if (params > 0) label += "\\nparams " + count_text(params);
    const int k = calls_of(i);
    if (k > 1) label += "\\napplied ×" + std::to_string(k);
    out_ << indent << id("m:" + r_.display_name(i))
         << " [shape=box, style=\"rounded,filled\", fillcolor=\"#dde8f5\", label=\"" << dot_escape(label) << "\"];\n";
  }

  void emit(int i, const std::string& indent) {
    const TreeNode& n = r_.nodes[i];
    if (r_.hidden(i)) return;
    if (is_leaf(i)) return emit_leaf(i, indent);
    const bool container = is_container(i);
    std::string inner = indent;
    if (container && n.parent >= 0) {
      out_ << indent << "subgraph cluster_" << i << " {\n"
           << indent << "  label=\"" << dot_escape(r_.label_of(i)) << "\"; style=rounded; color=\"#8899aa\";\n";
      inner += "  ";
    }
    if (container && own_output_.count(i)) {
      const Call* c = first_call(i);
      std::string label = n.parent < 0 ? "output" : "output of " + r_.display_name(i);
      if (c && c->output.defined()) label += "\\n" + shape_text(c->output.sizes());
      out_ << inner << id("out:" + r_.display_name(i))
           << " [shape=ellipse, style=filled, fillcolor=\"#f3f3f3\", label=\"" << dot_escape(label) << "\"];\n";
    }
    for (int ch : n.children) emit(ch, inner);
    if (container && n.parent >= 0) out_ << indent << "}\n";
  }

  const Recording& r_;
  const int depth_;
  std::unordered_map<const Node*, int> by_fn_;
  std::unordered_map<const c10::TensorImpl*, int> by_impl_;
  std::unordered_map<const void*, const Call*> call_of_;  // a leaf's output (tensor or grad_fn) -> its call
  const Call* root_call_ = nullptr;
  std::set<int> own_output_;
  std::map<std::pair<std::string, std::string>, EdgeInfo> edges_;
};

}  // namespace

std::string module_graph_dot(const nn::Module& model, const std::function<at::Tensor()>& forward,
                             const GraphOptions& o) {
  const Recording r(model, forward, o.roll_up);
  return ModuleGraph(r, std::max(o.depth, 1)).dot(o);
}

namespace {

// The autograd graph of one recording's loss: every backward node reachable
// from it, each drawn as itself, folded into its module's box (a module at
// the display depth) or into its group's box (a rolled member after the
// first), inside clusters along the module tree.
class AutogradGraph : DotText {
 public:
  AutogradGraph(const nn::Module& model, const Recording& r, const GraphOptions& o) : r_(r), o_(o) {
    const at::Tensor& loss = r_.result;
    if (!loss.defined() || !loss.grad_fn())
      throw RuntimeError("autograd graph: the loss has no grad_fn (do the parameters require grad?)");
    for (const auto& [name, t] : model.state()) {
      if (t.defined()) param_names_[t.unsafeGetTensorImpl()] = name;
    }
    collect_nodes();
    find_repeated();
    place_units();
    node_labels();
    box_labels();
  }

  std::string dot() {
    const at::Tensor& loss = r_.result;
    out_ << graph_header(o_);
    content(0);
    emit(0, "  ");
    for (const std::string& key : in_module_[-1]) out_ << "  " << id(key) << " " << labels_[key] << ";\n";
    std::set<std::pair<std::string, std::string>> edges;
    for (const auto& n : order_) {
      for (const auto& e : n->next_edges()) {
        if (!e.function) continue;
        const std::string& a = unit_[n.get()];
        const std::string& b = unit_[e.function.get()];
        if (a != b) edges.insert({a, b});
      }
    }
    for (const auto& [a, b] : edges) out_ << "  " << id(a) << " -> " << id(b) << ";\n";
    out_ << "  " << id("loss") << " [shape=ellipse, label=\"loss " << shape_text(loss.sizes()) << "\"];\n"
         << "  " << id("loss") << " -> " << id(unit_[loss.grad_fn().get()]) << ";\n";
    out_ << "}\n";
    return out_.str();
  }

 private:
  // Every backward node reachable from the loss.
  void collect_nodes() {
    std::unordered_set<const Node*> seen;
    std::vector<std::shared_ptr<Node>> todo{r_.result.grad_fn()};
    while (!todo.empty()) {
      auto n = todo.back();
      todo.pop_back();
      if (!seen.insert(n.get()).second) continue;
      order_.push_back(n);
      for (const auto& e : n->next_edges()) {
        if (e.function) todo.push_back(e.function);
      }
    }
  }

  // A module called more than once (a looped model's shared block, once a
  // loop): the nodes made from the end of its first call to the end of its
  // last (the later calls and what runs between them: the next loop's
  // merged weights, its conditioning) are drawn as one box. The module, or
  // -1 (a parameter's accumulator: -1 too).
  int later_call_of(const Node* n) const {
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(n) != nullptr) return -1;
    const uint64_t seq = n->sequence_nr();
    for (const auto& [module, r] : repeated_)
      if (seq >= r.first && seq < r.second) return module;
    return -1;
  }
  // The modules called more than once, with [end of first call, end of last).
  void find_repeated() {
    std::map<int, std::pair<uint64_t, uint64_t>> range;
    std::map<int, int> count;
    for (const Call& c : r_.calls) {
      auto [it, fresh] = range.emplace(c.node, std::make_pair(c.seq_end, c.seq_end));
      if (!fresh) it->second.second = c.seq_end;
      ++count[c.node];
    }
    for (const auto& [module, r] : range)
      if (count[module] > 1 && r_.nodes[module].parent >= 0) repeated_.emplace_back(module, r);
  }

  // The module that made each node: the deepest call whose sequence range
  // holds its number; a parameter's accumulator belongs to its module.
  int owner_of(const Node* n) const {
    if (auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n)) {
      auto it = param_names_.find(acc->variable.unsafeGetTensorImpl());
      if (it == param_names_.end()) return 0;
      std::string prefix = it->second;
      while (true) {
        const size_t dot = prefix.rfind('.');
        if (dot == std::string::npos) return 0;
        prefix = prefix.substr(0, dot);
        auto m = r_.index.find(prefix);
        if (m != r_.index.end()) return m->second;
      }
    }
    const uint64_t seq = n->sequence_nr();
    int best = 0;
    size_t best_depth = 0;
    for (const Call& c : r_.calls) {
      if (seq < c.seq_begin || seq >= c.seq_end) continue;
      size_t d = 0;
      for (int k = c.node; k > 0; k = r_.nodes[k].parent) ++d;
      if (d >= best_depth) {
        best = c.node;
        best_depth = d;
      }
    }
    return best;
  }

  // What each node is drawn as: itself ("a<k>"), its module's box when the
  // module is deeper than depth ("m:<name>"), or its group's box when it
  // belongs to a rolled member after the first ("g:<group>").
  void place_units() {
    std::set<std::string> placed;
    for (size_t k = 0; k < order_.size(); ++k) {
      const Node* n = order_[k].get();
      int m = owner_of(n);
      // A parameter of a module that never runs itself (the patch conv's
      // "proj") belongs to the nearest one that does; one of a rolled list's
      // later member (a looped model's adapters of loops 1..) to the list.
      if (!r_.hidden(m))
        while (r_.nodes[m].parent >= 0 && !r_.nodes[m].ran) m = r_.nodes[m].parent;
      std::string key;
      const auto g = r_.outer_group(m);
      const int again = o_.roll_up ? later_call_of(n) : -1;
      if (again >= 0) {
        key = "r:" + std::to_string(again);  // drawn beside the module's first call
        m = r_.nodes[again].parent;
        repeat_module_[key] = again;
      } else if (r_.hidden(m)) {
        key = "g:" + std::to_string(g.first);
        m = -1;  // drawn beside the group's first member
      } else if (r_.nodes[m].display_depth >= o_.depth) {  // a module at the depth is one box
        m = r_.at_depth(m, o_.depth);
        key = "m:" + r_.display_name(m);
        box_module_[key] = m;
      } else {
        key = "a" + std::to_string(k);
      }
      unit_[n] = key;
      ++box_nodes_[key];
      if (placed.insert(key).second) in_module_[m].push_back(key);
    }
  }

  // The nodes drawn as themselves: their name, a parameter's name and shape,
  // with o.saved what each saved.
  void node_labels() {
    for (size_t k = 0; k < order_.size(); ++k) {
      const Node* n = order_[k].get();
      const std::string& key = unit_[n];
      if (key[0] != 'a') continue;
      std::string label = n->name(), style = "shape=box, style=filled, fillcolor=\"#f3f3f3\"";
      if (auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n)) {
        auto it = param_names_.find(acc->variable.unsafeGetTensorImpl());
        label = (it != param_names_.end() ? it->second : std::string("(tensor)")) + "\\n" +
                shape_text(acc->variable.sizes());
        style = "shape=box, style=filled, fillcolor=\"#cfe3c8\"";
      } else if (o_.saved) {
        auto saved = saved_tensors(order_[k]);
        if (!saved) label += "\\n(saved: not listed)";
        else {
          for (const at::Tensor& t : *saved) {
            if (t.defined()) label += "\\nsaved " + shape_text(t.sizes());
          }
        }
      }
      labels_[key] = "[" + style + ", label=\"" + dot_escape(label) + "\"]";
    }
  }

  // The module and group boxes: what they stand for and how many nodes.
  void box_labels() {
    for (const auto& [key, count] : box_nodes_) {
      if (key[0] == 'm') {
        const int m = box_module_.at(key);
        labels_[key] = "[shape=box3d, style=filled, fillcolor=\"#dde8f5\", label=\"" +
                       dot_escape(r_.label_of(m) + "\\n" + std::to_string(count) + " backward nodes") + "\"]";
      } else if (key[0] == 'r') {
        const int m = repeat_module_.at(key);
        int calls = 0;
        for (const Call& c : r_.calls) calls += c.node == m;
        labels_[key] = "[shape=box3d, style=filled, fillcolor=\"#fbe7c6\", label=\"" +
                       dot_escape(r_.display_name(m) + " applied ×" + std::to_string(calls - 1) + " more (calls 2.." +
                                  std::to_string(calls) + ", with what runs between them)\\n" +
                                  std::to_string(count) + " backward nodes, not drawn") +
                       "\"]";
      } else if (key[0] == 'g') {
        const Group& gr = r_.groups[std::stoi(key.substr(2))];
        const std::string first = gr.label.substr(0, gr.label.find(".."));  // "blocks.0"
        labels_[key] = "[shape=box3d, style=filled, fillcolor=\"#fbe7c6\", label=\"" +
                       dot_escape(std::to_string(gr.count - 1) + " more like " + first + " (" + gr.label + " x" +
                                  std::to_string(gr.count) + ")\\n" + std::to_string(count) +
                                  " backward nodes, not drawn") +
                       "\"]";
      }
    }
  }

  // Whether module i or one below it owns a unit.
  bool content(int i) {
    bool any = in_module_.count(i) > 0;
    for (int c : r_.nodes[i].children) any = content(c) || any;
    return has_content_[i] = any;
  }

  // Clusters along the module tree, around the units each module owns.
  void emit(int i, const std::string& indent) {
    if (!has_content_[i]) return;
    const TreeNode& n = r_.nodes[i];
    bool boxed = false;  // drawn as one box: no cluster around it
    for (const auto& [key, m] : box_module_) boxed = boxed || m == i;
    const bool cluster = n.parent >= 0 && n.ran && !boxed;
    std::string inner = indent;
    if (cluster) {
      out_ << indent << "subgraph cluster_" << i << " {\n"
           << indent << "  label=\"" << dot_escape(r_.label_of(i)) << "\"; style=rounded; color=\"#8899aa\";\n";
      inner += "  ";
    }
    for (const std::string& key : in_module_[i]) out_ << inner << id(key) << " " << labels_[key] << ";\n";
    for (int c : n.children) emit(c, inner);
    if (cluster) out_ << indent << "}\n";
  }

  const Recording& r_;
  const GraphOptions& o_;
  std::unordered_map<const c10::TensorImpl*, std::string> param_names_;
  std::vector<std::shared_ptr<Node>> order_;
  std::unordered_map<const Node*, std::string> unit_;
  std::map<std::string, int> box_nodes_;               // box key -> nodes folded into it
  std::map<std::string, int> box_module_;              // "m:" box key -> its tree node
  std::map<std::string, int> repeat_module_;           // "r:" box key -> the module called again
  std::vector<std::pair<int, std::pair<uint64_t, uint64_t>>> repeated_;  // find_repeated()
  std::map<int, std::vector<std::string>> in_module_;  // tree node -> units drawn inside it
  std::map<std::string, std::string> labels_;
  std::map<int, bool> has_content_;
};

}  // namespace

std::string autograd_graph_dot(const nn::Module& model, const std::function<at::Tensor()>& forward,
                               const GraphOptions& o) {
  const Recording r(model, forward, o.roll_up);
  return AutogradGraph(model, r, o).dot();
}

bool have_graphviz() { return std::system("command -v dot >/dev/null 2>&1") == 0; }

void write_graph(const std::string& dot_text, const std::string& path, const std::string& format) {
  if (format == "dot") {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw RuntimeError("cannot write " + path);
    const bool ok = std::fwrite(dot_text.data(), 1, dot_text.size(), f) == dot_text.size();
    if (std::fclose(f) != 0 || !ok) throw RuntimeError("cannot write " + path);
    return;
  }
  if (format != "svg" && format != "png") throw UsageError("--format: '" + format + "' is not one of dot, svg, png");
  if (!have_graphviz())
    throw RuntimeError("--format " + format + " needs Graphviz's dot (apt-get install graphviz); --format dot writes the DOT text");
  std::string quoted = "'";
  for (char c : path) quoted += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = "dot -T" + format + " -o " + quoted;
  FILE* p = popen(cmd.c_str(), "w");
  if (!p) throw RuntimeError("cannot run " + cmd);
  std::fwrite(dot_text.data(), 1, dot_text.size(), p);
  const int rc = pclose(p);
  if (rc != 0) throw RuntimeError("dot failed (exit status " + std::to_string(rc) + ") writing " + path);
}

}  // namespace perftrain::models::views
