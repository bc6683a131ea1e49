// nn::Module's hook point: forward pre/post hooks in call order with names
// relative to the module they were registered on, backward hooks with the
// gradients autograd computes, removal by handle.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/module.h"

namespace perftrain::nn {
namespace {

// fc(x) -> mlp -> out: children named "fc", "mlp" (with "mlp.fc1", "mlp.fc2"), "out".
class Net : public Module {
 public:
  explicit Net(at::Generator& gen) : fc(8, 16, gen), mlp(16, 32, gen), out(16, 4, gen) {
    register_module("fc", &fc);
    register_module("mlp", &mlp);
    register_module("out", &out);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) { return out.forward(mlp.forward(fc.forward(in[0]))); });
  }
  Linear fc;
  Mlp mlp;
  Linear out;
};

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

TEST(ModuleHooks, ForwardHooksFireInCallOrderWithQualifiedNames) {
  auto g = gen(1);
  Net net(g);
  std::vector<std::string> pre, post;
  std::vector<std::vector<int64_t>> out_shapes;
  std::vector<std::string> types;
  auto h1 = net.add_forward_pre_hook([&](const std::string& name, const Module& m, at::TensorList in) {
    pre.push_back(name);
    types.push_back(m.type_name());
    EXPECT_EQ(in.size(), 1u);
  });
  auto h2 = net.add_forward_hook([&](const std::string& name, const Module&, at::TensorList, at::TensorList out) {
    post.push_back(name);
    out_shapes.push_back(out[0].sizes().vec());
  });
  const at::Tensor x = at::randn({3, 5, 8}, g);
  net.forward(x);
  EXPECT_EQ(pre, (std::vector<std::string>{"", "fc", "mlp", "mlp.fc1", "mlp.fc2", "out"}));
  EXPECT_EQ(post, (std::vector<std::string>{"fc", "mlp.fc1", "mlp.fc2", "mlp", "out", ""}));
  EXPECT_EQ(types, (std::vector<std::string>{"Net", "Linear", "Mlp", "Linear", "Linear", "Linear"}));
  EXPECT_EQ(out_shapes[1], (std::vector<int64_t>{3, 5, 32}));  // mlp.fc1
  EXPECT_EQ(out_shapes.back(), (std::vector<int64_t>{3, 5, 4}));

  // Removing the pre hook leaves the forward hook; removing both leaves none.
  h1.remove();
  pre.clear();
  post.clear();
  net.forward(x);
  EXPECT_TRUE(pre.empty());
  EXPECT_EQ(post.size(), 6u);
  h2.remove();
  EXPECT_FALSE(net.has_hooks());
  EXPECT_FALSE(net.mlp.fc1.has_hooks());
  post.clear();
  net.forward(x);
  EXPECT_TRUE(post.empty());
}

TEST(ModuleHooks, HandleRemovesOnDestructionAndChildHooksUseRelativeNames) {
  auto g = gen(2);
  Net net(g);
  std::vector<std::string> names;
  {
    auto h = net.mlp.add_forward_hook(
        [&](const std::string& name, const Module&, at::TensorList, at::TensorList) { names.push_back(name); });
    EXPECT_TRUE(net.mlp.fc2.has_hooks());
    EXPECT_FALSE(net.fc.has_hooks());
    net.forward(at::randn({2, 8}, g));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fc1", "fc2", ""}));
  EXPECT_FALSE(net.mlp.has_hooks());
  names.clear();
  net.forward(at::randn({2, 8}, g));
  EXPECT_TRUE(names.empty());
}

TEST(ModuleHooks, HooksDoNotChangeTheResult) {
  auto g = gen(3);
  Net net(g);
  const at::Tensor x = at::randn({4, 8}, g);
  const at::Tensor plain = net.forward(x);
  auto h = net.add_backward_hook([](const std::string&, const Module&, GradOf, size_t, const at::Tensor&) {});
  auto h2 = net.add_forward_hook([](const std::string&, const Module&, at::TensorList, at::TensorList) {});
  EXPECT_TRUE(at::equal(plain, net.forward(x)));
}

TEST(ModuleHooks, BackwardHooksSeeTheGradientsOfOutputsAndInputs) {
  auto g = gen(4);
  Net net(g);
  const at::Tensor x = at::randn({3, 8}, g).requires_grad_(true);
  const at::Tensor r = at::randn({3, 4}, g);
  std::vector<std::string> order;
  at::Tensor grad_out_of_out, grad_in_of_out, grad_out_of_fc, grad_in_of_net;
  auto h = net.add_backward_hook(
      [&](const std::string& name, const Module&, GradOf which, size_t index, const at::Tensor& grad) {
        EXPECT_EQ(index, 0u);
        order.push_back(name + (which == GradOf::kOutput ? ":out" : ":in"));
        if (name == "out") (which == GradOf::kOutput ? grad_out_of_out : grad_in_of_out) = grad.clone();
        if (name == "fc" && which == GradOf::kOutput) grad_out_of_fc = grad.clone();
        if (name.empty() && which == GradOf::kInput) grad_in_of_net = grad.clone();
      });
  const at::Tensor y = net.forward(x);
  (y * r).sum().backward();
  // Direct computation: d/dy = r; d/d(out's input) = r W_out; d/dx = x.grad.
  ASSERT_TRUE(grad_out_of_out.defined());
  EXPECT_TRUE(at::allclose(grad_out_of_out, r));
  EXPECT_TRUE(at::allclose(grad_in_of_out, r.matmul(net.out.weight), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(grad_in_of_net, x.grad(), 1e-5, 1e-6));
  ASSERT_TRUE(grad_out_of_fc.defined());
  // Backward runs from the output back: the output's hooks first (the root
  // returns module out's output: out's hook was placed first), the root's
  // input last.
  ASSERT_GE(order.size(), 4u);
  EXPECT_EQ(order[0], "out:out");
  EXPECT_EQ(order[1], ":out");
  EXPECT_EQ(order.back(), ":in");
  // The hook gone, backward runs without it.
  h.remove();
  order.clear();
  net.forward(x).sum().backward();
  EXPECT_TRUE(order.empty());
}

TEST(ModuleHooks, TypeNameDropsNamespaces) {
  auto g = gen(5);
  ModuleList<Linear> list;
  list.add(std::make_unique<Linear>(2, 3, g));
  EXPECT_EQ(list.type_name(), "ModuleList<Linear>");
  EXPECT_EQ(list[0].type_name(), "Linear");
  ASSERT_EQ(list.named_children().size(), 1u);
  EXPECT_EQ(list.named_children()[0].first, "0");
  EXPECT_EQ(list[0].own_tensors().size(), 2u);
}

}  // namespace
}  // namespace perftrain::nn
