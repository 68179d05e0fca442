// muon route: how the hybrid optimizer routes the demo GPT's parameters.
#include <iostream>

#include "commands/command.h"
#include "muon/config.h"
#include "system/memory.h"
#include "training/train.h"

namespace muon::cli {

namespace {

class Route : public Command {
 public:
  explicit Route(CLI::App& program)
      : Command(program.add_subcommand(
            "route",
            "Print the routing report of the demo GPT: each parameter's shape, dtype, optimizer "
            "(muon/adamw/frozen) and the reason.")) {
    app_->add_flag("--untied", untied_, "give the head its own weight instead of the embedding's");
    app_->add_option("--config", config_path_, "YAML run config: its model and optimizer")
        ->check(CLI::ExistingFile);
    add_model_options(*app_, model_);
  }

  int run(const std::vector<std::string>&) override {
    model_.tie_embeddings = !untied_;
    cli::TrainConfig run;
    run.model = model_;
    if (!config_path_.empty()) run = cli::train_config_from_yaml_file(config_path_, run);
    run.model.check();
    cli::check_memory_need(4 * run.model.weight_count() + run.model.rope_bytes(),
                           "route: the model", "its weights and RoPE tables",
                           "--d-model, --layers or --seq-len");
    cli::Gpt model(run.model);
    const auto optimizer = build_optimizer(*model, run.optimizer, run.steps);
    std::cout << optimizer->report_text();
    return 0;
  }

 private:
  cli::GptConfig model_;
  bool untied_ = false;
  std::string config_path_;
};

}  // namespace

std::unique_ptr<Command> route_command(CLI::App& program) {
  return std::make_unique<Route>(program);
}

}  // namespace muon::cli
