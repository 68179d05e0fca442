// Errors thrown by muon-cpp. Every message names the offending parameter, key or file and says
// what would have been valid; nothing is modified before an error is thrown.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace muon {

// Invalid input from the caller (bad tensor, option, config value or name).
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throws muon::Error with the parts streamed together when `condition` is false.
template <class... Parts>
void check(bool condition, Parts&&... parts) {
  if (!condition) throw Error(detail::concat(std::forward<Parts>(parts)...));
}

// Returns f(); a muon::Error it throws comes out prefixed with "<where>: " (the key path or file
// the failing value came from).
template <class F>
auto with_context(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
}

}  // namespace muon
