// SIGINT/SIGTERM for a training run: the first asks the loop to stop after the current step (it
// then checkpoints and prints how to resume); a second ends the process at once.
#pragma once

#include <string>

namespace muon::cli {

// Installs the handlers for as long as the guard lives (the previous ones come back after, unless
// a signal arrived: then they stay, for the process is stopping).
// `second_note` is printed to stderr when a second signal ends the process (what to do next).
class StopRequests {
 public:
  explicit StopRequests(const std::string& second_note = "");
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;

  static bool requested();  // a signal arrived since the guard was made
  static int signal();      // which (0: none)
};

}  // namespace muon::cli
