#include "models/looped_convert.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/linalg_svd.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace perftrain::models {
namespace {

using TensorMap = std::map<std::string, at::Tensor>;

std::string block_name(const char* list, int64_t i, const std::string& rest) {
  return std::string(list) + "." + std::to_string(i) + "." + rest;
}

const at::Tensor& source_tensor(const TensorMap& src, const std::string& name) {
  auto it = src.find(name);
  if (it == src.end()) throw RuntimeError("convert --to looped: the source weights have no tensor " + name);
  return it->second;
}

// -1 for "mean", i for "layer:<i>"; UsageError otherwise.
int64_t shared_layer(const std::string& shared) {
  if (shared == "mean") return -1;
  const std::string digits = shared.rfind("layer:", 0) == 0 ? shared.substr(6) : "";
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError("--shared: '" + shared + "' is not mean or layer:<i> (a block index)");
  return std::stoll(digits);
}

// The source block that loop l's group position k replaces.
int64_t loop_layer(const DiTConfig& looped, int64_t l, int64_t k) { return looped.prelude + l * looped.shared_group + k; }

// Every block's tensors by their name in the block, from block 0's names.
std::vector<std::string> block_tensor_names(const nn::NamedTensors& source) {
  std::vector<std::string> names;
  const std::string prefix = "blocks.0.";
  for (const auto& [name, t] : source)
    if (name.rfind(prefix, 0) == 0) names.push_back(name.substr(prefix.size()));
  return names;
}

// The shared value of tensor `rest` at group position k, in float64.
at::Tensor shared_value(const TensorMap& src, const DiTConfig& looped, int64_t layer, int64_t k,
                        const std::string& rest) {
  if (layer >= 0) return source_tensor(src, block_name("blocks", layer + k, rest)).to(at::kDouble);
  std::vector<at::Tensor> parts;
  for (int64_t l = 0; l < looped.loops; ++l)
    parts.push_back(source_tensor(src, block_name("blocks", loop_layer(looped, l, k), rest)).to(at::kDouble));
  return at::stack(parts).mean(0);
}

double relative(const at::Tensor& original, const at::Tensor& approx) {
  const at::Tensor o = original.to(at::kDouble), d = o - approx.to(at::kDouble);
  const double n = o.norm().item<double>();
  return n > 0 ? d.norm().item<double>() / n : d.norm().item<double>();
}

// lora_B [out, r], lora_A [r, in] with scale * B A the rank-r truncation of
// diff (float64); components beyond min(out, in) are zero.
std::pair<at::Tensor, at::Tensor> low_rank_factors(const at::Tensor& diff, int64_t rank, double scale) {
  auto [U, S, Vh] = at::linalg_svd(diff, /*full_matrices=*/false);
  const int64_t n = std::min<int64_t>(rank, S.size(0));
  const at::Tensor root = S.narrow(0, 0, n).sqrt() / std::sqrt(scale);
  at::Tensor B = at::zeros({diff.size(0), rank}, diff.options()), A = at::zeros({rank, diff.size(1)}, diff.options());
  B.narrow(1, 0, n).copy_(U.narrow(1, 0, n) * root.unsqueeze(0));
  A.narrow(0, 0, n).copy_(root.unsqueeze(1) * Vh.narrow(0, 0, n));
  return {B, A};
}

struct Target {
  std::string path;  // "attn.qkv"
  bool has_bias;
};

// The adapters of loop l at group position k (their state, their errors).
void convert_adapters(const TensorMap& src, const TensorMap& shared_k, const DiTConfig& looped, int64_t l, int64_t k,
                      const std::vector<Target>& targets, LoopedConversion& out) {
  const double scale = looped.lora_alpha / static_cast<double>(looped.lora_rank);
  const int64_t layer = loop_layer(looped, l, k);
  const std::string prefix = "adapters." + std::to_string(l) + "." + std::to_string(k) + ".";
  for (const Target& t : targets) {
    const at::Tensor& W = source_tensor(src, block_name("blocks", layer, t.path + ".weight"));
    const at::Tensor& Ws = shared_k.at(t.path + ".weight");
    auto [B, A] = low_rank_factors(W.to(at::kDouble) - Ws.to(at::kDouble), looped.lora_rank, scale);
    B = B.to(W.scalar_type()), A = A.to(W.scalar_type());
    out.state.emplace_back(prefix + t.path + ".lora_A", A);
    out.state.emplace_back(prefix + t.path + ".lora_B", B);
    // As LoRAAdapter::merged computes it: in the weights' dtype.
    out.errors.push_back({layer, l, t.path, true, relative(W, at::addmm(Ws, B, A, 1.0, scale))});
    if (!t.has_bias) continue;
    const at::Tensor& b = source_tensor(src, block_name("blocks", layer, t.path + ".bias"));
    if (looped.lora_bias) out.state.emplace_back(prefix + t.path + ".bias", (b - shared_k.at(t.path + ".bias")));
    else out.errors.push_back({layer, l, t.path + ".bias", false, relative(b, shared_k.at(t.path + ".bias"))});
  }
}

// The tensors of a loop's layer that no adapter carries: their loss.
void lost_differences(const TensorMap& src, const TensorMap& shared_k, const DiTConfig& looped, int64_t l, int64_t k,
                      const std::set<std::string>& carried, LoopedConversion& out) {
  const int64_t layer = loop_layer(looped, l, k);
  for (const auto& [rest, value] : shared_k) {
    if (carried.count(rest)) continue;
    out.errors.push_back({layer, l, rest, false, relative(source_tensor(src, block_name("blocks", layer, rest)), value)});
  }
}

std::vector<Target> targets_of(const DiTConfig& looped, const std::vector<std::string>& names) {
  std::vector<Target> out;
  if (looped.lora_rank == 0) return out;
  const std::set<std::string> all(names.begin(), names.end());
  for (const LinearShape& l : looped.lora_linears()) out.push_back({l.path, all.count(l.path + ".bias") > 0});
  return out;
}

void add_notes(const DiTConfig& looped, const std::vector<Target>& targets, const std::vector<std::string>& lost,
               LoopedConversion& out) {
  const int64_t full = looped.hidden;  // min(out, in) of every block linear
  if (!targets.empty() && looped.lora_rank < full)
    out.notes.push_back("model.lora_rank " + std::to_string(looped.lora_rank) + " < " + std::to_string(full) +
                        " (full rank): each adapter is a truncated SVD, the errors above are what it drops");
  std::string lost_list;
  for (const auto& n : lost) lost_list += (lost_list.empty() ? "" : ", ") + n;
  if (!lost_list.empty())
    out.notes.push_back("without adapter (" + std::string(looped.lora_rank == 0 ? "model.lora_rank 0" : "not in model.lora_targets") +
                        "; every loop uses the shared value, its per-layer difference is lost; model.lora_targets attn,mlp,adaln "
                        "with model.lora_bias carries every linear): " + lost_list);
  if (looped.reinject == "add")
    out.notes.push_back("model.reinject add changes every loop's input (h + e): the converted model is not the DiT's function");
  if (looped.routing())
    out.notes.push_back("routing (model.route_capacity < 1) skips tokens in the loops: the converted model is not the DiT's function");
}

}  // namespace

