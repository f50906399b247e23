#pragma once
/// \file
/// The one reader of config mappings: a run config's sections, a transform's
/// arguments, a network's, a loss's, an optimizer's, a schedule's, the sliding
/// window's, the data pipeline's.
///
/// Every key is read with the type of the field it fills; an absent (or null)
/// key leaves the field at its struct default (read(key, field)), so defaults
/// live in one place, the options struct. finish() refuses any key nobody read,
/// listing the known ones. Every error is a ConfigError that names where the
/// mapping came from and the key:
///   Style::path      "validation.sliding_window.overlap: expected a number, got \"half\""
///                    "optimizer.momentum: unknown argument for Adam (known: lr, betas, ...)"
///   Style::top       "run.yaml: trian: unknown section (known: data, model, ...)"
///   Style::argument  "Spacing: argument pixdim: expected ... (arguments given: keys, pixdim)"
///                    "Spacing: unknown argument 'pixdims' (known: keys, pixdim, mode)"
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "medfast/core/error.hpp"

namespace medfast {

/// The largest magnitude of a number in a config (float32's largest, about 3.4e38): the
/// numbers reach float32 tensors (a learning rate of 1e300 would overflow in the first
/// update, far from the key that set it).
inline constexpr double kMaxConfigNumber = static_cast<double>(std::numeric_limits<float>::max());

/// A config value that is missing, of the wrong type, unknown or out of range.
class ConfigError : public ValueError {
 public:
  using ValueError::ValueError;
};

class ConfigReader {
 public:
  enum class Style { path, argument, top };
  struct Naming {
    Style style = Style::path;
    std::string noun = "key";  ///< what unknown keys are called: "key" or "argument"
    std::string owner;         ///< "... unknown argument for <owner>" (an optimizer's name)
  };

  /// `mapping` may be null (nothing set: every field keeps its default).
  ConfigReader(const nlohmann::json& mapping, std::string where, Naming naming);
  ConfigReader(const nlohmann::json& mapping, std::string where, Style style = Style::path);

  const std::string& where() const { return where_; }
  /// "<where>.<key>", "<where>: <key>" (top) or "<where>: argument <key>".
  std::string name(const std::string& key) const;
  bool has(const std::string& key) const;
  /// The value (null if absent); the key counts as known.
  const nlohmann::json& raw(const std::string& key);
  /// Marks keys read by other means as known.
  void known(const std::string& key);
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  /// ConfigError if a key was never read.
  void finish() const;
  /// The keys of the mapping not read so far, in its order.
  std::vector<std::string> unread() const;
  /// finish(), then options.validate(): a ValueError from it becomes a ConfigError
  /// prefixed with where the mapping came from ("<where><separator><message>").
  template <typename Options>
  void finish(const Options& options, const char* separator = ": ") const {
    finish();
    try {
      options.validate();
    } catch (const ConfigError&) {
      throw;
    } catch (const ValueError& e) {
      throw ConfigError(str(where_, separator, e.message()));
    }
  }

  /// Fills `field` from `key` when present (bool, whole numbers, numbers, text,
  /// lists and fixed-size arrays of those); otherwise leaves it as it is.
  template <typename T>
  ConfigReader& read(const std::string& key, T& field) {
    const nlohmann::json& v = raw(key);
    if (v.is_null()) return *this;
    std::string why;
    if (!convert(v, field, why)) {
      fail(key, why.empty() ? str("expected ", describe(field), ", got ", v.dump(), numeric_text_hint(v)) : why);
    }
    return *this;
  }
  /// For a string that reads as a number (a YAML 1.1 reader such as PyYAML keeps 1e-05 as
  /// text): what to write instead; "" otherwise.
  static std::string numeric_text_hint(const nlohmann::json& v);
  /// The number `v` (read from `key`) as T: ConfigError naming the key and T's limits
  /// where it does not fit (checked before narrowing, see range_problem).
  template <typename T>
  T narrow(const std::string& key, const nlohmann::json& v) const {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "ConfigReader::narrow: a number type");
    const std::string why = range_problem<T>(v);
    if (!why.empty()) fail(key, why);
    return v.get<T>();
  }
  /// Why the number `v` does not fit T ("" where it does): whole numbers outside T's range
  /// (a batch_size of 1e12 is not an int), and numbers that are not finite or are larger in
  /// magnitude than kMaxConfigNumber.
  template <typename T>
  static std::string range_problem(const nlohmann::json& v) {
    if constexpr (std::is_integral_v<T>) {
      using limits = std::numeric_limits<T>;
      long double x = 0;  // exact for every 64-bit whole number
      if (v.is_number_unsigned()) x = static_cast<long double>(v.get<std::uint64_t>());
      else if (v.is_number_integer()) x = static_cast<long double>(v.get<std::int64_t>());
      else x = static_cast<long double>(v.get<double>());
      if (x >= static_cast<long double>(limits::min()) && x <= static_cast<long double>(limits::max())) return "";
      return str(v.dump(), " is out of range: expected a whole number in ", +limits::min(), "..", +limits::max());
    } else {
      const double x = v.get<double>();
      if (!std::isfinite(x)) return str("expected a finite number, got ", v.dump());
      if (std::fabs(x) <= kMaxConfigNumber) return "";
      return str(v.dump(), " is out of range: expected a number of magnitude at most ", kMaxConfigNumber,
                 " (float32's largest: the tensors it reaches are float32)");
    }
  }
  /// The value of `key`, or `fallback` when absent.
  template <typename T>
  T get(const std::string& key, T fallback) {
    read(key, fallback);
    return fallback;
  }

