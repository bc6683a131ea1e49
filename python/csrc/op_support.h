// What the Python ops' C++ files share: the backward of an op that has no
// backward of its own to call (its plain-ATen reference on the CPU) by
// autograd through a forward, and the tensor that stands for "no gradient".
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace perftrain::python {

// Each kernel the module registers is kernel<&fn>: fn's exceptions that are
// not c10::Error (perftrain's UsageError and RuntimeError, the standard
// library's) leave it as c10::Error with the same message, which PyTorch
// turns into Python's RuntimeError with the C++ backtrace PyTorch keeps for
// its own errors. PyTorch's guidance for custom operators is to throw only
// c10::Error through torch.ops.
template <auto Fn>
struct TorchErrors;
template <typename R, typename... Args, R (*Fn)(Args...)>
struct TorchErrors<Fn> {
  static R call(Args... args) {
    try {
      return Fn(std::forward<Args>(args)...);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      C10_THROW_ERROR(Error, e.what());
    }
  }
};
template <auto Fn>
constexpr auto kernel = &TorchErrors<Fn>::call;

using Tensors = std::vector<at::Tensor>;

// The gradients of fn(inputs) for `grad_outputs` (one per output of fn,
// undefined: that output is not used), by autograd through fn, from inside an
// operator's kernel (where the dispatcher has switched autograd off): fn is
// an op's plain-ATen reference, so this is the reference backward. One
// gradient per input, contiguous, in the input's dtype; an undefined input
// gets an undefined gradient, an input fn does not depend on gets zeros.
Tensors grads_through(const std::function<Tensors(const Tensors&)>& fn, const Tensors& inputs,
                      const Tensors& grad_outputs);

// The body of an op's `<op>_backward` where the backward is autograd through
// the op itself (grads_through of `forward`, the C++ op of src/ops/: its
// reference on the CPU, its autograd function on CUDA, which runs the forward
// again): the inputs arrive as Tensor?[] in the forward's order, and an
// absent one gets no_grad_slot. Outputs never alias the incoming gradients.
std::vector<at::Tensor> backward_through(const std::function<Tensors(const Tensors&)>& forward,
                                         const std::vector<at::Tensor>& grads,
                                         const c10::List<std::optional<at::Tensor>>& inputs);

inline at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// A gradient slot for an absent optional input: [0] float32 on `like`'s device
// (an op's outputs are tensors, never None; ops.py turns it into None).
at::Tensor no_grad_slot(const at::Tensor& like);

// `g` when defined, else no_grad_slot(like).
at::Tensor grad_or_slot(const at::Tensor& g, const at::Tensor& like);

// A copy of a master weight that an op takes beside it (the optimizer's bf16
// copy, which perftrain.nn passes) must have weight's sizes, `dtype` (the
// product's) and weight's device: else UsageError naming `op` and `what`.
void check_weight_copy(const char* op, const char* what, const at::Tensor& weight,
                       const std::optional<at::Tensor>& copy, at::ScalarType dtype);

// The weight a product reads in `dtype`: `copy` where given (checked as
// above), else ops::compute_weight(weight, dtype): weight itself when already
// in dtype, else a cast.
at::Tensor product_weight(const char* op, const char* what, const at::Tensor& weight,
                          const std::optional<at::Tensor>& copy, at::ScalarType dtype);

}  // namespace perftrain::python
