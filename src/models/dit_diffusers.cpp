#include "models/dit_diffusers.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>

#include <map>

#include "base/error.h"

namespace perftrain::models {
namespace {

void check_exportable(const DiTConfig& cfg) {
  if (cfg.single_stream())
    throw UsageError("model " + cfg.name + " is of the single-stream family, which diffusers has no class for; "
                     "only DiT models export to diffusers");
  if (cfg.mlp_hidden() != 4 * cfg.hidden)
    throw UsageError("model " + cfg.name + " has model.mlp_ratio " + std::to_string(cfg.mlp_ratio) +
                     "; diffusers' DiTTransformer2DModel has an MLP of 4 x hidden only");
}

}  // namespace

DiffusersConfig diffusers_config(const DiTConfig& cfg) {
  check_exportable(cfg);
  return {cfg.heads,      cfg.hidden / cfg.heads, cfg.in_channels, cfg.out_channels(), cfg.depth,
          cfg.image_size, cfg.patch,              cfg.num_classes, 1e-6};
}

nn::NamedTensors dit_to_diffusers(const nn::NamedTensors& dit, const DiTConfig& cfg) {
  check_exportable(cfg);
  std::map<std::string, at::Tensor> in(dit.begin(), dit.end());
  auto get = [&](const std::string& name) {
    auto it = in.find(name);
    if (it == in.end()) throw RuntimeError("DiT weights without tensor '" + name + "'");
    return it->second;
  };
  nn::NamedTensors out;
  auto put = [&](const std::string& to, const std::string& from) { out.emplace_back(to, get(from)); };
  put("pos_embed.proj.weight", "x_embedder.proj.weight");
  put("pos_embed.proj.bias", "x_embedder.proj.bias");
  at::Tensor table = get("y_embedder.embedding_table.weight");
  if (cfg.class_dropout <= 0) table = at::cat({table, at::zeros({1, table.size(1)}, table.options())});
  for (int64_t i = 0; i < cfg.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", t = "transformer_blocks." + std::to_string(i) + ".";
    put(t + "norm1.emb.timestep_embedder.linear_1.weight", "t_embedder.mlp.0.weight");
    put(t + "norm1.emb.timestep_embedder.linear_1.bias", "t_embedder.mlp.0.bias");
    put(t + "norm1.emb.timestep_embedder.linear_2.weight", "t_embedder.mlp.2.weight");
    put(t + "norm1.emb.timestep_embedder.linear_2.bias", "t_embedder.mlp.2.bias");
    out.emplace_back(t + "norm1.emb.class_embedder.embedding_table.weight", table);
    put(t + "norm1.linear.weight", b + "adaLN_modulation.1.weight");
    put(t + "norm1.linear.bias", b + "adaLN_modulation.1.bias");
    const auto qkv_w = get(b + "attn.qkv.weight").chunk(3, 0), qkv_b = get(b + "attn.qkv.bias").chunk(3, 0);
    const char* parts[] = {"to_q", "to_k", "to_v"};
    for (int j = 0; j < 3; ++j) {
      out.emplace_back(t + "attn1." + parts[j] + ".weight", qkv_w[j]);
      out.emplace_back(t + "attn1." + parts[j] + ".bias", qkv_b[j]);
    }
    put(t + "attn1.to_out.0.weight", b + "attn.proj.weight");
    put(t + "attn1.to_out.0.bias", b + "attn.proj.bias");
    put(t + "ff.net.0.proj.weight", b + "mlp.fc1.weight");
    put(t + "ff.net.0.proj.bias", b + "mlp.fc1.bias");
    put(t + "ff.net.2.weight", b + "mlp.fc2.weight");
    put(t + "ff.net.2.bias", b + "mlp.fc2.bias");
  }
  put("proj_out_1.weight", "final_layer.adaLN_modulation.1.weight");
  put("proj_out_1.bias", "final_layer.adaLN_modulation.1.bias");
  put("proj_out_2.weight", "final_layer.linear.weight");
  put("proj_out_2.bias", "final_layer.linear.bias");
  return out;
}

}  // namespace perftrain::models