  // Forms the transforms use: one value standing for n, required lists.
  std::string text(const std::string& key, const std::string& fallback) { return get(key, fallback); }
  double number(const std::string& key, double fallback) { return get(key, fallback); }
  std::int64_t integer(const std::string& key, std::int64_t fallback) { return get(key, fallback); }
  bool flag(const std::string& key, bool fallback) { return get(key, fallback); }
  /// Required: a key name or a list of them (the sample keys a transform works on).
  std::vector<std::string> keys(const std::string& key = "keys");
  /// n numbers: a list of n, or one number standing for all; required without a fallback.
  std::vector<double> numbers(const std::string& key, std::size_t n);
  std::vector<double> numbers(const std::string& key, std::size_t n, const std::vector<double>& fallback);
  std::vector<std::int64_t> integers(const std::string& key, std::size_t n);
  std::vector<std::int64_t> integers(const std::string& key, std::size_t n, const std::vector<std::int64_t>& fallback);
  /// A value per sample key: one string for all, or a list as long as `count`.
  std::vector<std::string> per_key(const std::string& key, const std::string& fallback, std::size_t count);

 private:
  // False where `v` is not a T; `why` says so where the type is right and the value is not
  // (out of range), else the caller's "expected <type>, got <value>" applies.
  template <typename T>
  static bool convert(const nlohmann::json& v, T& out, std::string& why) {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) return false;
      out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      // Some YAML writers emit 50 as 50.0: a whole float is a whole number.
      if (v.is_number_float() && !(std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()))) {
        return false;
      }
      if (!v.is_number()) return false;
      if (std::is_unsigned_v<T> && !v.is_number_unsigned() && v.get<double>() < 0) return false;
      why = range_problem<T>(v);
      if (!why.empty()) return false;
      out = v.is_number_float() ? static_cast<T>(v.get<double>()) : v.get<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) return false;
      why = range_problem<T>(v);
      if (!why.empty()) return false;
      out = v.get<T>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) return false;
      out = v.get<std::string>();
    } else if constexpr (std::is_same_v<T, nlohmann::json>) {  // checked by its reader (several forms)
      out = v;
    } else if constexpr (is_vector<T>::value) {
      if (!v.is_array()) return false;
      T items(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!convert(v[i], items[i], why)) return false;
      }
      out = std::move(items);
    } else if constexpr (is_array<T>::value) {
      if (!v.is_array() || v.size() != std::tuple_size<T>::value) return false;
      T items{};
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!convert(v[i], items[i], why)) return false;
      }
      out = items;
    } else {
      static_assert(sizeof(T) == 0, "ConfigReader::read: unsupported field type");
    }
    return true;
  }
  template <typename T>
  static std::string describe(const T& field) {
    if constexpr (std::is_same_v<T, bool>) {
      return "true or false";
    } else if constexpr (std::is_integral_v<T>) {
      return std::is_unsigned_v<T> ? "a whole number >= 0" : "a whole number";
    } else if constexpr (std::is_floating_point_v<T>) {
      return "a number";
    } else if constexpr (std::is_same_v<T, std::string>) {
      return "text";
    } else if constexpr (std::is_same_v<T, nlohmann::json>) {
      return "a value";
    } else if constexpr (is_vector<T>::value) {
      return "a list of " + plural(typename T::value_type{});
    } else {
      (void)field;
      return str("a list of ", std::tuple_size<T>::value, " ", plural(typename T::value_type{}));
    }
  }
  template <typename T>
  static std::string plural(const T&) {
    if constexpr (std::is_same_v<T, bool>) return "true/false values";
    else if constexpr (std::is_integral_v<T>) return "whole numbers";
    else if constexpr (std::is_floating_point_v<T>) return "numbers";
    else return "texts";
  }
  template <typename T>
  struct is_vector : std::false_type {};
  template <typename T, typename A>
  struct is_vector<std::vector<T, A>> : std::true_type {};
  template <typename T>
  struct is_array : std::false_type {};
  template <typename T, std::size_t N>
  struct is_array<std::array<T, N>> : std::true_type {};

  nlohmann::json mapping_;
  std::string where_;
  Naming naming_;
  std::vector<std::string> read_;
};

}  // namespace medfast