void check_looped_conversion(const DiTConfig& source, const DiTConfig& looped, const std::string& shared) {
  if (source.looped()) throw UsageError("convert --to looped: the source " + source.name + " is already looped");
  if (!looped.looped()) throw UsageError("convert --to looped: model.family must be looped, got " + looped.family);
  const std::string kind = source.single_stream() ? "single_stream" : "dit";
  if (looped.loop_block != kind)
    throw UsageError("model.loop_block: must be " + kind + " to convert " + source.name + ", got " + looped.loop_block);
  if (looped.hidden != source.hidden || looped.heads != source.heads || looped.patch != source.patch ||
      looped.mlp_ratio != source.mlp_ratio)
    throw UsageError("model.hidden/heads/patch/mlp_ratio: a converted model keeps " + source.name + "'s");
  if (looped.looped_depth() != source.depth)
    throw UsageError("model.prelude + model.shared_group * model.loops + model.coda = " +
                     std::to_string(looped.prelude) + " + " + std::to_string(looped.shared_group) + " * " +
                     std::to_string(looped.loops) + " + " + std::to_string(looped.coda) + " = " +
                     std::to_string(looped.looped_depth()) + ", but " + source.name + " has depth " +
                     std::to_string(source.depth));
  const int64_t layer = shared_layer(shared);
  if (layer >= 0 && layer + looped.shared_group > source.depth)
    throw UsageError("--shared " + shared + ": blocks " + std::to_string(layer) + ".." +
                     std::to_string(layer + looped.shared_group - 1) + " do not exist (depth " +
                     std::to_string(source.depth) + ")");
}

