#include "train/eval/evaluation.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "base/text.h"
#include "io/npz.h"
#include "io/safetensors.h"
#include "models/inception.h"
#include "observe/eval/metrics.h"
#include "train/eval/feature_net_training.h"

namespace perftrain::train::eval {
namespace {

namespace metrics = observe::eval;

// The weights of a safetensors file by name.
std::map<std::string, at::Tensor> file_tensors(const std::string& path) {
  const auto file = io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.get(name);
  return out;
}

// mu [D] and sigma [D, D] from an .npz (pytorch-fid --save-stats, ADM's
// reference batches).
metrics::FeatureStats read_stats(const std::string& path) {
  auto arrays = io::read_arrays(path);
  const std::string name = base::printable(path);
  if (!arrays.count("mu") || !arrays.count("sigma"))
    throw UsageError("--ref-stats " + name + " has no mu and sigma arrays (pytorch-fid --save-stats writes them)");
  metrics::FeatureStats s{arrays.at("mu").to(at::kDouble).flatten(), arrays.at("sigma").to(at::kDouble)};
  if (s.mu.numel() != models::InceptionV3::kFeatures || s.sigma.dim() != 2 || s.sigma.size(0) != s.mu.numel() ||
      s.sigma.size(1) != s.mu.numel())
    throw UsageError("--ref-stats " + name + ": mu must be [2048] and sigma [2048, 2048] (Inception pool3)");
  return s;
}

// Images in [0, 1] for the Inception network, 3 channels.
at::Tensor inception_input(const at::Tensor& u8) {
  at::Tensor x = u8.to(at::kFloat) / 255.0f;
  return x.size(1) == 1 ? x.expand({x.size(0), 3, x.size(2), x.size(3)}) : x;
}

}  // namespace

struct Evaluator::Impl {
  EvalOptions opts;
  at::Device device;
  std::unique_ptr<models::InceptionV3> inception;
  metrics::FeatureStats ref_stats;
  at::Tensor ref_features;  // [M, 2048], or undefined
  std::optional<LoadedFeatureNet> features;

  Impl(const EvalOptions& o, const at::Device& d) : opts(o), device(d) {}
  void load_reference();
  at::Tensor pool3_of_images(const at::Tensor& u8_nhwc) const;
};

// Reference features: pool3 features [M, 2048], or images (uint8
// [M, H, W, C], e.g. ADM's reference batch) that go through the network.
void Evaluator::Impl::load_reference() {
  const std::string name = base::printable(opts.ref_features);
  auto arrays = io::read_arrays(opts.ref_features);
  if (!arrays.count("arr_0")) throw UsageError("--ref-features " + name + " has no arr_0 array");
  const at::Tensor a = arrays.at("arr_0");
  if (a.dim() == 4 && a.scalar_type() == at::kByte) ref_features = pool3_of_images(a);
  else if (a.dim() == 2 && a.size(1) == models::InceptionV3::kFeatures) ref_features = a.to(at::kDouble);
  else
    throw UsageError("--ref-features " + name + ": arr_0 must be pool3 features [M, 2048] or uint8 images " +
                     "[M, H, W, C]");
}

at::Tensor Evaluator::Impl::pool3_of_images(const at::Tensor& u8_nhwc) const {
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < u8_nhwc.size(0); i += opts.batch_size) {
    const at::Tensor b = u8_nhwc.narrow(0, i, std::min(opts.batch_size, u8_nhwc.size(0) - i)).to(device);
    out.push_back(inception->forward(inception_input(b.permute({0, 3, 1, 2}))).pool3.cpu());
  }
  return at::cat(out).to(at::kDouble);
}

Evaluator::Evaluator(const EvalOptions& o, const at::Device& device) : impl_(std::make_unique<Impl>(o, device)) {
  Impl& m = *impl_;
  if (o.inception.empty() && o.features.empty())
    throw UsageError("nothing to evaluate with: give --inception (FID) or --features (perftrain eval "
                     "--train-features)");
  if (!o.inception.empty()) {
    if (o.ref_stats.empty() && o.ref_features.empty())
      throw UsageError("--inception needs --ref-stats (mu, sigma) or --ref-features to compare with");
    m.inception = models::inception_from(file_tensors(o.inception), "--inception " + base::printable(o.inception),
                                         device);
    if (!o.ref_features.empty()) m.load_reference();
    m.ref_stats = o.ref_stats.empty() ? metrics::feature_stats(m.ref_features) : read_stats(o.ref_stats);
  } else if (!o.ref_stats.empty() || !o.ref_features.empty()) {
    throw UsageError("--ref-stats and --ref-features are Inception statistics: give --inception too");
  }
  if (!o.features.empty()) m.features = load_feature_net(o.features, device);
}

