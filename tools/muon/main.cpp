// The `muon` command line: the subcommands (commands/, a file each), the parsing and how every
// failure ends — one line on stderr and an exit status.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands/command.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "training/run_flags.h"

namespace {

// " (rank r of N)" under a data-parallel launch, else "".
std::string rank_label() {
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (rank == nullptr || world == nullptr) return "";
  return std::string(" (rank ") + rank + " of " + world + ")";
}

// Every exception a command can end with, as one line on stderr and an exit status: 2 for input
// the checks refused, 3 for a failed data-parallel collective, 1 for anything else — an error a
// check should have caught first, reported all the same rather than ending by a signal.
int report_failure(const std::exception_ptr& failure) {
  const auto say = [](const std::string& what, int status) {
    std::cerr << "error" << rank_label() << ": " << what << '\n';
    return status;
  };
  try {
    std::rethrow_exception(failure);
  } catch (const muon::Error& e) {
    return say(e.what(), 2);
  } catch (const muon::DistributedError& e) {
    return say(e.what(), 3);
  } catch (const std::bad_alloc&) {
    return say("out of memory (the sizes given passed the estimate of what this machine holds, "
               "but an allocation failed); make the run smaller",
               1);
  } catch (const c10::Error& e) {
    return say(e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return say(e.what(), 1);
  } catch (...) {
    return say("an unknown exception", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "muon — hybrid optimizers for LibTorch: a matrix algorithm (Muon, Dion) on the hidden "
      "matrices, an elementwise one (AdamW, Lion, ...) on the rest.\n"
      "Run `muon train` to train a small GPT on the King James Bible with the hybrid optimizer."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "muon " MUON_VERSION);
  std::vector<std::unique_ptr<muon::cli::Command>> commands;
  for (const auto make : {muon::cli::train_command, muon::cli::route_command,
                          muon::cli::compare_command, muon::cli::schedule_command,
                          muon::cli::bench_command}) {
    commands.push_back(make(app));
  }
  const std::vector<std::string> args(argv, argv + argc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: what was asked for
    const auto hint =
        muon::cli::did_you_mean(app, std::vector<std::string>(args.begin() + 1, args.end()));
    if (!hint.text.empty()) std::cerr << "error: " << hint.text << '\n';
    if (!hint.replaces_message) std::cerr << "error: " << e.what() << '\n';
    std::cerr << "Run with --help for more information.\n";
    return 2;  // a usage error, whichever CLI11 found (it numbers them 100 and up)
  }
  try {
    for (const auto& command : commands) {
      if (command->chosen()) return command->run(args);
    }
  } catch (...) {
    return report_failure(std::current_exception());
  }
  return 0;
}
