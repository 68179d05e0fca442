// The registry's lookups (muon/algorithms.h).
#include "muon/algorithms.h"

namespace muon {

std::string algorithm_names_text() {
  std::string text;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    text += (text.empty() ? "" : ", ") + std::string(Algorithm<Options>::name);
  });
  return text;
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
  return visit_algorithm(
      options, [](const auto& o) { return Algorithm<std::decay_t<decltype(o)>>::settings(o); });
}

void set_group_settings(torch::optim::OptimizerOptions& options, const SettingValues& values) {
  visit_algorithm(options,
                  [&](auto& o) { Algorithm<std::decay_t<decltype(o)>>::set_settings(o, values); });
}

void check_group_options(const torch::optim::OptimizerOptions& options) {
  visit_algorithm(options,
                  [](const auto& o) { Algorithm<std::decay_t<decltype(o)>>::validate(o); });
}

}  // namespace muon