Evaluator::~Evaluator() = default;

void Evaluator::check_model(const TrainConfig& cfg) const {
  const SampleOptions& so = impl_->opts.sample;
  require_images(cfg, so, "eval");
  if (!impl_->features) return;
  const auto& f = *impl_->features;
  const int64_t channels = image_channels_of(cfg, so), size = image_size_of(cfg, so);
  if (f.net->in_channels() != channels || f.image_size != size)
    throw UsageError("the feature network was trained on " + f.dataset + ": " + std::to_string(f.net->in_channels()) +
                     " channels of " + std::to_string(f.image_size) + " px, the model makes " +
                     std::to_string(channels) + " of " + std::to_string(size));
}

// Samples in batches; each batch through the networks; then the metrics.
Metrics Evaluator::run(const models::DiffusionModel& model, const TrainConfig& cfg) const {
  check_model(cfg);
  at::NoGradGuard no_grad;
  const Impl& m = *impl_;
  const EvalOptions& o = m.opts;
  const bool class_labels = !(cfg.model.single_stream() && cfg.model.cond_dim > 0);
  std::vector<at::Tensor> pool3, logits, feats;
  int64_t consistent = 0;
  for (int64_t b = 0, done = 0; done < o.samples; ++b, done += o.batch_size) {
    const int64_t count = std::min(o.batch_size, o.samples - done);
    const at::Tensor labels = cycled_labels(done, count, cfg.model.num_classes);
    SampleOptions so = o.sample;
    so.seed = o.sample.seed + static_cast<uint64_t>(b);
    const at::Tensor u8 = to_uint8(sample_pixels_for_labels(model, cfg, labels, so, m.device));
    if (m.inception) {
      const auto out = m.inception->forward(inception_input(u8));
      pool3.push_back(out.pool3.cpu());
      if (out.logits.defined()) logits.push_back(out.logits.cpu());
    }
    if (m.features) {
      const at::Tensor f = m.features->net->features(u8.to(at::kFloat) * (2.0f / 255.0f) - 1.0f);
      feats.push_back(f.cpu());
      consistent += m.features->net->logits(f).argmax(1).cpu().eq(labels).sum().item<int64_t>();
    }
  }
  Metrics out;
  if (m.inception) {
    const at::Tensor p = at::cat(pool3).to(m.device);  // 50k x 50k distances: on the GPU where there is one
    out.emplace_back("fid", metrics::frechet_distance(metrics::feature_stats(p), m.ref_stats));
    if (!logits.empty() && o.samples >= 10) {
      const auto is = metrics::inception_score(at::cat(logits));
      out.emplace_back("inception_score", is.mean);
      out.emplace_back("inception_score_std", is.std);
    }
    if (m.ref_features.defined()) {
      const auto pr = metrics::precision_recall(m.ref_features.to(m.device), p);
      out.emplace_back("precision", pr.precision);
      out.emplace_back("recall", pr.recall);
    }
  }
  if (m.features) {
    out.emplace_back("fd_features",
                     metrics::frechet_distance(metrics::feature_stats(at::cat(feats)), m.features->reference));
    if (class_labels && m.features->net->classes() == cfg.model.num_classes)
      out.emplace_back("class_consistency", static_cast<double>(consistent) / static_cast<double>(o.samples));
  }
  return out;
}

std::string metrics_json(const Metrics& m, const EvalOptions& o, const std::string& checkpoint) {
  nlohmann::json j;
  for (const auto& [k, v] : m) j["metrics"][k] = v;
  j["checkpoint"] = base::printable(checkpoint);
  j["samples"] = o.samples;
  j["sample_steps"] = o.sample.steps;
  j["cfg_scale"] = o.sample.cfg_scale;
  j["seed"] = o.sample.seed;
  if (!o.inception.empty()) j["inception"] = base::printable(o.inception);
  if (!o.ref_stats.empty()) j["ref_stats"] = base::printable(o.ref_stats);
  if (!o.ref_features.empty()) j["ref_features"] = base::printable(o.ref_features);
  if (!o.features.empty()) j["features"] = base::printable(o.features);
  if (!o.vae.empty()) j["vae"] = base::printable(o.vae);
  return j.dump(2) + "\n";
}

}  // namespace perftrain::train::eval
