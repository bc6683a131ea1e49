#include "train/eval/feature_net_training.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randperm.h>

#include <algorithm>
#include <chrono>
#include <ostream>
#include <vector>

#include "base/error.h"
#include "base/text.h"
#include "io/safetensors.h"
#include "train/adamw.h"

namespace perftrain::train::eval {
namespace {

constexpr const char* kFormatKey = "perftrain.feature_net";
constexpr int64_t kFeatureBatch = 512;  // images per batch when only computing features

// Samples indices[0..n) of `data` as a float32 batch and their labels, on `device`.
std::pair<at::Tensor, at::Tensor> gather(const data::Dataset& data, const int64_t* indices, int64_t n,
                                         const at::Device& device) {
  const auto s = data.sample_shape();
  at::Tensor x = at::empty({n, s[0], s[1], s[2]}, at::kFloat);
  at::Tensor y = at::empty({n}, at::kLong);
  data.gather(indices, n, x.data_ptr<float>(), y.data_ptr<int64_t>());
  return {x.to(device), y.to(device)};
}

// One epoch of Adam over `train` in a seeded order; returns the mean loss.
double train_epoch(models::FeatureNet& net, AdamW& opt, const data::Dataset& train, const FeatureNetTraining& o,
                   int64_t epoch, const at::Device& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + static_cast<uint64_t>(epoch));
  const at::Tensor order = at::randperm(train.size(), gen, at::TensorOptions().dtype(at::kLong));
  double total = 0;
  int64_t batches = 0;
  for (int64_t i = 0; i + o.batch_size <= train.size(); i += o.batch_size, ++batches) {
    auto [x, y] = gather(train, order.data_ptr<int64_t>() + i, o.batch_size, device);
    at::Tensor loss = at::cross_entropy_loss(net.logits(net.features(x)), y);
    loss.backward();
    opt.step(o.lr);
    total += loss.item<double>();
  }
  return batches > 0 ? total / batches : 0;
}

// The fraction of `data` whose predicted class is its label.
double accuracy(const models::FeatureNet& net, const data::Dataset& data, const at::Device& device) {
  at::NoGradGuard no_grad;
  int64_t right = 0;
  std::vector<int64_t> idx(kFeatureBatch);
  for (int64_t i = 0; i < data.size(); i += kFeatureBatch) {
    const int64_t n = std::min(kFeatureBatch, data.size() - i);
    for (int64_t j = 0; j < n; ++j) idx[j] = i + j;
    auto [x, y] = gather(data, idx.data(), n, device);
    right += net.logits(net.features(x)).argmax(1).eq(y).sum().item<int64_t>();
  }
  return static_cast<double>(right) / static_cast<double>(data.size());
}

}  // namespace

at::Tensor dataset_features(const models::FeatureNet& net, const data::Dataset& data, const at::Device& device) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  std::vector<int64_t> idx(kFeatureBatch);
  for (int64_t i = 0; i < data.size(); i += kFeatureBatch) {
    const int64_t n = std::min(kFeatureBatch, data.size() - i);
    for (int64_t j = 0; j < n; ++j) idx[j] = i + j;
    out.push_back(net.features(gather(data, idx.data(), n, device).first).cpu());
  }
  return at::cat(out);
}

TrainedFeatureNet train_feature_net(const data::Dataset& train, const data::Dataset* test, const std::string& path,
                                    const FeatureNetTraining& o, const at::Device& device, std::ostream& log) {
  const auto start = std::chrono::steady_clock::now();
  if (train.size() < o.batch_size) throw UsageError("the training set has fewer samples than one batch");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto shape = train.sample_shape();
  if (shape[1] != shape[2]) throw UsageError("the feature network needs square images (" + train.describe() + ")");
  models::FeatureNet net(shape[0], shape[1], train.num_classes(), gen);
  net.transform([&](const std::string&, const at::Tensor& t) { return t.to(device); });
  AdamW opt(net.named_parameters(), AdamWOptions{});
  for (int64_t e = 0; e < o.epochs; ++e) {
    const double loss = train_epoch(net, opt, train, o, e, device);
    log << "feature network: epoch " << e + 1 << "/" << o.epochs << ", mean loss " << loss << "\n";
  }
  TrainedFeatureNet out;
  out.test_accuracy = test ? accuracy(net, *test, device) : -1;
  const observe::eval::FeatureStats ref = observe::eval::feature_stats(dataset_features(net, train, device));
  io::NamedTensors tensors = net.state();
  tensors.emplace_back("reference.mu", ref.mu);
  tensors.emplace_back("reference.sigma", ref.sigma);
  io::save_safetensors(path, tensors,
                       {{kFormatKey, "1"},
                        {"dataset", train.describe()},
                        {"in_channels", std::to_string(shape[0])},
                        {"image_size", std::to_string(shape[1])},
                        {"classes", std::to_string(train.num_classes())},
                        {"test_accuracy", std::to_string(out.test_accuracy)}});
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

LoadedFeatureNet load_feature_net(const std::string& path, const at::Device& device) {
  const auto file = io::SafetensorsFile::open(path);
  const auto& meta = file.metadata();
  const std::string name = base::printable(path);
  if (!meta.count(kFormatKey))
    throw UsageError(name + " is not a feature network file (make one with perftrain eval --train-features)");
  LoadedFeatureNet out;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  out.image_size = std::stoll(meta.at("image_size"));
  out.net = std::make_unique<models::FeatureNet>(std::stoll(meta.at("in_channels")), out.image_size,
                                                 std::stoll(meta.at("classes")), gen);
  out.net->transform([&](const std::string& n, const at::Tensor& t) {
    if (!file.contains(n) || file.get(n).sizes() != t.sizes())
      throw UsageError(name + ": tensor " + n + " is missing or of another shape");
    return file.get(n).to(device, at::kFloat).clone();
  });
  out.reference = {file.get("reference.mu").clone(), file.get("reference.sigma").clone()};
  out.dataset = meta.count("dataset") ? meta.at("dataset") : "";
  return out;
}

}  // namespace perftrain::train::eval
