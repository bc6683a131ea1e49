#include "train/convert.h"

#include <nlohmann/json.hpp>

#include <ostream>

#include "base/error.h"
#include "base/fs.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/dit_diffusers.h"
#include "train/init_from.h"
#include "train/weights_source.h"

namespace perftrain::train {
namespace {

// The diffusers release the export was checked against (tests/python/test_diffusers_export.py).
constexpr const char* kDiffusersVersion = "0.42.1";

const std::vector<std::string>& diffusers_files() {
  static const std::vector<std::string> files = {"config.json", "diffusion_pytorch_model.safetensors"};
  return files;
}

void check_file_out(const std::string& out) {
  if (fs::is_directory(out)) throw UsageError("--out " + out + " is a directory; give the file to write");
  const std::string parent = fs::parent_path(out);
  if (!fs::is_directory(parent)) throw UsageError("--out " + out + ": " + parent + " is not a directory");
}

void check_diffusers_out(const std::string& out) { io::check_directory_replaceable(out, diffusers_files()); }

std::string write_perftrain(const ConvertInput& in, const std::string& out) {
  io::save_safetensors(out, in.model.state(), {{"perftrain.config", in.config.to_toml()}, {"format", "pt"}},
                       io::SaveOptions{/*checksums=*/true});
  return "wrote " + out + " (" + std::to_string(in.model.state().size()) + " tensors, the config in its metadata)";
}

std::string diffusers_config_json(const models::DiTConfig& model) {
  const models::DiffusersConfig c = models::diffusers_config(model);
  nlohmann::ordered_json j = {
      {"_class_name", "DiTTransformer2DModel"},
      {"_diffusers_version", kDiffusersVersion},
      {"activation_fn", "gelu-approximate"},
      {"attention_bias", true},
      {"attention_head_dim", c.attention_head_dim},
      {"dropout", 0.0},
      {"in_channels", c.in_channels},
      {"norm_elementwise_affine", false},
      {"norm_eps", c.norm_eps},
      {"norm_num_groups", 32},
      {"norm_type", "ada_norm_zero"},
      {"num_attention_heads", c.num_attention_heads},
      {"num_embeds_ada_norm", c.num_embeds_ada_norm},
      {"num_layers", c.num_layers},
      {"out_channels", c.out_channels},
      {"patch_size", c.patch_size},
      {"sample_size", c.sample_size},
      {"upcast_attention", false},
  };
  return j.dump(2) + "\n";
}

std::string write_diffusers(const ConvertInput& in, const std::string& out) {
  const auto tensors = models::dit_to_diffusers(in.model.state(), in.model.config());
  const std::string config = diffusers_config_json(in.model.config());
  io::write_directory_atomic(out, [&](const std::string& tmp) {
    io::write_text_atomic(fs::join(tmp, diffusers_files()[0]), config);
    io::save_safetensors(fs::join(tmp, diffusers_files()[1]), tensors, {{"format", "pt"}});
  });
  return "wrote " + out + "/ (config.json, diffusion_pytorch_model.safetensors: " + std::to_string(tensors.size()) +
         " tensors for diffusers' DiTTransformer2DModel.from_pretrained)";
}

const ConvertTarget& target_named(const std::string& name) {
  std::string known;
  for (const auto& t : convert_targets()) {
    if (name == t.name) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.name);
  }
  throw UsageError("--to '" + name + "': expected one of " + known);
}

}  // namespace

const std::vector<ConvertTarget>& convert_targets() {
  static const std::vector<ConvertTarget> targets = {
      {"perftrain", "a safetensors weights file", check_file_out, write_perftrain},
      {"diffusers", "a diffusers DiTTransformer2DModel directory", check_diffusers_out, write_diffusers},
  };
  return targets;
}

void run_convert(const ConvertOptions& o, std::ostream& log) {
  const ConvertTarget& target = target_named(o.to);
  if (o.out.empty()) throw UsageError("--out is empty: give the file or directory to write");
  if (o.hints.heads < 0) throw UsageError("--heads must be positive");
  if (!o.hints.model.empty()) models::dit_config(o.hints.model);  // a known name, before reading gigabytes
  target.check_out(o.out);
  const WeightsSource source = read_weights(o.input, o.weights);
  const models::DiTConfig model_cfg = model_of(source, o.hints);
  log << "read " << source.description << "\nmodel " << models::describe_model_config(model_cfg)
      << (source.config ? " (from the file's config)" : " (from the shapes)") << "\n";
  const TrainConfig config = source.config ? *source.config : config_for_model(model_cfg);
  const auto model = models::make_diffusion_model(model_cfg, /*seed=*/0);
  load_named_weights(source.tensors, *model, /*new_class_count=*/false, source.description);
  log << target.write({*model, config}, o.out) << "\n";
}

}  // namespace perftrain::train
