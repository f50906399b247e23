#pragma once
/// \file
/// Closed sets of names as enums, parsed at the edge. An enum lists its names once, next
/// to it, in a `choices` function found by argument-dependent lookup:
///
///   enum class Blend { constant, gaussian };
///   constexpr std::array<Choice<Blend>, 2> choices(Blend) {
///     return {{{Blend::constant, "constant"}, {Blend::gaussian, "gaussian"}}};
///   }
///
/// Reading a config turns the text into the enum (case-insensitive, as MONAI compares
/// names) or fails with the list of names; writing back, the key tables of the docs and
/// messages use the same names (name_of, choice_list). Code past the edge switches on
/// the enum and never compares text.
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "medfast/core/error.hpp"

namespace medfast {

/// One name of the enum E.
template <typename E>
struct Choice {
  E value;
  const char* name;
};

namespace detail {
template <typename E, typename = void>
struct has_choices : std::false_type {};
template <typename E>
struct has_choices<E, std::void_t<decltype(choices(std::declval<E>()))>> : std::is_enum<E> {};
}  // namespace detail

/// Whether E is an enum with a `choices` list (what the field readers parse as a name).
template <typename E>
inline constexpr bool is_choice_v = detail::has_choices<E>::value;

/// The name of `value` ("" for a value outside the list: a cast, never a parsed one).
template <typename E>
const char* name_of(E value) {
  for (const auto& c : choices(value)) {
    if (c.value == value) return c.name;
  }
  return "";
}

namespace detail {
/// Whether `text` names `name`, case-insensitively (as MONAI compares its names).
bool same_name(std::string_view text, const char* name);
}  // namespace detail

/// The value named `text` (case-insensitive), or nullopt.
template <typename E>
std::optional<E> parse_choice(std::string_view text) {
  for (const auto& c : choices(E{})) {
    if (detail::same_name(text, c.name)) return c.value;
  }
  return std::nullopt;
}

/// "a | b | c": every name of E, in declaration order (for messages and key tables).
template <typename E>
std::string choice_list() {
  std::string out;
  for (const auto& c : choices(E{})) {
    if (!out.empty()) out += " | ";
    out += c.name;
  }
  return out;
}

}  // namespace medfast
