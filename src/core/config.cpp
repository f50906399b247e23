#include "medfast/core/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace medfast {

std::string ConfigReader::numeric_text_hint(const nlohmann::json& v) {
  if (!v.is_string()) return "";
  const std::string t = v.get<std::string>();
  char* end = nullptr;
  errno = 0;
  (void)std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || errno != 0) return "";
  return str(" (text, not a number: write it without quotes; a YAML 1.1 reader such as PyYAML reads 1e-05 as text, "
             "1.0e-05 as a number)");
}

ConfigReader::ConfigReader(const nlohmann::json& mapping, std::string where, Naming naming)
    : mapping_(mapping.is_null() ? nlohmann::json::object() : mapping),
      where_(std::move(where)),
      naming_(std::move(naming)) {
  if (!mapping_.is_object()) {
    throw ConfigError(str(where_, naming_.style == Style::argument ? ": arguments must be a mapping, got "
                                                                    : ": expected a mapping, got ",
                          mapping_.dump()));
  }
}

ConfigReader::ConfigReader(const nlohmann::json& mapping, std::string where, Style style)
    : ConfigReader(mapping, std::move(where), Naming{style, style == Style::argument ? "argument" : "key", ""}) {}

std::string ConfigReader::name(const std::string& key) const {
  switch (naming_.style) {
    case Style::argument: return str(where_, ": argument ", key);
    case Style::top: return str(where_, ": ", key);
    case Style::path: break;
  }
  return str(where_, ".", key);
}

bool ConfigReader::has(const std::string& key) const { return mapping_.contains(key) && !mapping_[key].is_null(); }

const nlohmann::json& ConfigReader::raw(const std::string& key) {
  known(key);
  static const nlohmann::json null;
  const auto it = mapping_.find(key);
  return it == mapping_.end() ? null : *it;
}

void ConfigReader::known(const std::string& key) {
  if (std::find(read_.begin(), read_.end(), key) == read_.end()) read_.push_back(key);
}

void ConfigReader::fail(const std::string& key, const std::string& what) const {
  if (naming_.style == Style::argument) {
    std::vector<std::string> given;
    for (const auto& [k, v] : mapping_.items()) given.push_back(k);
    throw ConfigError(str(name(key), ": ", what, " (arguments given: ", given.empty() ? "none" : join(given), ")"));
  }
  throw ConfigError(str(name(key), ": ", what));
}

std::vector<std::string> ConfigReader::unread() const {
  std::vector<std::string> keys;
  for (const auto& [k, v] : mapping_.items()) {
    if (std::find(read_.begin(), read_.end(), k) == read_.end()) keys.push_back(k);
  }
  return keys;
}

void ConfigReader::finish() const {
  for (const auto& [k, v] : mapping_.items()) {
    if (std::find(read_.begin(), read_.end(), k) != read_.end()) continue;
    std::vector<std::string> known_keys;
    for (const auto& r : read_) {
      if (r != "name") known_keys.push_back(r);
    }
    const std::string known = known_keys.empty() ? " (it takes none)" : str(" (known: ", join(known_keys), ")");
    const std::string owner = naming_.owner.empty() ? "" : " for " + naming_.owner;
    if (naming_.style == Style::argument) {
      throw ConfigError(str(where_, ": unknown ", naming_.noun, " '", k, "'", owner, known));
    }
    throw ConfigError(str(name(k), ": unknown ", naming_.noun, owner, known));
  }
}

std::vector<std::string> ConfigReader::keys(const std::string& key) {
  const nlohmann::json& v = raw(key);
  if (v.is_null()) fail(key, "is required (the sample keys to transform)");
  if (v.is_string()) return {v.get<std::string>()};
  if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); })) {
    return v.get<std::vector<std::string>>();
  }
  fail(key, str("expected a key or a list of keys, got ", v.dump()));
}

std::vector<double> ConfigReader::numbers(const std::string& key, std::size_t n) {
  const nlohmann::json& v = raw(key);
  if (v.is_null()) fail(key, str("is required (", n, " numbers)"));
  if (v.is_number()) return std::vector<double>(n, narrow<double>(key, v));
  if (!v.is_array() || v.size() != n || !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number(); })) {
    fail(key, str("expected a number or a list of ", n, " numbers, got ", v.dump()));
  }
  std::vector<double> out;
  for (const auto& x : v) out.push_back(narrow<double>(key, x));
  return out;
}

std::vector<std::int64_t> ConfigReader::integers(const std::string& key, std::size_t n) {
  const nlohmann::json& v = raw(key);
  if (v.is_null()) fail(key, str("is required (", n, " whole numbers)"));
  if (v.is_number_integer()) return std::vector<std::int64_t>(n, narrow<std::int64_t>(key, v));
  if (!v.is_array() || v.size() != n ||
      !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number_integer(); })) {
    fail(key, str("expected a whole number or a list of ", n, " of them, got ", v.dump()));
  }
  std::vector<std::int64_t> out;
  for (const auto& x : v) out.push_back(narrow<std::int64_t>(key, x));
  return out;
}

std::vector<double> ConfigReader::numbers(const std::string& key, std::size_t n, const std::vector<double>& fallback) {
  if (has(key)) return numbers(key, n);
  known(key);
  return fallback;
}

std::vector<std::int64_t> ConfigReader::integers(const std::string& key, std::size_t n,
                                                 const std::vector<std::int64_t>& fallback) {
  if (has(key)) return integers(key, n);
  known(key);
  return fallback;
}

std::vector<std::string> ConfigReader::per_key(const std::string& key, const std::string& fallback, std::size_t count) {
  const nlohmann::json& v = raw(key);
  if (v.is_null()) return std::vector<std::string>(count, fallback);
  if (v.is_string()) return std::vector<std::string>(count, v.get<std::string>());
  if (v.is_array() && v.size() == count &&
      std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); })) {
    return v.get<std::vector<std::string>>();
  }
  fail(key, str("expected one value or a list of ", count, " (one per key), got ", v.dump()));
}

}  // namespace medfast
