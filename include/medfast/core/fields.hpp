#pragma once
/// \file
/// One declaration per option: an options struct lists its fields once, with the key,
/// the member it fills and a help line,
///
///   struct UNetOptions {
///     std::int64_t in_channels = 1;
///     std::string norm = "instance";
///     static constexpr auto fields() {
///       return std::make_tuple(field("in_channels", &UNetOptions::in_channels, "input channels"),
///                              field("norm", &UNetOptions::norm, "instance | batch | none").lowercase());
///     }
///   };
///
/// Options of a family whose members take different arguments (optimizers, schedules)
/// mark a field with the kinds it belongs to, `.in("Adam,AdamW")`; the kind-taking
/// overloads below read, write and document only the fields of that kind.
///
/// A field whose member is an enum with a `choices` list (core/choices.hpp) reads its
/// name (case-insensitive; anything else is an error listing the names), writes it
/// back, and its key table row ends with the names; a list of them per sample key with
/// each_key() likewise.
///
/// Reading a mapping (read_fields: with ConfigReader's typed reads and messages),
/// writing the options back with every default filled in (fields_json) and the key
/// table of the docs (field_docs) all come from that list. Defaults stay where they
/// are declared: the struct's member initialisers.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "medfast/core/choices.hpp"
#include "medfast/core/config.hpp"

namespace medfast {

/// One field of the options struct T: its key, the member M it fills, a help line.
template <typename T, typename M>
struct Field {
  const char* key;
  M T::*member;
  const char* help;
  bool lower = false;  ///< text matched case-insensitively: stored lowercase
  int repeat = 0;      ///< > 0: one number may stand for a list of `repeat` (MONAI's ensure_tuple_rep)
  const char* kinds = "";  ///< "A,B": the field belongs to these kinds only ("": to every kind)
  bool required = false;   ///< absent is an error ("is required")
  bool sample_keys = false;  ///< a transform's keys: one key or a non-empty list of keys, required
  const char* per_key = nullptr;  ///< one value per key of options.keys: one value stands for all; absent: this
  bool symmetric_range = false;  ///< a [lo, hi] pair where one number x stands for [-x, x] (MONAI's ranges)
  bool when_set = false;  ///< written back (fields_json) only where it is not its default
  bool ranged = false;     ///< a whole number in [lo, hi]
  std::int64_t lo = 0, hi = 0;
  const char* names = nullptr;  ///< text that is one of these ("a,b,c")
  bool byte_size = false;  ///< a size in bytes: as a setting, also "64K", "1M", "1G"

