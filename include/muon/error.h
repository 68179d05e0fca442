// Errors thrown by muon-cpp. Every message names the offending parameter, key or file and says
// what would have been valid; nothing is modified before an error is thrown.
#pragma once

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace muon {

namespace detail {
// The length of the well-formed UTF-8 sequence at text[i] and its code point; 0 when the bytes
// there are not one (a stray continuation byte, an overlong form, a surrogate, a cut sequence).
inline size_t utf8_sequence(const std::string& text, size_t i, char32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return code_point = lead, 1;
  const size_t length = lead >= 0xc2 && lead <= 0xdf ? 2 : lead >= 0xe0 && lead <= 0xef ? 3
                        : lead >= 0xf0 && lead <= 0xf4                                   ? 4
                                                                                         : 0;
  if (length == 0 || i + length > text.size()) return 0;
  // The second byte's range excludes overlong forms, surrogates and code points past U+10FFFF.
  const unsigned char low = lead == 0xe0 ? 0xa0 : lead == 0xf0 ? 0x90 : 0x80;
  const unsigned char high = lead == 0xed ? 0x9f : lead == 0xf4 ? 0x8f : 0xbf;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  code_point = lead & (0xff >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code_point = code_point << 6 | (byte(i + k) & 0x3f);
  }
  return length;
}
}  // namespace detail

// `text` as it can be shown anywhere: newlines, tabs and printable UTF-8 kept; control characters
// (C0, DEL, C1) written as \xNN or \uNNNN, and bytes that are not UTF-8 as \xNN. Values quoted in
// messages come from users' files; a NUL would cut the message short and a stray byte would make
// it undecodable in Python.
inline std::string readable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    char32_t c = 0;
    const size_t length = detail::utf8_sequence(text, i, c);
    const bool control = c < 0x20 ? c != '\n' && c != '\t' : c >= 0x7f && c <= 0x9f;
    if (length > 0 && !control) {
      out.append(text, i, length);
      i += length;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, length == 2 ? "\\u%04x" : "\\x%02x",
                  length == 2 ? static_cast<unsigned>(c) : static_cast<unsigned char>(text[i]));
    out += escaped;
    i += length > 0 ? length : 1;
  }
  return out;
}

// Invalid input from the caller (bad tensor, option, config value or name). The message is kept
// readable (see `readable`).
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(readable(message)) {}
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
