// `muon train --nproc N`: N local ranks of this program on loopback, torchrun style.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace muon::cli {

// Runs `args` (argv of this program, --nproc removed) as `nproc` child processes with RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set, and
// waits for them. When one fails, the others get `grace` to fail on their own (their collectives
// time out) before they are killed. Returns 0 when every rank succeeded, else the exit code of the
// failure that caused the others (128 + signal for a killed rank): failure_cause() — named on
// stderr with the failures that followed it.
int launch_local_ranks(int nproc, const std::vector<std::string>& args,
                       std::chrono::milliseconds grace);

// A rank's exit code other than 0, in the order the launcher reaped it.
struct RankFailure {
  int rank;
  int code;
  bool killed_by_launcher = false;  // still running past the grace after another's failure
};
// The failure that caused the others: a rank whose collective failed (exit 3) usually lost its
// peer to another rank's error, and may be reaped first, and a rank the launcher killed only
// outlived the grace; so the first failure of another kind, else the first.
const RankFailure& failure_cause(const std::vector<RankFailure>& failures);

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick for port 0).
int free_local_port();

// Runs this program again with `args` (its argv; --json dropped) plus --json to a temporary file
// and --one-environment, with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment
// (OpenBLAS reads them once, when it loads), and returns that file's text ("" if the run failed).
// Its output goes to this program's.
std::string rerun_with_openblas_unset(const std::vector<std::string>& args);

// `args` without option `name` and its value (given as "NAME VALUE" or "NAME=VALUE").
std::vector<std::string> without_option(const std::vector<std::string>& args,
                                        const std::string& name);

}  // namespace muon::cli
