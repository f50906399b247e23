#include "medfast/transforms/transform.hpp"

#include <xxhash.h>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <chrono>
#include <cstdio>

#include "medfast/core/error.hpp"
#include "medfast/core/units.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/core/log.hpp"

namespace medfast::transforms {

void Compose::apply(Sample& sample) const {
  for (std::size_t i = 0; i < transforms_.size(); ++i) {
    try {
      const auto t0 = std::chrono::steady_clock::now();
      transforms_[i]->apply(sample);
      log::debug("transform ", transforms_[i]->name(), ": ",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
    } catch (...) {
      rethrow_with_context(str("transform ", i, " (", transforms_[i]->name(), ")"));
    }
  }
}

nlohmann::json Compose::config() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : transforms_) list.push_back({{"name", t->name()}, {"args", t->config()}});
  return list;
}

std::string Compose::hash() const {
  // nlohmann::json keeps object keys sorted, so the dump is canonical.
  const std::string text = config().dump();
  const XXH64_hash_t h = XXH3_64bits(text.data(), text.size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void for_each_chain_item(const nlohmann::json& list, const std::string& what,
                         const std::function<void(const std::string&, const nlohmann::json&)>& make) {
  if (!list.is_array()) throw ValueError(str(what, ": expected a list, got ", list.dump()));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& item = list[i];
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) {
      throw ValueError(str(what, " item ", i, ": expected {\"name\": ..., arguments...}, got ", item.dump()));
    }
    nlohmann::json args = item;
    args.erase("name");
    try {
      make(item["name"].get<std::string>(), args);
    } catch (Error& e) {
      e.add_context(str(what, " item ", i));
      throw;
    }
  }
}

Compose make_chain(const nlohmann::json& list) {
  std::vector<TransformPtr> out;
  for_each_chain_item(list, "transform chain",
                      [&](const std::string& name, const nlohmann::json& args) { out.push_back(make(name, args)); });
  return Compose(std::move(out));
}

namespace {
std::atomic<bool> g_native{true};
}

bool use_native_kernels(const at::Tensor& t) { return g_native.load(std::memory_order_relaxed) && t.is_cpu(); }
void set_native_kernels_enabled(bool enabled) { g_native = enabled; }

namespace {
std::atomic<std::uint64_t> g_max_output_bytes{kDefaultMaxVolumeBytes};
}  // namespace

std::uint64_t max_output_bytes() { return g_max_output_bytes.load(std::memory_order_relaxed); }
void set_max_output_bytes(std::uint64_t bytes) { g_max_output_bytes = bytes; }

void check_output_size(const std::string& transform, const std::string& key, std::int64_t channels,
                       const std::array<std::int64_t, 3>& shape, std::size_t element_size, const std::string& why) {
  // In long double: a broken affine gives shapes whose product overflows 64 bits.
  long double bytes = static_cast<long double>(std::max<std::int64_t>(channels, 1)) * element_size;
  for (auto n : shape) bytes *= static_cast<long double>(n);
  if (bytes <= static_cast<long double>(max_output_bytes())) return;
  std::ostringstream b;
  b.precision(3);
  b << bytes;
  throw ValueError(str(transform, key.empty() ? "" : ": key " + key, ": ", why, " gives an output of shape [", channels, ", ", shape[0],
                       ", ", shape[1], ", ", shape[2], "] = ", b.str(), " bytes, more than max_volume_bytes (",
                       format_bytes(max_output_bytes()), ")"));
}

void require_keys(const std::vector<std::string>& keys, const std::string& transform) {
  if (keys.empty()) throw ValueError(str(transform, ": argument keys: at least one key is required"));
}

// ---------------------------------------------------------------------------
// Args
// ---------------------------------------------------------------------------

Args::Args(std::string transform, const nlohmann::json& args) : transform_(std::move(transform)), args_(args) {
  if (args_.is_null()) args_ = nlohmann::json::object();
  if (!args_.is_object()) throw ValueError(str(transform_, ": arguments must be a mapping, got ", args_.dump()));
}

void Args::fail(const std::string& key, const std::string& what) const {
  std::string given;
  for (const auto& [k, v] : args_.items()) given += (given.empty() ? "" : ", ") + k;
  throw ValueError(str(transform_, ": argument ", key, ": ", what, " (arguments given: ",
                       given.empty() ? "none" : given, ")"));
}

