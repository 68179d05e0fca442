// The optimizer configurations of examples/*.yaml, built into the program (generated at build
// time by cmake/embed_examples.cmake), so that `muon compare --optimizers adamw,muon` works
// wherever muon is installed.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace muon::cli {

// (name, YAML text) of every example optimizer configuration, by name.
const std::vector<std::pair<std::string, std::string>>& builtin_examples();

}  // namespace muon::cli
