#include "training/signals.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <csignal>

namespace muon::cli {

namespace {

std::atomic<int> received{0};
struct sigaction previous_int, previous_term;
char note[1024];  // the second signal's message, set before the handler is installed
size_t note_size = 0;

extern "C" void on_signal(int number) {
  if (received.exchange(number) != 0) {
    // The second signal: stop now. Checkpoints and metrics are written through a temporary file
    // and a rename, so nothing on disk is half-written. write() is async-signal-safe.
    if (note_size > 0 && write(STDERR_FILENO, note, note_size) < 0) {
      // nothing more can be done from a signal handler
    }
    _exit(128 + number);
  }
}

}  // namespace

StopRequests::StopRequests(const std::string& second_note) {
  received = 0;
  note_size = std::min(second_note.size(), sizeof note);
  std::memcpy(note, second_note.data(), note_size);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

StopRequests::~StopRequests() {
  // After a signal the process is on its way out: a later one still gets the note and exit
  // status 128 + signal rather than the default disposition's silent kill.
  if (received.load() != 0) return;
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool StopRequests::requested() {
  return received.load() != 0;
}

int StopRequests::signal() {
  return received.load();
}

}  // namespace muon::cli
