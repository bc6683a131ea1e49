#include "models/views/module_summary.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_set>

#include "base/error.h"
#include "models/block_weights.h"
#include "models/dit.h"
#include "models/single_stream.h"
#include "nn/attention.h"

namespace perftrain::models::views {
namespace {

struct Node {
  const nn::Module* module;
  std::string name;
  int depth;
  int parent;  // index, -1 for the model
  std::vector<int> children;
};

struct CallRecord {
  int64_t calls = 0;
  std::vector<int64_t> output_shape;
  double output_elements = 0;  // summed over calls
  double attention_mult_adds = 0;
  double block_mult_adds = 0;  // summed over calls, from the block's shapes (block_call_mult_adds)
};

double rows_times_columns(const at::Tensor& w) { return static_cast<double>(w.size(0)) * static_cast<double>(w.size(1)); }

// One call of a DiT or single-stream block on x [B, S, D]: its token-wise
// linears on every token, its modulation once per sample, attention's two
// [S, S] products; 0 for another module.
double block_call_mult_adds(const nn::Module& m, at::TensorList in) {
  if (in.empty() || !in[0].defined() || in[0].dim() != 3) return 0;
  const double B = in[0].size(0), S = in[0].size(1), D = in[0].size(2);
  const double attention = 2 * B * S * S * D;
  if (const auto* b = dynamic_cast<const DiTBlock*>(&m)) {
    const DiTBlockWeights w = weights_of(*b);
    return B * S * (rows_times_columns(w.qkv_w) + rows_times_columns(w.proj_w) + rows_times_columns(w.fc1_w) +
                    rows_times_columns(w.fc2_w)) +
           B * rows_times_columns(w.ada_w) + attention;
  }
  if (const auto* b = dynamic_cast<const SingleStreamBlock*>(&m)) {
    const SingleStreamBlockWeights w = weights_of(*b);
    return B * S * (rows_times_columns(w.qkv_w) + rows_times_columns(w.proj_w) + rows_times_columns(w.gate_w) +
                    rows_times_columns(w.up_w) + rows_times_columns(w.down_w)) +
           B * rows_times_columns(w.ada_w) + attention;
  }
  return 0;
}

// The last name component; a rolled range ("adapters.0..7") is one.
std::string leaf_of(const std::string& name) {
  for (size_t p = name.size(); p-- > 0;) {
    if (name[p] != '.') continue;
    if ((p > 0 && name[p - 1] == '.') || (p + 1 < name.size() && name[p + 1] == '.')) continue;
    return name.substr(p + 1);
  }
  return name;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// A module's structure: type, own tensors' shapes, children's structures.
std::string signature(const std::vector<Node>& nodes, int i) {
  std::string s = nodes[i].module->type_name() + "(";
  for (const auto& [n, t, trainable] : nodes[i].module->own_tensors()) {
    s += n + "[";
    if (t.defined())
      for (int64_t d : t.sizes()) s += std::to_string(d) + ",";
    s += "];";
  }
  for (int c : nodes[i].children) s += leaf_of(nodes[c].name) + ":" + signature(nodes, c) + ";";
  return s + ")";
}

void walk(const nn::Module& m, const std::string& name, int depth, int parent, std::vector<Node>& out) {
  const int index = static_cast<int>(out.size());
  out.push_back({&m, name, depth, parent, {}});
  if (parent >= 0) out[parent].children.push_back(index);
  for (const auto& [child_name, child] : m.named_children())
    walk(*child, name.empty() ? child_name : name + "." + child_name, depth + 1, index, out);
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string shape_text(const std::vector<int64_t>& shape, const char* sep) {
  if (shape.empty()) return "";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? sep : "") + std::to_string(shape[i]);
  return s;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// "[2, 256, 192]", with " ×8" for a module applied 8 times; "--" when it never ran.
std::string shape_cell(const SummaryRow& r) {
  const std::string shape = r.output_shape.empty() ? "--" : "[" + shape_text(r.output_shape, ", ") + "]";
  return r.calls > 1 ? shape + " ×" + std::to_string(r.calls) : shape;
}

std::string params_cell(const SummaryRow& r) {
  if (r.params == 0 && r.shared_params > 0) return "(shared)";
  if (r.params == 0) return "--";
  return with_commas(r.params);
}

// v divided by `base` while it reaches it (up to the last unit), with its
// unit: whole in the first unit, two decimals after.
template <size_t N>
std::string with_unit(double v, double base, const char* const (&units)[N]) {
  size_t u = 0;
  while (v >= base && u + 1 < N) {
    v /= base;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.2f%s", v, units[u]);
  return buf;
}

std::string bytes_text(double b) {
  static const char* const units[] = {" B", " KiB", " MiB", " GiB", " TiB"};
  return with_unit(b, 1024, units);
}

// Whether each node or one below it ran.
std::vector<bool> subtree_ran(const std::vector<Node>& nodes, const std::map<std::string, CallRecord>& calls) {
  std::vector<bool> ran(nodes.size(), false);
  for (size_t k = nodes.size(); k-- > 0;) {
    if (calls.count(nodes[k].name)) ran[k] = true;
    if (ran[k] && nodes[k].parent >= 0) ran[static_cast<size_t>(nodes[k].parent)] = true;
  }
  return ran;
}

// The subtree of node i in the walk: i and the next size - 1 nodes.
size_t subtree_size(const std::vector<Node>& nodes, int i) {
  size_t n = 1;
  for (int c : nodes[i].children) n += subtree_size(nodes, c);
  return n;
}

// Consecutive index-named children of one structure, none of which ran:
// their rows' own numbers go to the first member's rows (the same offsets
// in the walk, as the structures are equal), which stand for all of them
// (repeat, the name "list.0..7"); the others' rows are removed.
void roll_up_unrun_lists(const std::vector<Node>& nodes, const std::vector<bool>& ran, std::vector<SummaryRow>& rows,
                         std::vector<bool>& removed) {
  for (const Node& parent : nodes) {
    const auto& ch = parent.children;
    for (size_t a = 0, b; a < ch.size(); a = b) {
      b = a + 1;
      if (ran[ch[a]] || !is_index(leaf_of(nodes[ch[a]].name))) continue;
      const std::string sig = signature(nodes, ch[a]);
      while (b < ch.size() && !ran[ch[b]] && is_index(leaf_of(nodes[ch[b]].name)) && signature(nodes, ch[b]) == sig) ++b;
      if (b - a < 2) continue;
      const size_t first = static_cast<size_t>(ch[a]), size = subtree_size(nodes, ch[a]);
      for (size_t m = a + 1; m < b; ++m)
        for (size_t o = 0; o < size; ++o) {
          SummaryRow &to = rows[first + o], &from = rows[static_cast<size_t>(ch[m]) + o];
          to.params += from.params, to.trainable_params += from.trainable_params, to.shared_params += from.shared_params;
          from.params = from.trainable_params = from.shared_params = 0;
          removed[static_cast<size_t>(ch[m]) + o] = true;
        }
      // The rows' names (an enclosing list may have renamed them already).
      const std::string old_name = rows[first].name;
      const std::string new_name = old_name + ".." + leaf_of(rows[static_cast<size_t>(ch[b - 1])].name);
      for (size_t o = 0; o < size; ++o) {
        rows[first + o].repeat = static_cast<int64_t>(b - a);
        rows[first + o].name = new_name + rows[first + o].name.substr(old_name.size());
      }
    }
  }
}

}  // namespace

std::string SummaryRow::trainable() const {
  if (params == 0) return "";
  if (trainable_params == params) return "yes";
  if (trainable_params == 0) return "no";
  return "partial";
}

std::string si_count(double n) {
  static const char* const units[] = {"", " k", " M", " G", " T", " P"};
  return with_unit(n, 1000, units);
}

ModuleSummary summarize_module(const nn::Module& model, const std::function<void()>& forward) {
  std::vector<Node> nodes;
  walk(model, "", 0, -1, nodes);
  std::map<std::string, CallRecord> calls;
  {
    auto handle = model.add_forward_hook(
        [&calls](const std::string& name, const nn::Module& m, at::TensorList in, at::TensorList out) {
          CallRecord& r = calls[name];
          if (r.calls++ == 0 && !out.empty() && out[0].defined()) r.output_shape = out[0].sizes().vec();
          if (!out.empty() && out[0].defined()) r.output_elements += static_cast<double>(out[0].numel());
          r.block_mult_adds += block_call_mult_adds(m, in);
          const bool attention = dynamic_cast<const nn::SelfAttention*>(&m) != nullptr ||
                                 dynamic_cast<const models::SingleStreamAttention*>(&m) != nullptr;
          if (attention && !in.empty() && in[0].dim() == 3) {
            // softmax(q k^T) v: two [T, T] x [T, D/heads] products per head.
            const double B = in[0].size(0), T = in[0].size(1), D = in[0].size(2);
            r.attention_mult_adds += 2 * B * T * T * D;
          }
        });
    forward();
  }

  ModuleSummary s;
  s.rows.resize(nodes.size());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t i = 0; i < nodes.size(); ++i) {
    SummaryRow& r = s.rows[i];
    r.name = nodes[i].name;
    r.type = nodes[i].module->type_name();
    r.depth = nodes[i].depth;
    auto it = calls.find(r.name);
    if (it != calls.end()) {
      r.calls = it->second.calls;
      r.output_shape = it->second.output_shape;
    }
    for (const auto& [tname, t, trainable] : nodes[i].module->own_tensors()) {
      if (!t.defined()) continue;
      if (!seen.insert(t.unsafeGetTensorImpl()).second) {
        r.shared_params += t.numel();
        continue;
      }
      r.params += t.numel();
      if (trainable) r.trainable_params += t.numel();
      s.param_bytes += static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
    }
  }
  // Own mult-adds of each module that ran: its weights and those of
  // descendants that did not run themselves (the patch conv's "proj"); a
  // block none of whose descendants ran: from its shapes.
  std::function<void(int, const CallRecord&, double&)> weights_of = [&](int i, const CallRecord& rec, double& macs) {
    const int64_t out_last = rec.output_shape.empty() ? -1 : rec.output_shape.back();
    for (const auto& [tname, t, trainable] : nodes[i].module->own_tensors()) {
      if (t.defined() && t.dim() >= 2 && t.size(0) == out_last)
        macs += rec.output_elements * static_cast<double>(t.numel() / t.size(0));
    }
    for (int c : nodes[i].children) {
      if (calls.count(nodes[c].name) == 0) weights_of(c, rec, macs);
    }
  };
  const std::vector<bool> ran = subtree_ran(nodes, calls);
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto it = calls.find(nodes[i].name);
    if (it == calls.end()) continue;
    bool descendant_ran = false;
    for (int c : nodes[i].children) descendant_ran = descendant_ran || ran[c];
    double macs = it->second.attention_mult_adds;
    if (it->second.block_mult_adds > 0 && !descendant_ran) macs = it->second.block_mult_adds;
    else weights_of(static_cast<int>(i), it->second, macs);
    s.rows[i].mult_adds = macs;
  }
  std::vector<bool> removed(nodes.size(), false);
  roll_up_unrun_lists(nodes, ran, s.rows, removed);
  // Subtree sums, children after parents in the walk: add up from the end.
  for (size_t k = nodes.size(); k-- > 1;) {
    SummaryRow& r = s.rows[k];
    SummaryRow& p = s.rows[nodes[k].parent];
    p.params += r.params;
    p.trainable_params += r.trainable_params;
    p.shared_params += r.shared_params;
    p.mult_adds += r.mult_adds;
  }
  s.total_params = s.rows[0].params;
  s.trainable_params = s.rows[0].trainable_params;
  s.total_mult_adds = s.rows[0].mult_adds;
  std::vector<SummaryRow> kept;
  for (size_t i = 0; i < s.rows.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(s.rows[i]));
  s.rows = std::move(kept);
  return s;
}

std::string format_summary(const ModuleSummary& s, const std::string& format, int max_depth) {
  std::vector<const SummaryRow*> rows;
  for (const SummaryRow& r : s.rows) {
    if (r.depth <= max_depth) rows.push_back(&r);
  }
  std::ostringstream o;
  const int64_t non_trainable = s.total_params - s.trainable_params;
  if (format == "table") {
    // Tree prefixes: for each row, whether each ancestor level has a later sibling.
    std::vector<std::string> labels(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const SummaryRow& r = *rows[i];
      std::string prefix;
      for (int level = 1; level <= r.depth; ++level) {
        // Is there a later row at this level before one shallower than it?
        bool more = false;
        for (size_t j = i + 1; j < rows.size() && rows[j]->depth >= level; ++j) {
          if (rows[j]->depth == level) {
            more = true;
            break;
          }
        }
        if (level == r.depth) prefix += more ? "├─" : "└─";
        else prefix += more ? "│ " : "  ";
      }
      const std::string times = r.repeat > 1 ? " ×" + std::to_string(r.repeat) : "";
      labels[i] = prefix + (r.depth == 0 ? r.type : leaf_of(r.name) + " (" + r.type + ")" + times);
    }
    size_t w0 = 12, w1 = 12;
    auto display_width = [](const std::string& u) {  // UTF-8 code points
      size_t n = 0;
      for (unsigned char c : u) n += (c & 0xC0) != 0x80;
      return n;
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      w0 = std::max(w0, display_width(labels[i]));
      w1 = std::max(w1, display_width(shape_cell(*rows[i])) + 2);
    }
    auto pad = [&](const std::string& u, size_t w) { return u + std::string(w > display_width(u) ? w - display_width(u) : 0, ' '); };
    const std::string rule(w0 + w1 + 48, '=');
    if (!s.title.empty()) o << s.title << "\n";
    o << rule << "\n"
      << pad("Layer (type)", w0 + 2) << pad("Output Shape", w1 + 2) << pad("Param #", 16) << pad("Trainable", 12)
      << "Mult-Adds\n"
      << rule << "\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const SummaryRow& r = *rows[i];
      o << pad(labels[i], w0 + 2) << pad(shape_cell(r), w1 + 2) << pad(params_cell(r), 16)
        << pad(r.trainable().empty() ? "--" : r.trainable(), 12) << (r.mult_adds > 0 ? si_count(r.mult_adds) : "--")
        << "\n";
    }
    o << rule << "\n"
      << "Total params: " << with_commas(s.total_params) << " (" << si_count(static_cast<double>(s.total_params))
      << ")\n"
      << "Trainable params: " << with_commas(s.trainable_params) << "\n"
      << "Non-trainable params: " << with_commas(non_trainable) << "\n"
      << "Total mult-adds (one forward): " << si_count(s.total_mult_adds) << "\n"
      << "Params size: " << bytes_text(s.param_bytes) << "\n";
    if (!s.memory.empty()) {
      o << rule << "\n" << "Training memory estimate" << (s.memory_note.empty() ? "" : " (" + s.memory_note + ")") << ":\n";
      for (const auto& [what, bytes] : s.memory) o << "  " << pad(what + ":", 24) << bytes_text(bytes) << "\n";
    }
    o << rule << "\n";
  } else if (format == "md") {
    if (!s.title.empty()) o << "### " << s.title << "\n\n";
    o << "| module | type | output shape | params | trainable | mult-adds |\n|---|---|---|--:|---|--:|\n";
    for (const SummaryRow* r : rows) {
      std::string name = r->depth == 0 ? "(model)" : "`" + r->name + "`";
      const std::string shape = shape_cell(*r);
      if (r->repeat > 1) name += " ×" + std::to_string(r->repeat);
      o << "| " << name << " | " << r->type << " | " << shape << " | " << params_cell(*r) << " | "
        << (r->trainable().empty() ? "--" : r->trainable()) << " | " << (r->mult_adds > 0 ? si_count(r->mult_adds) : "--")
        << " |\n";
    }
    o << "\n- total params: " << with_commas(s.total_params) << " (trainable " << with_commas(s.trainable_params)
      << ", non-trainable " << with_commas(non_trainable) << ")\n"
      << "- total mult-adds (one forward): " << si_count(s.total_mult_adds) << "\n"
      << "- params size: " << bytes_text(s.param_bytes) << "\n";
    if (!s.memory.empty()) {
      o << "- training memory estimate" << (s.memory_note.empty() ? "" : " (" + s.memory_note + ")") << ":\n";
      for (const auto& [what, bytes] : s.memory) o << "  - " << what << ": " << bytes_text(bytes) << "\n";
    }
  } else if (format == "csv") {
    o << "name,type,depth,output_shape,calls,params,trainable_params,shared_params,trainable,mult_adds\n";
    for (const SummaryRow* r : rows) {
      char macs[40];
      std::snprintf(macs, sizeof macs, "%.0f", r->mult_adds);
      o << csv_field(r->name) << "," << csv_field(r->type) << "," << r->depth << "," << shape_text(r->output_shape, "x")
        << "," << r->calls << "," << r->params << "," << r->trainable_params << "," << r->shared_params << ","
        << r->trainable() << "," << macs << "\n";
    }
  } else if (format == "json") {
    char buf[64];
    o << "{\n  \"title\": " << json_string(s.title) << ",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const SummaryRow& r = *rows[i];
      std::snprintf(buf, sizeof buf, "%.0f", r.mult_adds);
      o << "    {\"name\": " << json_string(r.name) << ", \"type\": " << json_string(r.type) << ", \"depth\": " << r.depth
        << ", \"output_shape\": [" << shape_text(r.output_shape, ", ") << "], \"calls\": " << r.calls
        << ", \"params\": " << r.params << ", \"trainable_params\": " << r.trainable_params
        << ", \"shared_params\": " << r.shared_params << ", \"repeat\": " << r.repeat << ", \"mult_adds\": " << buf << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    std::snprintf(buf, sizeof buf, "%.0f", s.total_mult_adds);
    o << "  ],\n  \"total_params\": " << s.total_params << ",\n  \"trainable_params\": " << s.trainable_params
      << ",\n  \"total_mult_adds\": " << buf;
    std::snprintf(buf, sizeof buf, "%.0f", s.param_bytes);
    o << ",\n  \"param_bytes\": " << buf;
    if (!s.memory.empty()) {
      o << ",\n  \"memory_note\": " << json_string(s.memory_note) << ",\n  \"training_memory_bytes\": {";
      for (size_t i = 0; i < s.memory.size(); ++i) {
        std::snprintf(buf, sizeof buf, "%.0f", s.memory[i].second);
        o << (i ? ", " : "") << json_string(s.memory[i].first) << ": " << buf;
      }
      o << "}";
    }
    o << "\n}\n";
  } else {
    throw UsageError("--format: '" + format + "' is not one of table, csv, json, md");
  }
  return o.str();
}

}  // namespace perftrain::models::views