LoopedConversion convert_to_looped(const nn::NamedTensors& source, const DiTConfig& source_cfg, const DiTConfig& looped,
                                   const std::string& shared) {
  check_looped_conversion(source_cfg, looped, shared);
  at::NoGradGuard no_grad;
  const int64_t layer = shared_layer(shared);
  TensorMap src;
  for (const auto& [name, t] : source) src[name] = t.detach();
  LoopedConversion out;
  for (const auto& [name, t] : source)  // the stem and the final layer
    if (name.rfind("blocks.", 0) != 0) out.state.emplace_back(name, src[name]);
  const std::vector<std::string> names = block_tensor_names(source);
  for (int64_t i = 0; i < looped.prelude; ++i)
    for (const auto& rest : names) out.state.emplace_back(block_name("prelude", i, rest), source_tensor(src, block_name("blocks", i, rest)));
  const int64_t coda0 = looped.prelude + looped.shared_group * looped.loops;
  for (int64_t j = 0; j < looped.coda; ++j)
    for (const auto& rest : names)
      out.state.emplace_back(block_name("coda", j, rest), source_tensor(src, block_name("blocks", coda0 + j, rest)));

  const std::vector<Target> targets = targets_of(looped, names);
  std::set<std::string> carried;
  for (const Target& t : targets) {
    carried.insert(t.path + ".weight");
    if (t.has_bias && looped.lora_bias) carried.insert(t.path + ".bias");
  }
  std::vector<std::string> lost;
  for (const auto& rest : names)
    if (!carried.count(rest)) lost.push_back(rest);
  for (int64_t k = 0; k < looped.shared_group; ++k) {
    TensorMap shared_k;
    for (const auto& rest : names) {
      const at::Tensor& like = source_tensor(src, block_name("blocks", 0, rest));
      shared_k[rest] = shared_value(src, looped, layer, k, rest).to(like.scalar_type());
      out.state.emplace_back(block_name("shared", k, rest), shared_k[rest]);
    }
    for (int64_t l = 0; l < looped.loops; ++l) {
      if (!targets.empty()) convert_adapters(src, shared_k, looped, l, k, targets, out);
      lost_differences(src, shared_k, looped, l, k, carried, out);
    }
  }
  add_notes(looped, targets, lost, out);
  return out;
}

std::string format_reconstruction(const LoopedConversion& c) {
  std::vector<std::string> columns;
  std::map<int64_t, std::map<std::string, double>> rows;  // layer -> tensor -> error
  std::map<int64_t, int64_t> loop_of;
  std::map<std::string, double> worst;
  for (const ReconstructionError& e : c.errors) {
    if (!worst.count(e.tensor)) columns.push_back(e.tensor);
    worst[e.tensor] = std::max(worst[e.tensor], e.relative);
    rows[e.layer][e.tensor] = e.relative;
    loop_of[e.layer] = e.loop;
  }
  std::ostringstream o;
  if (columns.empty()) return "";
  o << "relative reconstruction error ||W_layer - W_converted||_F / ||W_layer||_F "
       "(W_shared + (alpha/r) B A where an adapter carries it, else W_shared):\n";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%-20s", "layer");
  o << buf;
  std::vector<int> width;  // each column as wide as its name, at least a number's 10
  for (const auto& col : columns) {
    width.push_back(std::max<int>(10, static_cast<int>(std::min<size_t>(col.size(), 40))));
    std::snprintf(buf, sizeof buf, " %*s", width.back(), col.substr(0, 40).c_str());
    o << buf;
  }
  o << "\n";
  auto row = [&](const std::string& label, const std::map<std::string, double>& values) {
    std::snprintf(buf, sizeof buf, "%-20s", label.c_str());
    o << buf;
    for (size_t c = 0; c < columns.size(); ++c) {
      auto it = values.find(columns[c]);
      if (it == values.end()) std::snprintf(buf, sizeof buf, " %*s", width[c], "--");
      else std::snprintf(buf, sizeof buf, " %*.3e", width[c], it->second);
      o << buf;
    }
    o << "\n";
  };
  for (const auto& [layer, values] : rows)
    row("blocks." + std::to_string(layer) + " loop " + std::to_string(loop_of[layer]), values);
  row("worst", worst);
  return o.str();
}

}  // namespace perftrain::models
