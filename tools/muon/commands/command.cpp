// The options several commands share (command.h).
#include "commands/command.h"

namespace muon::cli {

CLI::Option* add_threads(CLI::App& cmd, int& threads, const char* help) {
  return cmd.add_option("--threads", threads, help)
      ->check(cli::whole_number(0, 1024))
      ->capture_default_str();
}

void add_model_options(CLI::App& cmd, cli::GptConfig& model) {
  for (const auto& flag : cli::field_flags()) {
    if (std::string(flag.section) != "model") continue;
    cli::with_key(model, flag.key, [&](const OptionInfo& info, auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int64_t>) {
        add_count(cmd, flag.name, value, info.doc, cli::least_of(info));
      }
    });
  }
}

}  // namespace muon::cli