  /// The text is stored lowercase ("Batch" reads as "batch"), as MONAI compares names.
  constexpr Field lowercase() const {
    Field f = *this;
    f.lower = true;
    return f;
  }
  /// A list that may also be given as one number, standing for `n` copies of it.
  constexpr Field repeats(int n) const {
    Field f = *this;
    f.repeat = n;
    return f;
  }
  /// Absent is an error naming the key.
  constexpr Field must() const {
    Field f = *this;
    f.required = true;
    return f;
  }
  /// The sample keys a transform works on: one key or a list (MONAI's KeysCollection).
  constexpr Field keys() const {
    Field f = *this;
    f.sample_keys = true;
    f.required = true;
    return f;
  }
  /// Sample keys as keys() reads them, optional: absent, the member's default (LabelToRegions'
  /// ["label"]).
  constexpr Field keys_or_default() const {
    Field f = *this;
    f.sample_keys = true;
    return f;
  }
  /// One text per key of the options' `keys` (read before it): one text stands for every
  /// key, absent is `fallback` for every key (MONAI's per-key arguments).
  constexpr Field each_key(const char* fallback) const {
    Field f = *this;
    f.per_key = fallback;
    return f;
  }
  /// A range [lo, hi] (std::array of 2 numbers) that may be given as one number x,
  /// standing for [-x, x], as MONAI's factors, offsets and rotation ranges.
  constexpr Field symmetric() const {
    Field f = *this;
    f.symmetric_range = true;
    return f;
  }
  /// Written back only where it differs from its default: an option added after configs
  /// written back were used as keys (a transform chain's cache key), which stay the same for
  /// chains that do not use it.
  constexpr Field written_when_set() const {
    Field f = *this;
    f.when_set = true;
    return f;
  }
  /// A whole number in [lo, hi]; anything else is an error naming the range.
  constexpr Field range(std::int64_t low, std::int64_t high) const {
    Field f = *this;
    f.ranged = true;
    f.lo = low;
    f.hi = high;
    return f;
  }
  /// Text that is one of `list` ("a,b,c"): anything else is an error listing them.
  constexpr Field one_of(const char* list) const {
    Field f = *this;
    f.names = list;
    return f;
  }
  /// A size in bytes (as a setting, flag or keyword argument also "64K", "1M", "1G").
  constexpr Field bytes() const {
    Field f = *this;
    f.byte_size = true;
    return f;
  }
  /// The field belongs to these kinds only: a comma-separated list of their names.
  constexpr Field in(const char* kind_list) const {
    Field f = *this;
    f.kinds = kind_list;
    return f;
  }
  /// Whether the field belongs to `kind` ("" asks for every field).
  bool belongs_to(const std::string& kind) const {
    if (kind.empty() || !*kinds) return true;
    for (std::string_view rest = kinds;;) {
      const std::size_t comma = rest.find(',');
      if (rest.substr(0, comma) == kind) return true;
      if (comma == std::string_view::npos) return false;
      rest.remove_prefix(comma + 1);
    }
  }
};

template <typename T, typename M>
constexpr Field<T, M> field(const char* key, M T::*member, const char* help) {
  return Field<T, M>{key, member, help};
}

namespace detail {
/// A list of enum names (each_key() with a choices enum).
template <typename M>
struct is_choice_list : std::false_type {};
template <typename V, typename A>
struct is_choice_list<std::vector<V, A>> : std::bool_constant<is_choice_v<V>> {};

}  // namespace detail

/// A member as JSON: enums (and lists of them) by name (nlohmann would write an enum
/// as its number).
template <typename M>
nlohmann::json as_json(const M& value) {
  if constexpr (is_choice_v<M>) {
    return name_of(value);
  } else if constexpr (detail::is_choice_list<M>::value) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& v : value) names.push_back(name_of(v));
    return names;
  } else {
    return nlohmann::json(value);
  }
}

