// The registry's lookups (muon/algorithms.h).
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

std::unique_ptr<torch::optim::OptimizerOptions> default_options_of(const std::string& name,
                                                                   std::optional<ParamKind> kind,
                                                                   const char* what) {
  std::unique_ptr<torch::optim::OptimizerOptions> options;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    using Entry = Algorithm<Options>;
    if (name == Entry::name && (!kind || Entry::kind == *kind)) {
      options = std::make_unique<Options>();
    }
  });
  check(options != nullptr, what, *what ? ": " : "", "'", name,
        "' is not an algorithm that can run here; valid are ", names_text(kind));
  return options;
}

const char* algorithm_name(const torch::optim::OptimizerOptions& options) {
  return visit_algorithm(options,
                         [](const auto& o) { return Algorithm<std::decay_t<decltype(o)>>::name; });
}

ParamKind algorithm_kind(const torch::optim::OptimizerOptions& options) {
  return visit_algorithm(options,
                         [](const auto& o) { return Algorithm<std::decay_t<decltype(o)>>::kind; });
}

SettingValues group_settings(const torch::optim::OptimizerOptions& options) {
  return visit_algorithm(options, [](const auto& o) { return settings_of(o); });
}

void set_group_settings(torch::optim::OptimizerOptions& options, const SettingValues& values) {
  visit_algorithm(options, [&](auto& o) { set_settings_of(o, values); });
}

void check_group_options(const torch::optim::OptimizerOptions& options) {
  visit_algorithm(options,
                  [](const auto& o) { Algorithm<std::decay_t<decltype(o)>>::validate(o); });
}

}  // namespace muon
