#pragma once
/// \file
/// An options struct's fields (core/fields.hpp) as settings: each field `key` is the setting
/// `<prefix><key>` (name, default, help and what is valid, all from the field), read back
/// into the options from resolved Settings, and set from text (a flag, a keyword argument).
/// So an options struct whose fields are settings (io::IoOptions: io_*) declares them once.
///
/// Types: a flag (bool) is the choice on | off; a whole number with range() is an integer
/// in that range; a size with bytes() takes "64K", "1M", "1G"; text with one_of() is a
/// choice of those names; other text is free text.
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/core/settings.hpp"

namespace medfast {

namespace detail {

/// A setting of each kind a field can be, named `name` (field_settings.cpp).
SettingDef flag_setting(const std::string& name, const char* help, bool default_value);
/// `bytes`: a size ("64K", "1M"); else a whole number in [lo, hi].
SettingDef whole_setting(const std::string& name, const char* help, std::int64_t default_value, bool bytes,
                         std::int64_t lo, std::int64_t hi);
/// `names` ("a,b,c", or null: any text).
SettingDef text_setting(const std::string& name, const char* help, const std::string& default_value,
                        const char* names);

template <typename T, typename M>
SettingDef setting_def_of(const Field<T, M>& f, const M& default_value, const std::string& prefix) {
  if constexpr (std::is_same_v<M, bool>) {
    return flag_setting(prefix + f.key, f.help, default_value);
  } else if constexpr (std::is_integral_v<M>) {
    if (!f.byte_size && !f.ranged) throw Error(str("options field ", f.key, ": a whole-number setting needs range() or bytes()"));
    return whole_setting(prefix + f.key, f.help, static_cast<std::int64_t>(default_value), f.byte_size, f.lo, f.hi);
  } else if constexpr (std::is_same_v<M, std::string>) {
    return text_setting(prefix + f.key, f.help, default_value, f.names);
  } else {
    static_assert(std::is_same_v<M, bool>, "a setting field is a flag, a whole number or text");
  }
}

}  // namespace detail

/// The settings of T's fields, `<prefix><key>`, in declaration order, defaults from T{}.
template <typename T>
std::vector<SettingDef> setting_defs_of(const std::string& prefix) {
  std::vector<SettingDef> defs;
  const T defaults{};
  std::apply([&](const auto&... f) { (defs.push_back(detail::setting_def_of(f, defaults.*(f.member), prefix)), ...); },
             T::fields());
  return defs;
}

/// T's fields from the resolved settings `<prefix><key>`.
template <typename T>
T options_from_settings(const Settings& s, const std::string& prefix) {
  T o;
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              auto& value = o.*(f.member);
              using M = std::decay_t<decltype(value)>;
              const std::string name = prefix + f.key;
              if constexpr (std::is_same_v<M, bool>) {
                value = s.get_bool(name);
              } else if constexpr (std::is_integral_v<M>) {
                value = static_cast<M>(f.byte_size ? static_cast<std::int64_t>(s.get_bytes(name)) : s.get_int(name));
              } else {
                value = s.get(name);
              }
            }(),
            ...);
      },
      T::fields());
  return o;
}

}  // namespace medfast
