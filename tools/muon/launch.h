// `muon train --nproc N`: N local ranks of this program on loopback, torchrun style.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace muon::demo {

// Runs `args` (argv of this program, --nproc removed) as `nproc` child processes with RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set, and
// waits for them. When one fails, the others get `grace` to fail on their own (their collectives
// time out) before they are killed. Returns 0 when every rank succeeded, else the first failure's
// exit code (128 + signal for a killed rank).
int launch_local_ranks(int nproc, const std::vector<std::string>& args,
                       std::chrono::milliseconds grace);

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

}  // namespace muon::demo
