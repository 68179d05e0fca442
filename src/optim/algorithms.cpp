// The registry's lookups (muon/algorithms.h), and where an owner keeps each parameter
// (muon/algorithm.h's checked_places).
#include "muon/algorithms.h"

#include <cctype>

namespace muon {

namespace {

std::string names_text(std::optional<ParamKind> kind) {
  std::string text;
  for_each_algorithm([&](auto* tag) {
    using Entry = Algorithm<std::remove_pointer_t<decltype(tag)>>;
    if (kind && Entry::kind != *kind) return;
    text += (text.empty() ? "" : ", ") + std::string(Entry::name);
  });
  return text;
}

// The row of `Options`' entry, made on first use; its functions cast the base class back to
// `Options`, which algorithm_row's dispatch or the caller's options guarantee.
template <class Options>
const AlgorithmRow& row_of() {
  using Entry = Algorithm<Options>;
  using Base = torch::optim::OptimizerOptions;
  static const AlgorithmRow row{
      Entry::name,
      algorithm_title(Entry::name),
      Entry::kind,
      [](const Base& o) { return settings_of(static_cast<const Options&>(o)); },
      [](Base& o, const SettingValues& v) { set_settings_of(static_cast<Options&>(o), v); },
      [](const Base& o) { Entry::validate(static_cast<const Options&>(o)); },
      []() -> std::unique_ptr<Base> { return std::make_unique<Options>(); }};
  return row;
}

}  // namespace

std::string algorithm_title(const std::string& name) {
  std::string title = name;
  if (!title.empty()) title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
  return title;
}

std::string algorithm_names_text() {
  return names_text(std::nullopt);
}

std::string algorithm_names_text(ParamKind kind) {
  return names_text(kind);
}

const AlgorithmRow& algorithm_row(const torch::optim::OptimizerOptions& options) {
  return visit_algorithm(options, [](const auto& o) -> const AlgorithmRow& {
    return row_of<std::decay_t<decltype(o)>>();
  });
}

const AlgorithmRow& algorithm_row(const std::string& name, std::optional<ParamKind> kind,
                                  const char* what) {
  const AlgorithmRow* found = nullptr;
  for_each_algorithm([&](auto* tag) {
    const auto& row = row_of<std::remove_pointer_t<decltype(tag)>>();
    if (name == row.name && (!kind || row.kind == *kind)) found = &row;
  });
  check(found != nullptr, what, *what ? ": " : "", "'", name,
        "' is not an algorithm that can run here; valid are ", names_text(kind));
  return *found;
}

std::unique_ptr<torch::optim::OptimizerOptions> default_options_of(const std::string& name,
                                                                   std::optional<ParamKind> kind,
                                                                   const char* what) {
  return algorithm_row(name, kind, what).defaults();
}

const char* algorithm_name(const torch::optim::OptimizerOptions& options) {
  return algorithm_row(options).name;
}

ParamKind algorithm_kind(const torch::optim::OptimizerOptions& options) {
  return algorithm_row(options).kind;
}

SettingValues group_settings(const torch::optim::OptimizerOptions& options) {
  return algorithm_row(options).settings(options);
}

void set_group_settings(torch::optim::OptimizerOptions& options, const SettingValues& values) {
  algorithm_row(options).set_settings(options, values);
}

void check_group_options(const torch::optim::OptimizerOptions& options) {
  algorithm_row(options).validate(options);
}

std::map<const void*, ParamPlace> checked_places(
    const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::map<const void*, ParamPlace> places;
  int64_t position = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group_options(groups[g].options());
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      places[params[i].unsafeGetTensorImpl()] = {g, i, position++};
    }
  }
  return places;
}

const ParamPlace& place_of(const std::map<const void*, ParamPlace>& places,
                           const at::Tensor& param, const char* who) {
  const auto it = places.find(param.unsafeGetTensorImpl());
  check(it != places.end(), who, ": a tensor of shape ", param.sizes(),
        " is not one of this optimizer's parameters (as they were when its step began)");
  return it->second;
}

}  // namespace muon
