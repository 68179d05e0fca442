// One table of names per enum, read both ways: to_string, parsing and the error that lists the
// valid names all come from it. Each enum specializes EnumNames next to its declaration:
//
//   template <> struct EnumNames<Role> {
//     static constexpr const char* noun = "optimizer role";  // "unknown optimizer role 'sgd'"
//     static constexpr const char* plural = "roles";          // "valid roles are ..."
//     static constexpr std::array<std::pair<Role, const char*>, 3> table{
//         {{Role::matrices, "matrices"}, {Role::others, "others"}, {Role::frozen, "frozen"}}};
//   };
#pragma once

#include <array>
#include <string>
#include <utility>

#include "muon/error.h"

namespace muon {

template <class E>
struct EnumNames;

template <class E>
std::string enum_name(E value) {
  for (const auto& [v, name] : EnumNames<E>::table) {
    if (v == value) return name;
  }
  return "?";
}

// "a, b, c": the valid names in table order.
template <class E>
std::string enum_name_list() {
  std::string out;
  for (const auto& entry : EnumNames<E>::table)
    out += (out.empty() ? "" : ", ") + std::string(entry.second);
  return out;
}

// The value named `name`. Otherwise a muon::Error: "expected a or b, got 'x'" for two names,
// "unknown <noun> 'x'; valid <plural> are a, b, c" for more.
template <class E>
E enum_from_name(const std::string& name) {
  const auto& table = EnumNames<E>::table;
  for (const auto& [v, n] : table) {
    if (name == n) return v;
  }
  if (table.size() == 2) {
    throw Error(detail::concat("expected ", table[0].second, " or ", table[1].second, ", got '",
                               name, "'"));
  }
  throw Error(detail::concat("unknown ", EnumNames<E>::noun, " '", name, "'; valid ",
                             EnumNames<E>::plural, " are ", enum_name_list<E>()));
}

}  // namespace muon
