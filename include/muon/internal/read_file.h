// Reading a whole file named by the user (a config, a training text): a missing file, a directory
// or a failed read is an error naming the file and why, never an empty text read as if it were
// the file's (an ifstream opens a directory without complaint).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "muon/error.h"

namespace muon::detail {

// The bytes of `path`; errors read "<what>: cannot read '<path>': <why><hint>".
inline std::string read_file(const std::string& path, const std::string& what,
                             const std::string& hint = "") {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error(what + ": cannot read '" + path + "': " +
                (std::filesystem::exists(path, error) ? "it is not a regular file"
                                                      : "it does not exist") +
                hint);
  }
  std::ifstream file(path, std::ios::binary);
  std::ostringstream content;
  if (file.peek() != std::ifstream::traits_type::eof()) content << file.rdbuf();
  check(file.good() || file.eof(), what, ": cannot read '", path, "'", hint);
  return content.str();
}

}  // namespace muon::detail
