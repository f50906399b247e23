#include "medfast/image/sample.hpp"

#include "medfast/core/error.hpp"

namespace medfast {

namespace {
std::string keys_of(const Sample& s) {
  std::string k;
  for (const auto& [name, v] : s.volumes) k += (k.empty() ? "" : ", ") + name;
  return k.empty() ? "none" : k;
}
}  // namespace

Volume& Sample::volume(const std::string& key) {
  auto it = volumes.find(key);
  if (it == volumes.end()) throw ValueError(str("sample has no key '", key, "' (keys: ", keys_of(*this), ")"));
  return it->second;
}

const Volume& Sample::volume(const std::string& key) const { return const_cast<Sample&>(*this).volume(key); }

std::uint64_t Sample::bytes() const {
  std::uint64_t n = 0;
  for (const auto& [k, v] : volumes) n += v.bytes_in_memory();
  for (const auto& [k, t] : arrays) n += static_cast<std::uint64_t>(t.numel()) * t.element_size();
  return n;
}

}  // namespace medfast
