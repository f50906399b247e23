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
  const OutputLimit limit(max_output_bytes_);
  for (std::size_t i = 0; i < transforms_.size(); ++i) {
    std::size_t last = i;  // a fused pair (Orientation then Spacing) runs as one step
    try {
      const auto t0 = std::chrono::steady_clock::now();
      if (fuse_ && i + 1 < transforms_.size() && transforms_[i]->apply_with_next(*transforms_[i + 1], sample)) {
        last = i + 1;
      } else {
        transforms_[i]->apply(sample);
      }
      log::debug("transform ", transforms_[i]->name(), last > i ? "+" + transforms_[last]->name() : "", ": ",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
    } catch (...) {
      rethrow_with_context(last > i ? str("transforms ", i, "-", last, " (", transforms_[i]->name(), ", ",
                                          transforms_[last]->name(), ")")
                                    : str("transform ", i, " (", transforms_[i]->name(), ")"));
    }
    i = last;
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
thread_local std::uint64_t t_max_output_bytes = kDefaultMaxVolumeBytes;
}  // namespace

std::uint64_t max_output_bytes() { return t_max_output_bytes; }
OutputLimit::OutputLimit(std::optional<std::uint64_t> bytes) : saved_(t_max_output_bytes) {
  if (bytes) t_max_output_bytes = *bytes;
}
OutputLimit::~OutputLimit() { t_max_output_bytes = saved_; }

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


}  // namespace medfast::transforms
