// The one place where LibTorch version differences live (1.13 to 2.15; CI builds 1.13, Debian
// sid's 2.14 and PyPI's current release).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace muon::compat {

// Key of a parameter in torch::optim::Optimizer::state(): LibTorch 1.x keys by the TensorImpl
// address printed as a string, 2.x by the address itself.
#if TORCH_VERSION_MAJOR >= 2
inline void* param_state_key(const at::Tensor& p) {
  return p.unsafeGetTensorImpl();
}
#else
inline std::string param_state_key(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

// What runs collectives. In 1.x a c10d::ProcessGroup itself (ProcessGroupGloo derives from it);
// in 2.x a ProcessGroup dispatches to one c10d::Backend per device type, and ProcessGroupGloo and
// ProcessGroupNCCL are Backends.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

// The collective group behind a caller's process group (its default backend in 2.x). A template
// so that this header needs only the declarations above.
template <class Group>
c10::intrusive_ptr<CollectiveGroup> collective_group(const c10::intrusive_ptr<Group>& group) {
#if TORCH_VERSION_MAJOR >= 2
  return group->getDefaultBackend();
#else
  return group;
#endif
}

// c10d::TCPStoreOptions: LibTorch ≥ 2.2 serves the store with libuv by default, which some builds
// (Debian's 2.6) lack; the plain socket server every version has is asked for instead.
template <class Options, class = void>
struct has_use_libuv : std::false_type {};
template <class Options>
struct has_use_libuv<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>>
    : std::true_type {};

template <class Options>
void use_plain_tcp_store(Options& options) {
  if constexpr (has_use_libuv<Options>::value) options.useLibUV = false;
}

// A param group's own options. Newer LibTorch (Debian's 2.14, PyPI's 2.15; not 1.13 or 2.6) makes
// each group that torch::optim::Optimizer's constructor or add_param_group receives from a copy of
// the optimizer's defaults, merging the group's settings into it only for LibTorch's own six
// option types (SGD, Adam, AdamW, Adagrad, RMSprop, LBFGS): a group with options of any other
// type — every muon-cpp type — silently gets the defaults instead. Called right after either, this
// gives the groups from `first` on the options `given` holds (a no-op where LibTorch kept them).
inline void keep_group_options(std::vector<torch::optim::OptimizerParamGroup>& installed,
                               size_t first,
                               const std::vector<torch::optim::OptimizerParamGroup>& given) {
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i].has_options()) installed.at(first + i).set_options(given[i].options().clone());
  }
}

// An owning pointer to a leaf tensor's gradient accumulator (its AccumulateGrad node):
// std::shared_ptr<Node> in LibTorch 1.13, c10::intrusive_ptr<Node> in 2.14 and 2.15.
using GradAccumulator =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace muon::compat