namespace detail {

/// A list of numbers (what repeats() applies to).
template <typename M>
struct is_number_list : std::false_type {};
template <typename V, typename A>
struct is_number_list<std::vector<V, A>> : std::is_arithmetic<V> {};
/// A fixed-size array of numbers (repeats(N): one number or a list of N).
template <typename M>
struct is_number_array : std::false_type {};
template <typename V, std::size_t N>
struct is_number_array<std::array<V, N>> : std::is_arithmetic<V> {};

/// The enum named `text`, or the error "key: 'text' is not one of a | b".
template <typename E>
E choice_or_fail(ConfigReader& r, const char* key, const std::string& text) {
  if (const auto v = parse_choice<E>(text)) return *v;
  r.fail(key, str("'", text, "' is not one of ", choice_list<E>()));
}

/// "a,b,c" as the list "a | b | c".
std::string names_text(const char* list);
/// The names of "a,b,c", in order.
std::vector<std::string> names_list(const char* list);

/// The help of a key table row: an enum's names follow its help line.
template <typename M>
std::string help_of(const char* help) {
  if constexpr (is_choice_v<M>) {
    return str(help, ": ", choice_list<M>());
  } else if constexpr (is_choice_list<M>::value) {
    return str(help, ": ", choice_list<typename M::value_type>());
  } else {
    return help;
  }
}

template <typename T, typename = void>
struct has_keys_member : std::false_type {};
template <typename T>
struct has_keys_member<T, std::void_t<decltype(std::declval<T&>().keys.size())>> : std::true_type {};

// An enum (one name), or a list of them, one per sample key (each_key()).
template <typename T, typename M>
void read_choice_field(ConfigReader& r, T& options, const Field<T, M>& f) {
  M& value = options.*(f.member);
  if constexpr (is_choice_v<M>) {
    if (f.required && !r.has(f.key)) r.fail(f.key, "is required");
    std::string text = name_of(value);
    r.read(f.key, text);
    value = choice_or_fail<M>(r, f.key, text);
  } else {
    static_assert(has_keys_member<T>::value, "a list of choices is read per sample key (each_key), beside keys");
    if (!f.per_key) throw Error(str("options field ", f.key, ": a list of choices needs each_key()"));
    value.clear();
    for (const auto& text : r.per_key(f.key, f.per_key, options.keys.size())) {
      value.push_back(choice_or_fail<typename M::value_type>(r, f.key, text));
    }
  }
}

// Any other field: numbers, text, flags and lists of them.
template <typename T, typename M>
void read_plain_field(ConfigReader& r, T& options, const Field<T, M>& f) {
  M& value = options.*(f.member);
  if (f.sample_keys || f.per_key) {
    if constexpr (std::is_same_v<M, std::vector<std::string>>) {
      if (f.sample_keys) {
        if (!f.required && !r.has(f.key)) {  // keys_or_default(): absent keeps the default
          r.known(f.key);
          return;
        }
        value = r.keys(f.key);
        return;
      }
      if constexpr (has_keys_member<T>::value) {
        value = r.per_key(f.key, f.per_key, options.keys.size());
        return;
      }
    }
    throw Error(str("options field ", f.key, ": keys() and each_key() apply to lists of texts (each_key: beside keys)"));
  }
  if constexpr (is_number_array<M>::value) {
    if (f.symmetric_range && value.size() == 2) {
      using V = typename M::value_type;
      if (r.has(f.key) && r.raw(f.key).is_number()) {
        const auto x = r.template narrow<V>(f.key, r.raw(f.key));
        value = {-x, x};
        return;
      }
      const auto given = r.numbers(f.key, 2, {static_cast<double>(value[0]), static_cast<double>(value[1])});
      value = {r.template narrow<V>(f.key, given[0]), r.template narrow<V>(f.key, given[1])};
      return;
    }
    if (f.repeat > 0) {  // ConfigReader's one-or-N reads: their messages say which (required too)
      using V = typename M::value_type;
      if (!r.has(f.key) && !f.required) {
        r.known(f.key);
        return;
      }
      const auto read = [&] {
        if constexpr (std::is_integral_v<V>) return r.integers(f.key, value.size());
        else return r.numbers(f.key, value.size());
      }();
      for (std::size_t i = 0; i < value.size(); ++i) value[i] = r.template narrow<V>(f.key, read[i]);
      return;
    }
  }
  if (f.required && !r.has(f.key)) r.fail(f.key, "is required");
  if constexpr (is_number_list<M>::value) {
    using V = typename M::value_type;
    if (f.repeat > 0 && r.has(f.key)) {
      const nlohmann::json& given = r.raw(f.key);
      // One number for the list: a whole one for a list of whole numbers (a list is still
      // the message for anything else).
      if (std::is_integral_v<V> ? given.is_number_integer() : given.is_number()) {
        V one{};
        r.read(f.key, one);
        value.assign(static_cast<std::size_t>(f.repeat), one);
        return;
      }
    }
  } else if (f.repeat > 0) {
    throw Error(str("options field ", f.key, ": repeats() applies to lists of numbers only"));
  }
  r.read(f.key, value);
  if constexpr (std::is_same_v<M, std::string>) {
    if (f.lower) value = lowercase(std::move(value));
    if (f.names) {
      const auto names = names_list(f.names);
      if (std::find(names.begin(), names.end(), value) == names.end()) {
        r.fail(f.key, str("'", value, "' is not one of ", names_text(f.names)));
      }
    }
  } else if (f.lower) {
    throw Error(str("options field ", f.key, ": lowercase() applies to text only"));
  }
  if constexpr (std::is_integral_v<M> && !std::is_same_v<M, bool>) {
    if (f.ranged && (static_cast<std::int64_t>(value) < f.lo || static_cast<std::int64_t>(value) > f.hi)) {
      r.fail(f.key, str(value, " is not a whole number in ", f.lo, "..", f.hi));
    }
  }
}

template <typename T, typename M>
void read_field(ConfigReader& r, T& options, const Field<T, M>& f) {
  if constexpr (is_choice_v<M> || is_choice_list<M>::value) {
    read_choice_field(r, options, f);
  } else {
    read_plain_field(r, options, f);
  }
}

}  // namespace detail

