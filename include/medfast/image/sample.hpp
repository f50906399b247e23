#pragma once
/// \file
/// Sample: what flows through a pipeline and what caches hold. A set of
/// named Volumes ("image", "label", ...), named plain tensors (sampling
/// indices such as "label_fg_runs") and JSON metadata (source paths, the item
/// index). Names follow MONAI's dictionary keys.

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/image/volume.hpp"

namespace medfast {

struct Sample {
  std::map<std::string, Volume> volumes;
  std::map<std::string, at::Tensor> arrays;
  nlohmann::json meta = nlohmann::json::object();

  /// The volume under `key`; throws ValueError listing the keys present.
  Volume& volume(const std::string& key);
  const Volume& volume(const std::string& key) const;
  bool has(const std::string& key) const { return volumes.count(key) > 0; }
  /// Bytes held by tensors.
  std::uint64_t bytes() const;
};

}  // namespace medfast
