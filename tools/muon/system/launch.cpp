#include "system/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "muon/error.h"
#include "system/threads.h"

namespace muon::cli {
namespace {

constexpr int kInterrupted = 128 + SIGINT;  // muon train's exit code after a signal
constexpr int kLostCollective = 3;  // muon train's exit code for a failed collective (main.cpp)

// "the run failed on rank 0 of 2 (exit code 2); rank 1 failed after it (exit code 3)".
void report_failures(const std::vector<RankFailure>& failures, int nproc) {
  const auto& root = failure_cause(failures);
  std::cerr << "muon train: the run failed on rank " << root.rank << " of " << nproc
            << " (exit code " << root.code << ")";
  for (const auto& f : failures) {
    if (&f == &root) continue;
    std::cerr << "; rank " << f.rank << " failed after it (exit code " << f.code
              << (f.killed_by_launcher        ? ": killed by the launcher"
                  : f.code == kLostCollective ? ": a collective lost its peer"
                                              : "")
              << ")";
  }
  std::cerr << '\n';
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Signals to the launcher, passed on to every rank once each: the ranks run in their own process
// group, so a terminal's Ctrl-C reaches them through here and exactly once.
std::atomic<int> signals_received{0};
extern "C" void count_signal(int) {
  ++signals_received;
}

[[noreturn]] void exec_rank(int rank, int nproc, int port, const std::vector<std::string>& args) {
  ::setpgid(0, 0);
  const auto set = [](const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
  };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(rank));
  set("WORLD_SIZE", std::to_string(nproc));
  set("LOCAL_WORLD_SIZE", std::to_string(nproc));
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", std::to_string(port));
  // The CPUs this process may use (threads.h) shared among the ranks, for LibTorch's pool and
  // OpenBLAS's alike (torchrun sets OMP_NUM_THREADS likewise), unless the caller chose.
  const auto share = std::to_string(std::max(1, usable_cpus() / nproc));
  ::setenv("OMP_NUM_THREADS", share.c_str(), 0);
  ::setenv("OPENBLAS_NUM_THREADS", share.c_str(), 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::cerr << "launch: cannot run /proc/self/exe for rank " << rank << '\n';
  ::_exit(127);
}

}  // namespace

const RankFailure& failure_cause(const std::vector<RankFailure>& failures) {
  check(!failures.empty(), "failure_cause: no failures");
  const auto own = std::find_if(failures.begin(), failures.end(), [](const RankFailure& f) {
    return f.code != kLostCollective && !f.killed_by_launcher;
  });
  return own != failures.end() ? *own : failures.front();
}

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  check(fd >= 0, "launch: cannot open a socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  check(ok, "launch: cannot find a free port on 127.0.0.1");
  return ntohs(address.sin_port);
}

int launch_local_ranks(int nproc, const std::vector<std::string>& args,
                       std::chrono::milliseconds grace) {
  check(nproc >= 1, "--nproc must be >= 1, got ", nproc);
  const int port = free_local_port();
  std::map<pid_t, int> running;  // pid → rank
  struct sigaction forward {
  }, previous_int, previous_term;
  forward.sa_handler = count_signal;
  sigemptyset(&forward.sa_mask);
  ::sigaction(SIGINT, &forward, &previous_int);
  ::sigaction(SIGTERM, &forward, &previous_term);
  int forwarded = 0;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    check(pid >= 0, "launch: fork failed for rank ", rank);
    if (pid == 0) exec_rank(rank, nproc, port, args);
    running[pid] = rank;
  }
  using Clock = std::chrono::steady_clock;
  int result = 0;  // 0, or kInterrupted when a rank stopped on a signal
  std::vector<RankFailure> failures;
  std::set<pid_t> killed;  // by the launcher, past the grace
  Clock::time_point deadline = Clock::time_point::max();
  while (!running.empty()) {
    for (; forwarded < signals_received; ++forwarded) {
      for (const auto& [child, rank] : running) ::kill(child, SIGINT);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int rank = running.at(pid);
      running.erase(pid);
      const int code = exit_code(status);
      if (code == kInterrupted) {  // stopped by a signal after its checkpoint: not a failure
        result = code;
      } else if (code != 0) {
        if (failures.empty()) {
          std::cerr << "muon train: rank " << rank << " of " << nproc << " failed (exit code "
                    << code << "); waiting up to " << grace.count() / 1000.0
                    << " s for the others\n";
          deadline = Clock::now() + grace;
        }
        failures.push_back({rank, code, killed.count(pid) != 0});
      }
      continue;
    }
    if (Clock::now() > deadline) {
      for (const auto& [child, rank] : running) {
        std::cerr << "muon train: killing rank " << rank << ", still running after the failure\n";
        ::kill(child, SIGKILL);
        killed.insert(child);
      }
      deadline = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::sigaction(SIGINT, &previous_int, nullptr);
  ::sigaction(SIGTERM, &previous_term, nullptr);
  if (failures.empty()) return result;
  report_failures(failures, nproc);
  return failure_cause(failures).code;
}

std::vector<std::string> without_option(const std::vector<std::string>& args,
                                        const std::string& name) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      ++i;
    } else if (args[i].rfind(name + "=", 0) != 0) {
      out.push_back(args[i]);
    }
  }
  return out;
}

std::string rerun_with_openblas_unset(const std::vector<std::string>& args) {
  char path[] = "/tmp/muon-bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "";
  ::close(fd);
  auto child = without_option(args, "--json");
  child.insert(child.end(), {"--json", path, "--one-environment"});
  std::cout << "\n# The same run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset\n\n"
            << std::flush;
  const pid_t pid = fork();
  if (pid == 0) {
    ::unsetenv("OPENBLAS_CORETYPE");
    ::unsetenv("OPENBLAS_L2_SIZE");
    std::vector<char*> argv;
    for (auto& a : child) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  int status = 0;
  std::string text;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && exit_code(status) == 0) {
    std::ifstream file(path);
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  ::unlink(path);
  return text;
}

}  // namespace muon::cli
