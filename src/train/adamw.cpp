#include "train/adamw.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <map>

#include "base/error.h"
#include "compat/compat.h"
#include "train/weight_decay.h"

namespace perftrain::train {

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, AdamWOptions opts)
    : params_(std::move(named_params)), opts_(opts) {
  decay_ = decay_flags(params_, opts_.decay_all);
  for (const auto& [name, p] : params_) {
    exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

void AdamW::step(double lr) {
  for (const bool group_decays : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, s;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& param = params_[i].second;
      if (!param.grad().defined() || decay_[i] != group_decays) continue;
      p.push_back(param);
      g.push_back(param.grad());
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
      s.push_back(steps_[i]);
    }
    if (p.empty()) continue;
    at::_foreach_add_(s, 1.0);  // the fused kernel reads the already-counted step
    compat::fused_adamw_(p, g, m, v, s, lr, opts_.beta1, opts_.beta2, group_decays ? opts_.weight_decay : 0.0,
                         opts_.eps);
  }
  for (auto& [name, param] : params_) param.mutable_grad() = at::Tensor();
  ++steps_taken_;
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].first, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]);
    out.emplace_back("step." + params_[i].first, steps_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> byname(state.begin(), state.end());
  auto restore = [&](const std::string& key, at::Tensor& dst) {
    auto it = byname.find(key);
    if (it == byname.end()) throw RuntimeError("optimizer state has no tensor '" + key + "'");
    if (it->second.sizes() != dst.sizes())
      throw RuntimeError("optimizer state '" + key + "' has the wrong shape");
    dst.copy_(it->second);
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    restore("exp_avg." + params_[i].first, exp_avg_[i]);
    restore("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]);
    restore("step." + params_[i].first, steps_[i]);
  }
  steps_taken_ = steps_.empty() ? 0 : static_cast<int64_t>(steps_[0].cpu().item<float>());
}

}  // namespace perftrain::train
