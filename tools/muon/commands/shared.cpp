// The options several commands share (command.h).
#include "command.h"

namespace muon::cli {

CLI::Option* add_threads(CLI::App& cmd, int& threads, const char* help) {
  return cmd.add_option("--threads", threads, help)
      ->check(demo::whole_number(0, 1024))
      ->capture_default_str();
}

void add_model_options(CLI::App& cmd, demo::GptConfig& model) {
  for (const auto& flag : demo::field_flags()) {
    if (std::string(flag.section) != "model") continue;
    demo::with_key(model, flag.key, [&](const OptionInfo& info, auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int64_t>) {
        add_count(cmd, flag.name, value, info.doc, demo::least_of(info));
      }
    });
  }
}

}  // namespace muon::cli
