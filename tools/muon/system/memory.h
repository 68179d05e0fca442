// Sizes taken from the user (model shape, batch, context, benchmark widths) are checked against
// the machine's memory before anything is allocated, so a typo is an error message, not an
// allocation failure minutes later.
#pragma once

#include <string>

namespace muon::cli {

// The bytes a command may plan to use: the machine's physical memory, or MUON_MEMORY_LIMIT (GiB)
// when set.
double memory_limit_bytes();

// Throws muon::Error when `bytes` (an estimate) exceed memory_limit_bytes():
// "<what> needs about N GiB (<detail>), more than the M GiB this machine has; make <smaller>
// smaller (or set MUON_MEMORY_LIMIT=GiB to try anyway)".
void check_memory_need(double bytes, const std::string& what, const std::string& detail,
                       const std::string& smaller);

}  // namespace muon::cli
