// The options several commands share (command.h).
#include "command.h"

namespace muon::cli {

CLI::Option* add_threads(CLI::App& cmd, int& threads, const char* help) {
  return cmd.add_option("--threads", threads, help)
      ->check(demo::whole_number(0, 1024))
      ->capture_default_str();
}

void add_model_options(CLI::App& cmd, demo::GptConfig& model) {
  for (const auto& flag : demo::model_flags()) {
    add_count(cmd, flag.name, model.*flag.field, demo::model_flag_help(flag).c_str());
  }
}

}  // namespace muon::cli
