#include "medfast/core/field_settings.hpp"

namespace medfast::detail {

SettingDef flag_setting(const std::string& name, const char* help, bool default_value) {
  SettingDef d;
  d.name = name;
  d.description = help;
  d.kind = SettingKind::choice;
  d.choices = {"on", "off"};
  d.default_value = default_value ? "on" : "off";
  return d;
}

SettingDef whole_setting(const std::string& name, const char* help, std::int64_t default_value, bool bytes,
                         std::int64_t lo, std::int64_t hi) {
  SettingDef d;
  d.name = name;
  d.description = help;
  d.default_value = std::to_string(default_value);
  if (bytes) {
    d.kind = SettingKind::bytes;
  } else {
    d.kind = SettingKind::integer;
    d.min = lo;
    d.max = hi;
  }
  return d;
}

SettingDef text_setting(const std::string& name, const char* help, const std::string& default_value,
                        const char* names) {
  SettingDef d;
  d.name = name;
  d.description = help;
  d.default_value = default_value;
  if (names) {
    d.kind = SettingKind::choice;
    d.choices = names_list(names);
  }
  return d;
}

}  // namespace medfast::detail
