#pragma once
/// \file
/// Name -> factory tables (transforms, networks, I/O backends): a constant array of
/// {name, factory} rows that lookups, name lists and messages read. The rows reference
/// their factories, so a static link keeps every entry (no registration by static
/// initialisers that a linker may drop).
#include <cstddef>
#include <string>
#include <vector>

/// A row of a table listed once as an X-macro, LIST(X) with X("Name", entry) rows:
///   constexpr Registered<Entry> kTable[] = {LIST(MEDFAST_REGISTRY_ROW)};
/// A new entry is its definition (in its own file) and one row of LIST.
#define MEDFAST_REGISTRY_ROW(name, entry) {name, &entry},

namespace medfast {

/// One row of a table: the name users write, and what makes the thing.
template <typename Factory>
struct Registered {
  const char* name;
  Factory make;
};

/// The row named `name`, or nullptr.
template <typename Row, std::size_t N>
const Row* find_registered(const Row (&table)[N], const std::string& name) {
  for (const Row& row : table) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

/// The names, in the table's order.
template <typename Row, std::size_t N>
std::vector<std::string> registered_names(const Row (&table)[N]) {
  std::vector<std::string> names;
  for (const Row& row : table) names.push_back(row.name);
  return names;
}

/// "a, b, c"; with `last` = " or ": "a, b or c" (for messages).
template <typename Row, std::size_t N>
std::string registered_text(const Row (&table)[N], const char* last = ", ") {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? last : ", ";
    out += table[i].name;
  }
  return out;
}

}  // namespace medfast
