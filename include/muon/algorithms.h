// The registry: every algorithm muon-cpp runs, one line each (its entry, Algorithm<Options>, stands
// beside its options; muon/algorithm.h says what an entry declares). One dispatch,
// visit_algorithm(), turns a group's options into their algorithm; for_each_algorithm() walks the
// list (Python's engines and option schemas, the docs' tables).
#pragma once

#include <memory>
#include <optional>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "muon/adam.h"
#include "muon/dion.h"
#include "muon/error.h"
#include "muon/lion.h"
#include "muon/muon.h"

namespace muon {

template <class... Options>
struct AlgorithmList {};

// clang-format off
using Algorithms = AlgorithmList<
    MuonOptions,
    DionOptions,
    AdamWOptions,
    AdamOptions,
    LambOptions,
    LionOptions>;
// clang-format on

// The registered names, in order: "muon, dion, adamw, adam, lamb, lion".
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

template <class List>
struct ItemListsOf;
template <class... Options>
struct ItemListsOf<AlgorithmList<Options...>> {
  using type = std::tuple<std::vector<MatrixItem<Options, typename Algorithm<Options>::State>>...>;
};

// One algorithm's scratch, as its own type (two algorithms without scratch stay apart).
template <class Options>
struct ScratchSlot {
  ScratchOf<Options> value;
};
template <class List>
struct ScratchListOf;
template <class... Options>
struct ScratchListOf<AlgorithmList<Options...>> {
  using type = std::tuple<ScratchSlot<Options>...>;
};

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

// Sets the option `name` of `options` (of a registered algorithm's type, by its schema) to `value`
// when the algorithm has an option of that name and type T; false when it has none.
template <class Options, class T>
bool set_option_of(Options& options, const char* name, const T& value) {
  bool found = false;
  visit_options(options, [&](const OptionInfo& info, auto& field) {
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) {
      if (std::strcmp(info.name, name) == 0) {
        field = value;
        found = true;
      }
    }
  });
  return found;
}

// set_option_of for options held through the base class.
template <class T>
bool set_option(torch::optim::OptimizerOptions& options, const char* name, const T& value) {
  return visit_algorithm(options, [&](auto& o) { return set_option_of(o, name, value); });
}

// Copies into `to` every option it shares with `from` by name and type (Muon's lr, momentum,
// weight decay, ... into Dion's).
template <class From, class To>
void copy_shared_options(const From& from, To& to) {
  visit_options(to, [&](const OptionInfo& info, auto& field) {
    visit_options(from, [&](const OptionInfo& other, const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::decay_t<decltype(value)>>) {
        if (std::strcmp(info.name, other.name) == 0) field = value;
      }
    });
  });
}

// The option `name` of `options` (a registered algorithm's) when it has one of type T.
template <class T>
std::optional<T> get_option(const torch::optim::OptimizerOptions& options, const char* name) {
  std::optional<T> out;
  visit_algorithm(options, [&](const auto& o) {
    visit_options(o, [&](const OptionInfo& info, const auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) {
        if (std::strcmp(info.name, name) == 0) out = field;
      }
    });
  });
  return out;
}

// The scratch of every matrices algorithm (ScratchOf), kept across steps by an owner of several
// algorithms: the hybrid.
class MatrixScratch {
 public:
  template <class Options>
  ScratchOf<Options>& of() {
    return std::get<detail::ScratchSlot<Options>>(slots_).value;
  }

 private:
  typename detail::ScratchListOf<Algorithms>::type slots_;
};

// The items of every matrices algorithm (ParamKind::matrices), gathered across an owner's groups
// and then updated together, algorithm by algorithm in the registry's order: Muon orthogonalizes
// same-shape matrices of all groups in one batch.
class MatrixItemLists {
 public:
  template <class Options>
  std::vector<ItemOf<Options>>& of() {
    return std::get<std::vector<MatrixItem<Options, typename Algorithm<Options>::State>>>(lists_);
  }
  void update(MatrixScratch& scratch) {
    for_each_algorithm([&](auto* tag) {
      using Options = std::remove_pointer_t<decltype(tag)>;
      if constexpr (Algorithm<Options>::kind == ParamKind::matrices) {
        const auto& items = of<Options>();
        if (!items.empty()) update_matrices<Options>(items, scratch.of<Options>());
      }
    });
  }

 private:
  typename detail::ItemListsOf<Algorithms>::type lists_;
};

// What the registry knows of one algorithm, for code holding its options through the base class
// torch::optim::OptimizerOptions: one row per entry, made once; algorithm_row() finds it with
// one trip through the dispatch, and the row's functions take the options as they are.
struct AlgorithmRow {
  const char* name;   // the registry's name: "muon", "adamw"
  std::string title;  // as messages begin it: "Muon", "Adamw" (algorithm_title)
  ParamKind kind;     // which parameters it can update
  // The settings schedules, LR schedulers and checkpoints change (lr, weight_decay, ...), by name
  // (settings_of); set_settings takes exactly those names.
  SettingValues (*settings)(const torch::optim::OptimizerOptions& options);
  void (*set_settings)(torch::optim::OptimizerOptions& options, const SettingValues& values);
  // Throws muon::Error unless the options are valid (the entry's validate).
  void (*validate)(const torch::optim::OptimizerOptions& options);
  // Its default options.
  std::unique_ptr<torch::optim::OptimizerOptions> (*defaults)();
};

// The row of the options' algorithm; throws muon::Error for options of an algorithm not in the
// registry, naming those that are.
const AlgorithmRow& algorithm_row(const torch::optim::OptimizerOptions& options);
// The row of the algorithm registered as `name`; throws muon::Error naming the valid names — those
// of `kind` when `kind` is set, `what` saying what asked ("optimizer.others").
const AlgorithmRow& algorithm_row(const std::string& name,
                                  std::optional<ParamKind> kind = std::nullopt,
                                  const char* what = "");

// An algorithm's name as messages begin it: "Muon" for "muon", "Dion" for "dion".
std::string algorithm_title(const std::string& name);

// One field of the options' row, for a caller that needs one: algorithm_row(options).name, ...
const char* algorithm_name(const torch::optim::OptimizerOptions& options);
ParamKind algorithm_kind(const torch::optim::OptimizerOptions& options);
SettingValues group_settings(const torch::optim::OptimizerOptions& options);
void set_group_settings(torch::optim::OptimizerOptions& options, const SettingValues& values);
void check_group_options(const torch::optim::OptimizerOptions& options);

// The default options of the algorithm registered as `name` (configuration files name them):
// algorithm_row(name, kind, what).defaults().
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
  // The options as `Options`, or null when empty or another algorithm's.
  template <class Options>
  Options* as() const {
    return dynamic_cast<Options*>(options_.get());
  }
  // The options as `Options`; throws muon::Error naming what they are when empty or another
  // algorithm's (`h.matrices.get<MuonOptions>().ns_steps(6)`).
  template <class Options>
  Options& get() const {
    Options* typed = as<Options>();
    check(typed != nullptr, "AlgorithmOptions: holds ",
          options_ ? algorithm_name(*options_) : "no options", ", not ", Algorithm<Options>::name,
          "'s");
    return *typed;
  }
  torch::optim::OptimizerOptions& operator*() const { return *options_; }
  torch::optim::OptimizerOptions* operator->() const { return options_.get(); }

 private:
  std::unique_ptr<torch::optim::OptimizerOptions> options_;
};

}  // namespace muon