/// Fills every field of `options` that `r`'s mapping sets (absent keys keep their
/// defaults); type errors name the key. The caller finishes `r` (unknown keys).
/// With a `kind`, only the fields that belong to it: another kind's key stays unread, so
/// the caller's finish() reports it as unknown for this kind.
template <typename T>
void read_fields(ConfigReader& r, T& options, const std::string& kind = "") {
  std::apply([&](const auto&... f) { ((f.belongs_to(kind) ? detail::read_field(r, options, f) : void()), ...); },
             T::fields());
}

/// Every field of `options` as JSON, defaults included: what a config written back says
/// (with a `kind`, the fields of that kind only).
template <typename T>
nlohmann::json fields_json(const T& options, const std::string& kind = "") {
  nlohmann::json j = nlohmann::json::object();
  const T defaults{};
  std::apply(
      [&](const auto&... f) {
        ((f.belongs_to(kind) && !(f.when_set && as_json(options.*(f.member)) == as_json(defaults.*(f.member)))
              ? void(j[f.key] = as_json(options.*(f.member)))
              : void()),
         ...);
      },
      T::fields());
  return j;
}

/// Calls fn(field, value) for every field of `options`, in declaration order (checks
/// that apply to every field of a type: "every weight is finite and >= 0").
template <typename T, typename Fn>
void for_each_field(const T& options, Fn&& fn) {
  std::apply([&](const auto&... f) { (fn(f, options.*(f.member)), ...); }, T::fields());
}

/// A row of an options struct's key table: key, default (as JSON), help, and the kinds
/// it belongs to ("" for every kind).
struct FieldDoc {
  std::string key;
  std::string default_value;  ///< JSON; "null" where the field is required
  std::string help;
  std::string kinds;
  bool required = false;
  bool when_set = false;  ///< written back only where set (Field::written_when_set)
};

/// The key table of T, in declaration order, defaults from `defaults` (a default-made T
/// unless given: a kind with defaults of its own passes them).
template <typename T>
std::vector<FieldDoc> field_docs(const T& defaults = T{}, const std::string& kind = "") {
  std::vector<FieldDoc> rows;
  std::apply(
      [&](const auto&... f) {
        ((f.belongs_to(kind)
              ? rows.push_back({f.key,
                                f.required  ? std::string("null")
                                : f.per_key ? nlohmann::json(std::string(f.per_key)).dump()  // for every key
                                            : as_json(defaults.*(f.member)).dump(),
                                detail::help_of<std::decay_t<decltype(defaults.*(f.member))>>(f.help) +
                                    (f.names ? ": " + detail::names_text(f.names) : std::string()),
                                f.kinds,
                                f.required, f.when_set})
              : void()),
         ...);
      },
      T::fields());
  return rows;
}

/// The keys T declares, in order (with a `kind`, that kind's).
template <typename T>
std::vector<std::string> field_keys(const std::string& kind = "") {
  std::vector<std::string> keys;
  std::apply([&](const auto&... f) { ((f.belongs_to(kind) ? keys.push_back(f.key) : void()), ...); }, T::fields());
  return keys;
}

}  // namespace medfast
