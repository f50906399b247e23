#pragma once
/// \file
/// A dataset whose deterministic chain runs once per item and is cached
/// (MONAI's CacheDataset / PersistentDataset, with the failures fixed):
///   - the key hashes the chain's canonical config, the cache format version
///     and each input file's identity (path, size, mtime; or its content with
///     content_hash), so a changed transform or file never serves a stale entry;
///   - fill() computes missing entries on a thread pool before the first
///     epoch, reusing valid entries (a killed run resumes where it stopped);
///   - cache_rate caches the first int(rate * n) items (as MONAI); the rest are
///     computed when asked for;
///   - under DDP, rank r of w holds items r, r + w, r + 2w, ... and caches only those
///     (padded to equal sizes with pad_partition).

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "medfast/cache/store.hpp"
#include "medfast/data/dataset.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::data {

struct CacheConfig {
  cache::StoreOptions store;
  double cache_rate = 1.0;
  int threads = 1;
  bool content_hash = false;
  int rank = 0;
  int world_size = 1;
  /// Pad each rank's partition to ceil(n / world_size) items by wrapping around
  /// (training: every rank runs the same number of steps). Off for validation,
  /// where each item must count once.
  bool pad_partition = false;

  /// This process's rank and world size as the launcher set them (RankEnvironment:
  /// torchrun's RANK/WORLD_SIZE or SLURM's).
  CacheConfig& from_environment();
  void validate() const;
};

/// A check of each sample the deterministic chain computes (a run's label check,
/// data/check.hpp's LabelCheck): it throws to stop the fill, naming what is wrong. It sees
/// samples as computed, not those served from the cache.
using SampleCheck = std::function<void(const Sample&)>;

struct FillReport {
  std::size_t items = 0;     ///< items this rank caches
  std::size_t computed = 0;  ///< ran the chain
  std::size_t reused = 0;    ///< entries already there whose checksums verify: used as they are
  std::uint64_t bytes = 0;   ///< bytes of the cached samples
  double seconds = 0;
};

class CachedDataset {
 public:
  CachedDataset(Dataset dataset, transforms::Compose chain, CacheConfig config);

  /// Items in this rank's partition.
  std::size_t size() const { return indices_.size(); }
  /// Index of partition item `i` in the full dataset.
  std::size_t global_index(std::size_t i) const { return indices_.at(i); }
  /// The deterministic output of partition item `i` (cached or computed).
  Sample get(std::size_t i);
  /// Computes every cached item not already present.
  FillReport fill(const std::function<void(std::size_t done, std::size_t total)>& progress = {});
  /// Cache key of partition item `i`.
  std::string key(std::size_t i) const;
  cache::Store& store() { return *store_; }
  /// Checks each sample computed from now on (set it before fill()).
  void set_check(SampleCheck check) { check_ = std::move(check); }
  const transforms::Compose& chain() const { return chain_; }

 private:
  Sample compute(std::size_t i) const;
  bool cached(std::size_t i) const { return i < cached_count_; }

  Dataset dataset_;
  transforms::Compose chain_;
  CacheConfig config_;
  std::unique_ptr<cache::Store> store_;
  std::vector<std::size_t> indices_;
  std::size_t cached_count_ = 0;
  std::string chain_hash_;
  SampleCheck check_;
  std::unique_ptr<std::mutex> keys_mutex_ = std::make_unique<std::mutex>();  // (movable dataset)
  mutable std::vector<std::string> keys_;  ///< computed once per item (a content hash reads the file)
};

/// What identifies an input file: its path, size and mtime (or, with `content_hash`, the
/// xxh3 of its contents); for a DICOM series folder, those of every file in it, so a slice
/// added, removed or rewritten changes it. The caches' keys and the planner's fingerprint
/// cache use it.
nlohmann::json file_identity(const std::string& path, bool content_hash = false);

/// Runs `chain` on dataset item `index`; errors name the item and its files (the caches'
/// shared step: CachedDataset and SmartCache). Then `check`, where given, on the result (its
/// errors as it words them: they name the file).
Sample compute_item(const Dataset& dataset, const transforms::Compose& chain, std::size_t index,
                    const SampleCheck& check = {});

}  // namespace medfast::data
