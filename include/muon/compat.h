// The one place where LibTorch version differences live (1.13 and 2.x; CI builds 1.13 and 2.6).
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <string>
#include <type_traits>
#include <utility>

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

}  // namespace muon::compat
