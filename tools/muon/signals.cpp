#include "signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace muon::demo {

namespace {

std::atomic<int> received{0};
struct sigaction previous_int, previous_term;

extern "C" void on_signal(int number) {
  if (received.exchange(number) != 0) {
    // The second signal: stop now. Checkpoints and metrics are written through a temporary file
    // and a rename, so nothing on disk is half-written.
    _exit(128 + number);
  }
}

}  // namespace

StopRequests::StopRequests() {
  received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

StopRequests::~StopRequests() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool StopRequests::requested() {
  return received.load() != 0;
}

int StopRequests::signal() {
  return received.load();
}

}  // namespace muon::demo
