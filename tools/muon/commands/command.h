// The subcommands of `muon`, one file each here (<name>_command.cpp: train, route, compare,
// schedule, bench): each registers its options on the program's CLI11 app when it is made and does
// its work in run() once the command line is parsed. main.cpp lists them and reports failures.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "demo/gpt.h"
#include "training/run_flags.h"

namespace muon::cli {

class Command {
 public:
  explicit Command(CLI::App* app) : app_(app) {}
  virtual ~Command() = default;
  // The command's work; `args` is the whole command line (argv). Returns the exit status.
  virtual int run(const std::vector<std::string>& args) = 0;
  bool chosen() const { return app_->parsed(); }

 protected:
  CLI::App* app_;
};

std::unique_ptr<Command> train_command(CLI::App& program);
std::unique_ptr<Command> route_command(CLI::App& program);
std::unique_ptr<Command> compare_command(CLI::App& program);
std::unique_ptr<Command> schedule_command(CLI::App& program);
std::unique_ptr<Command> bench_command(CLI::App& program);

// ---- options several commands share ----

// An option holding a whole number in [least, 2^53].
template <class T>
CLI::Option* add_count(CLI::App& cmd, const char* name, T& value, const char* help,
                       int64_t least = 1) {
  return cmd.add_option(name, value, help)->check(cli::whole_number(least))->capture_default_str();
}

// --threads (0: one per core, or LibTorch's default: `help` says which).
CLI::Option* add_threads(CLI::App& cmd, int& threads, const char* help);

// The model's flags (--layers, --d-model, ...: cli::field_flags() of section model) on `model`.
void add_model_options(CLI::App& cmd, cli::GptConfig& model);

}  // namespace muon::cli