bool Args::has(const std::string& key) const { return args_.contains(key) && !args_[key].is_null(); }

const nlohmann::json& Args::get(const std::string& key) {
  used_.push_back(key);
  return args_[key];
}

void Args::finish() const {
  for (const auto& [k, v] : args_.items()) {
    if (std::find(used_.begin(), used_.end(), k) == used_.end()) {
      std::string known;
      for (const auto& u : used_) known += (known.empty() ? "" : ", ") + u;
      throw ValueError(str(transform_, ": unknown argument '", k, "' (known: ", known, ")"));
    }
  }
}

std::vector<std::string> Args::keys(const std::string& key) {
  if (!has(key)) {
    used_.push_back(key);
    fail(key, "is required (the sample keys to transform)");
  }
  const auto& v = get(key);
  if (v.is_string()) return {v.get<std::string>()};
  if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); })) {
    return v.get<std::vector<std::string>>();
  }
  fail(key, str("expected a key or a list of keys, got ", v.dump()));
}

std::string Args::text(const std::string& key, const std::string& fallback) {
  if (!has(key)) {
    used_.push_back(key);
    return fallback;
  }
  const auto& v = get(key);
  if (!v.is_string()) fail(key, str("expected text, got ", v.dump()));
  return v.get<std::string>();
}

double Args::number(const std::string& key, double fallback) {
  if (!has(key)) {
    used_.push_back(key);
    return fallback;
  }
  const auto& v = get(key);
  if (!v.is_number()) fail(key, str("expected a number, got ", v.dump()));
  return v.get<double>();
}

std::int64_t Args::integer(const std::string& key, std::int64_t fallback) {
  if (!has(key)) {
    used_.push_back(key);
    return fallback;
  }
  const auto& v = get(key);
  if (!v.is_number_integer()) fail(key, str("expected a whole number, got ", v.dump()));
  return v.get<std::int64_t>();
}

bool Args::flag(const std::string& key, bool fallback) {
  if (!has(key)) {
    used_.push_back(key);
    return fallback;
  }
  const auto& v = get(key);
  if (!v.is_boolean()) fail(key, str("expected true or false, got ", v.dump()));
  return v.get<bool>();
}

std::vector<double> Args::numbers(const std::string& key, std::size_t n) {
  if (!has(key)) {
    used_.push_back(key);
    fail(key, str("is required (", n, " numbers)"));
  }
  const auto& v = get(key);
  if (v.is_number()) return std::vector<double>(n, v.get<double>());
  if (!v.is_array() || v.size() != n || !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number(); })) {
    fail(key, str("expected a number or a list of ", n, " numbers, got ", v.dump()));
  }
  return v.get<std::vector<double>>();
}

std::vector<std::int64_t> Args::integers(const std::string& key, std::size_t n) {
  if (!has(key)) {
    used_.push_back(key);
    fail(key, str("is required (", n, " whole numbers)"));
  }
  const auto& v = get(key);
  if (v.is_number_integer()) return std::vector<std::int64_t>(n, v.get<std::int64_t>());
  if (!v.is_array() || v.size() != n ||
      !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number_integer(); })) {
    fail(key, str("expected a whole number or a list of ", n, " of them, got ", v.dump()));
  }
  return v.get<std::vector<std::int64_t>>();
}

std::vector<double> Args::numbers(const std::string& key, std::size_t n, const std::vector<double>& fallback) {
  if (has(key)) return numbers(key, n);
  used_.push_back(key);
  return fallback;
}

std::vector<std::int64_t> Args::integers(const std::string& key, std::size_t n,
                                         const std::vector<std::int64_t>& fallback) {
  if (has(key)) return integers(key, n);
  used_.push_back(key);
  return fallback;
}

std::vector<std::string> Args::per_key(const std::string& key, const std::string& fallback, std::size_t count) {
  if (!has(key)) {
    used_.push_back(key);
    return std::vector<std::string>(count, fallback);
  }
  const auto& v = get(key);
  if (v.is_string()) return std::vector<std::string>(count, v.get<std::string>());
  if (v.is_array() && v.size() == count &&
      std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); })) {
    return v.get<std::vector<std::string>>();
  }
  fail(key, str("expected one value or a list of ", count, " (one per key), got ", v.dump()));
}

}  // namespace medfast::transforms
