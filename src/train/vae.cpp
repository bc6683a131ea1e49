#include "train/vae.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "base/text.h"
#include "data/dataset.h"
#include "io/safetensors.h"

namespace perftrain::train {
namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "diffusion_pytorch_model.safetensors";
// Latents decoded at once: a 256 px decoder's activations of 16 images take
// about 1 GiB in float32.
constexpr int64_t kDecodeBatch = 16;

// One key of config.json into `out` when present (diffusers' default
// otherwise); a value of another type is an error naming the key.
template <class T>
void read_key(const nlohmann::json& j, const char* key, T& out, const std::string& origin) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(origin + ": key '" + key + "' has the wrong type (" + base::printable(it->dump()) + ")");
  }
}

// A number of the shards' metadata; `fallback` where the key is absent.
double shard_number(const std::map<std::string, std::string>& m, const char* key, double fallback,
                    const std::string& file) {
  const auto it = m.find(key);
  if (it == m.end()) return fallback;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != it->second.size() || !std::isfinite(v))
    throw RuntimeError(base::printable(file) + ": metadata " + key + " '" + base::printable(it->second) +
                       "' is not a finite number");
  return v;
}

}  // namespace

models::AutoencoderKLConfig read_vae_config(const std::string& dir, const std::string& option) {
  const std::string where = option + " " + base::printable(dir);
  if (!fs::is_directory(dir))
    throw UsageError(where + " is not a directory (expected a diffusers AutoencoderKL folder: config.json, " +
                     kWeightsFile + ")");
  const std::string path = fs::join(dir, kConfigFile);
  const std::string origin = option + " " + base::printable(path);
  std::ifstream f(path);
  if (!f) throw UsageError(where + " has no " + kConfigFile + " (expected a diffusers AutoencoderKL folder)");
  std::stringstream text;
  text << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception&) {
    throw UsageError(origin + " is not valid JSON");
  }
  if (!j.is_object()) throw UsageError(origin + " is not a JSON object");
  std::string cls = "AutoencoderKL";
  read_key(j, "_class_name", cls, origin);
  if (cls != "AutoencoderKL") throw UsageError(origin + ": _class_name '" + base::printable(cls) + "', expected AutoencoderKL");
  models::AutoencoderKLConfig c;
  read_key(j, "in_channels", c.in_channels, origin);
  read_key(j, "out_channels", c.out_channels, origin);
  read_key(j, "latent_channels", c.latent_channels, origin);
  read_key(j, "block_out_channels", c.block_out_channels, origin);
  read_key(j, "down_block_types", c.down_block_types, origin);
  read_key(j, "up_block_types", c.up_block_types, origin);
  read_key(j, "layers_per_block", c.layers_per_block, origin);
  read_key(j, "norm_num_groups", c.norm_num_groups, origin);
  read_key(j, "act_fn", c.act_fn, origin);
  read_key(j, "scaling_factor", c.scaling_factor, origin);
  read_key(j, "shift_factor", c.shift_factor, origin);
  read_key(j, "use_quant_conv", c.use_quant_conv, origin);
  read_key(j, "use_post_quant_conv", c.use_post_quant_conv, origin);
  read_key(j, "mid_block_add_attention", c.mid_block_add_attention, origin);
  c.validate(origin);
  return c;
}

Vae load_vae(const std::string& dir, const c10::Device& device, bool bf16, const std::string& option) {
  const models::AutoencoderKLConfig c = read_vae_config(dir, option);
  const std::string path = fs::join(dir, kWeightsFile);
  const std::string origin = option + " " + base::printable(path);
  if (!fs::is_regular_file(path))
    throw UsageError(option + " " + base::printable(dir) + " has no " + kWeightsFile);
  std::map<std::string, at::Tensor> weights;
  try {
    const auto file = io::SafetensorsFile::open(path);
    for (const auto& name : file.names()) weights[name] = file.get(name);
  } catch (const RuntimeError& e) {
    throw UsageError(option + ": " + e.what());
  }
  Vae v;
  v.dir = dir;
  v.net = models::autoencoder_kl_from(c, std::move(weights), origin, device, bf16 ? at::kBFloat16 : at::kFloat);
  v.scale = {c.scaling_factor, c.shift_factor, base::printable(fs::join(dir, kConfigFile))};
  return v;
}

LatentScale latent_scale_for(const TrainConfig& cfg, const Vae& vae) {
  if (cfg.data.source == "latents" && fs::exists(cfg.data.path)) {
    const std::string first = data::latent_shard_files(cfg.data.path).front();
    const auto meta = io::SafetensorsFile::open(first).metadata();
    if (meta.count(kShardScalingFactor)) {
      LatentScale s;
      s.scale = shard_number(meta, kShardScalingFactor, 1.0, first);
      s.shift = shard_number(meta, kShardShiftFactor, 0.0, first);
      s.from = "the run's latent shards (" + base::printable(first) + ")";
      return s;
    }
  }
  return vae.scale;
}

at::Tensor decode_latents(const Vae& vae, const LatentScale& s, const at::Tensor& latents) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < latents.size(0); i += kDecodeBatch) {
    const at::Tensor z = latents.narrow(0, i, std::min(kDecodeBatch, latents.size(0) - i)) / s.scale + s.shift;
    out.push_back(vae.net->decode(z));
  }
  return at::cat(out);
}

ImageDecoder vae_image_decoder(const std::string& dir, const TrainConfig& cfg, const c10::Device& device,
                               std::ostream& log, const std::string& option) {
  auto vae = std::make_shared<Vae>(load_vae(dir, device, false, option));
  const auto& c = vae->net->config();
  if (c.latent_channels != cfg.model.in_channels)
    throw UsageError(option + " " + base::printable(dir) + ": its latents have " + std::to_string(c.latent_channels) +
                     " channels, the model makes " + std::to_string(cfg.model.in_channels));
  const LatentScale s = latent_scale_for(cfg, *vae);
  log << "decoding with the VAE " << base::printable(dir) << ": latents / " << s.scale << " + " << s.shift
      << " (from " << s.from << ")\n";
  ImageDecoder d;
  d.decode = [vae, s](const at::Tensor& latents) { return decode_latents(*vae, s, latents); };
  d.upscale = c.downsample_factor();
  d.channels = c.out_channels;
  return d;
}

}  // namespace perftrain::train
