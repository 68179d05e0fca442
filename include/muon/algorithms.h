// The registry: every algorithm muon-cpp runs, one line each (its entry, Algorithm<Options>, stands
// beside its options; muon/algorithm.h says what an entry declares). One dispatch,
// visit_algorithm(), turns a group's options into their algorithm; for_each_algorithm() walks the
// list (Python's engines and option schemas, the docs' tables).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "muon/adam.h"
#include "muon/error.h"
#include "muon/lion.h"
#include "muon/muon.h"

namespace muon {

template <class... Options>
struct AlgorithmList {};

// clang-format off
using Algorithms = AlgorithmList<
    MuonOptions,
    AdamWOptions,
    AdamOptions,
    LambOptions,
    LionOptions>;
// clang-format on

// The registered names, in order: "muon, adamw, adam, lamb, lion".
std::string algorithm_names_text();

namespace detail {

template <class Base, class F, class First, class... Rest>
decltype(auto) visit_in(Base& options, F&& f, AlgorithmList<First, Rest...>) {
  using Options = std::conditional_t<std::is_const_v<Base>, const First, First>;
  if (auto* o = dynamic_cast<Options*>(&options)) return f(*o);
  if constexpr (sizeof...(Rest) == 0) {
    throw Error("options of another optimizer; muon-cpp runs the algorithms " +
                algorithm_names_text());
  } else {
    return visit_in(options, std::forward<F>(f), AlgorithmList<Rest...>{});
  }
}

template <class F, class... Options>
void for_each_in(F&& f, AlgorithmList<Options...>) {
  (f(static_cast<Options*>(nullptr)), ...);
}

}  // namespace detail

// f(options as their own type, e.g. const AdamWOptions&); throws muon::Error for options of an
// algorithm not in the registry. Every f(...) must return the same type.
template <class F>
decltype(auto) visit_algorithm(const torch::optim::OptimizerOptions& options, F&& f) {
  return detail::visit_in(options, std::forward<F>(f), Algorithms{});
}
template <class F>
decltype(auto) visit_algorithm(torch::optim::OptimizerOptions& options, F&& f) {
  return detail::visit_in(options, std::forward<F>(f), Algorithms{});
}

// f(static_cast<Options*>(nullptr)) for every registered options type, in the list's order:
//   for_each_algorithm([](auto* tag) { using O = std::remove_pointer_t<decltype(tag)>; ... });
template <class F>
void for_each_algorithm(F&& f) {
  detail::for_each_in(std::forward<F>(f), Algorithms{});
}

// The registry's name of the options' algorithm ("muon", "adamw", ...).
const char* algorithm_name(const torch::optim::OptimizerOptions& options);
// Whether the options' algorithm updates matrices only.
ParamKind algorithm_kind(const torch::optim::OptimizerOptions& options);
// The settings schedules, LR schedulers and checkpoints change (lr, weight_decay, ...), by name;
// set_group_settings takes exactly those names.
SettingValues group_settings(const torch::optim::OptimizerOptions& options);
void set_group_settings(torch::optim::OptimizerOptions& options, const SettingValues& values);
// Throws muon::Error unless `options` are valid options of a registered algorithm.
void check_group_options(const torch::optim::OptimizerOptions& options);

// The default options of the algorithm registered as `name` (configuration files name them);
// throws muon::Error naming the valid names — those of `kind` when `kind` is set, `what` saying
// what asked ("optimizer.others").
std::unique_ptr<torch::optim::OptimizerOptions> default_options_of(
    const std::string& name, std::optional<ParamKind> kind = std::nullopt, const char* what = "");
// The registered names of `kind`: "adamw, adam, lamb, lion" for ParamKind::any.
std::string algorithm_names_text(ParamKind kind);

// Options of any registered algorithm held by value, as a struct member holds them: copies are
// deep; empty until set (`holder = muon::LionOptions(3e-4)`). The options' type is the algorithm.
class AlgorithmOptions {
 public:
  AlgorithmOptions() = default;
  template <class Options,
            class = std::enable_if_t<std::is_base_of_v<torch::optim::OptimizerOptions, Options>>>
  AlgorithmOptions(const Options& options)  // NOLINT: implicit, as the options themselves
      // Their own type, even through a base reference (clone() is public only on the base).
      : options_(static_cast<const torch::optim::OptimizerOptions&>(options).clone()) {}
  explicit AlgorithmOptions(std::unique_ptr<torch::optim::OptimizerOptions> options)
      : options_(std::move(options)) {}
  AlgorithmOptions(const AlgorithmOptions& other)
      : options_(other.options_ ? other.options_->clone() : nullptr) {}
  AlgorithmOptions& operator=(const AlgorithmOptions& other) {
    if (this != &other) options_ = other.options_ ? other.options_->clone() : nullptr;
    return *this;
  }
  AlgorithmOptions(AlgorithmOptions&&) = default;
  AlgorithmOptions& operator=(AlgorithmOptions&&) = default;

  explicit operator bool() const { return options_ != nullptr; }
  torch::optim::OptimizerOptions& operator*() const { return *options_; }
  torch::optim::OptimizerOptions* operator->() const { return options_.get(); }

 private:
  std::unique_ptr<torch::optim::OptimizerOptions> options_;
};

}  // namespace muon
