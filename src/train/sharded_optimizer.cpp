#include "train/sharded_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

#include "base/error.h"
#include "distributed/group.h"

namespace perftrain::train {

std::vector<int> shard_owners(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw UsageError("shard_owners: world size must be >= 1");
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(numels.size(), 0);
  for (const size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += numels[i];
  }
  return owner;
}

int64_t state_bytes(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  int64_t b = 0;
  for (const auto& [name, t] : state)
    if (t.defined()) b += t.numel() * static_cast<int64_t>(t.element_size());
  return b;
}

OptimizerShards::OptimizerShards(distributed::Group& group, std::vector<std::pair<std::string, at::Tensor>> params,
                                 double bucket_mb)
    : group_(group),
      params_(std::move(params)),
      bucket_bytes_(std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20)))) {
  std::vector<int64_t> numels;
  for (const auto& [name, p] : params_) numels.push_back(p.numel());
  owner_ = shard_owners(numels, group_.world_size());
  for (const int r : owner_) owned_.push_back(r == group_.rank());
}

std::vector<std::pair<std::string, at::Tensor>> OptimizerShards::owned_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owned_[i]) out.push_back(params_[i]);
  return out;
}

void OptimizerShards::broadcast_weights() {
  at::NoGradGuard no_grad;
  for (int r = 0; r < group_.world_size(); ++r) {
    // r's parameters in order, in buckets of up to bucket_bytes_ (a larger
    // tensor alone, sent in place); a bucket of several travels flattened.
    size_t i = 0;
    while (i < params_.size()) {
      std::vector<at::Tensor> bucket;
      int64_t bytes = 0;
      for (; i < params_.size(); ++i) {
        if (owner_[i] != r) continue;
        const at::Tensor& p = params_[i].second;
        const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
        if (!bucket.empty() && (bytes + b > bucket_bytes_ || p.scalar_type() != bucket[0].scalar_type())) break;
        bucket.push_back(p);
        bytes += b;
      }
      if (bucket.empty()) break;
      if (bucket.size() == 1 && bucket[0].is_contiguous()) {
        group_.broadcast({bucket[0]}, r);
        continue;
      }
      at::Tensor flat;
      if (r == group_.rank()) {
        std::vector<at::Tensor> parts;
        for (const auto& t : bucket) parts.push_back(t.reshape({-1}));
        flat = at::cat(parts);
      } else {
        int64_t n = 0;
        for (const auto& t : bucket) n += t.numel();
        flat = at::empty({n}, bucket[0].options());
      }
      group_.broadcast({flat}, r);
      if (r == group_.rank()) continue;
      int64_t offset = 0;
      for (const auto& t : bucket) {
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> OptimizerShards::full_state(
    const std::vector<std::pair<std::string, at::Tensor>>& local) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> mine(local.begin(), local.end());
  const int rank = group_.rank();
  auto part = [&](const std::string& key) -> const at::Tensor& {
    auto it = mine.find(key);
    if (it == mine.end()) throw RuntimeError(group_.env().describe() + ": the optimizer holds no '" + key + "'");
    if (it->second.scalar_type() != at::kFloat)
      throw RuntimeError(group_.env().describe() + ": optimizer state '" + key + "' is not float32");
    return it->second;
  };
  // Per owner, one flat host buffer of its parameters' (exp_avg, exp_avg_sq,
  // step) in parameter order, broadcast from it over Gloo.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> per_param(params_.size());
  for (int r = 0; r < group_.world_size(); ++r) {
    int64_t n = 0;
    for (size_t i = 0; i < params_.size(); ++i)
      if (owner_[i] == r) n += 2 * params_[i].second.numel() + 1;
    if (n == 0) continue;
    at::Tensor flat;
    if (r == rank) {
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (owner_[i] != r) continue;
        const std::string& name = params_[i].first;
        for (const char* k : {"exp_avg.", "exp_avg_sq.", "step."})
          parts.push_back(part(k + name).reshape({-1}).to(at::kCPU));
      }
      flat = at::cat(parts);
      if (flat.numel() != n)
        throw RuntimeError(group_.env().describe() + ": the optimizer's state does not match its parameters");
    } else {
      flat = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    }
    group_.broadcast({flat}, r);
    if (rank != 0) continue;
    int64_t offset = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      const std::string& name = params_[i].first;
      const at::Tensor& p = params_[i].second;
      auto take = [&](int64_t count, at::IntArrayRef sizes) {
        at::Tensor t = flat.narrow(0, offset, count).view(sizes).clone();
        offset += count;
        return t;
      };
      per_param[i].emplace_back("exp_avg." + name, take(p.numel(), p.sizes()));
      per_param[i].emplace_back("exp_avg_sq." + name, take(p.numel(), p.sizes()));
      per_param[i].emplace_back("step." + name, take(1, {}));
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (rank != 0) return out;
  for (auto& entries : per_param)
    for (auto& e : entries) out.push_back(std::move(e));
  // The rest (the device optimizer's loss scale) is the same on every rank.
  for (const auto& [name, t] : local)
    if (name.rfind("exp_avg.", 0) != 0 && name.rfind("exp_avg_sq.", 0) != 0 && name.rfind("step.", 0) != 0)
      out.emplace_back(name, t.to(at::kCPU));
  return out;
}

int64_t OptimizerShards::full_state_bytes() const {
  int64_t b = 0;
  for (const auto& [name, p] : params_) b += (2 * p.numel() + 1) * 4;
  return b;
}

namespace {

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.3g %s", v, units[u]);
  return buf;
}

}  // namespace

std::string OptimizerShards::describe(int64_t state_bytes_here) const {
  size_t mine = 0;
  for (const bool o : owned_) mine += o;
  return "optimizer state sharded over " + std::to_string(group_.world_size()) + " ranks: " +
         human_bytes(state_bytes_here) + " here of " + human_bytes(full_state_bytes()) + " (" +
         std::to_string(state_bytes_here) + " of " + std::to_string(full_state_bytes()) + " bytes; AdamW moments of " +
         std::to_string(mine) + " of " + std::to_string(params_.size()) +
         " parameter tensors; weights and EMA on every rank)";
}

}  // namespace perftrain::train
