#pragma once
/// \file
/// Keyed storage of Samples, one interface for every cache kind:
///   memory       Samples held in host memory
///   device       Samples held in GPU memory (needs CUDA)
///   disk         one entry file per key (entry.hpp), persistent across runs
///   disk_device  disk entries read straight into GPU memory by the engine
/// A corrupt or truncated disk entry is reported once (log warning) and
/// counted, and get() treats it as a miss, so the caller recomputes and the
/// atomic rewrite replaces it.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <c10/core/Device.h>

#include "medfast/cache/entry.hpp"
#include "medfast/core/choices.hpp"

namespace medfast::cache {

/// The cache kinds (above), listed once: the name, and whether the kind keeps entry files
/// in a folder. A kind is its entry here and its factory detail::make_<name>_store (in
/// store.cpp, or a file of its own): the enum, its names, on_disk, data.cache.kind's
/// choices, the docs and make_store's table follow.
#define MEDFAST_CACHE_KINDS(X) X(memory, false) X(device, false) X(disk, true) X(disk_device, true)

#define MEDFAST_CACHE_KIND_ENUM(name, disk) name,
enum class StoreKind { MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_ENUM) };
#undef MEDFAST_CACHE_KIND_ENUM
#define MEDFAST_CACHE_KIND_CHOICE(name, disk) Choice<StoreKind>{StoreKind::name, #name},
#define MEDFAST_CACHE_KIND_COUNT(name, disk) +1
constexpr std::array<Choice<StoreKind>, 0 MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_COUNT)> choices(StoreKind) {
  return {{MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_CHOICE)}};
}
#undef MEDFAST_CACHE_KIND_CHOICE
#undef MEDFAST_CACHE_KIND_COUNT
/// Whether the kind keeps entry files in a folder (disk, disk_device).
constexpr bool on_disk(StoreKind k) {
#define MEDFAST_CACHE_KIND_ON_DISK(name, disk) \
  if (k == StoreKind::name) return disk;
  MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_ON_DISK)
#undef MEDFAST_CACHE_KIND_ON_DISK
  return false;
}

struct StoreOptions {
  StoreKind kind = StoreKind::memory;
  std::string dir;              ///< for disk kinds
  io::IoOptions io;             ///< how disk entries are read
  std::string device = "cuda";  ///< for device kinds

  StoreOptions& set_kind(StoreKind v) { kind = v; return *this; }
  /// By name; ValueError "cache kind 'x' is not one of memory | device | ..." otherwise.
  StoreOptions& set_kind(const std::string& name);
  StoreOptions& set_dir(const std::string& v) { dir = v; return *this; }
  StoreOptions& set_io(const io::IoOptions& v) { io = v; return *this; }
};

struct StoreStats {
  std::uint64_t entries = 0, bytes = 0, hits = 0, misses = 0, corrupt = 0, writes = 0;
};

/// The device cache's room check: a message when putting `need` more bytes would leave
/// less than the training's reserve (a tenth of the GPU's `total`, at least 1 GiB) of the
/// `free` bytes on `device`; "" when the sample fits. `so_far`: what the cache holds.
std::string device_room_error(std::uint64_t need, std::uint64_t free, std::uint64_t total, const StoreStats& so_far,
                              const std::string& device);

class Store {
 public:
  virtual ~Store() = default;
  virtual std::string kind() const = 0;
  /// The sample under `key`, or nullopt (missing, or corrupt: then warned and counted).
  virtual std::optional<Sample> get(const std::string& key) = 0;
  virtual void put(const std::string& key, const Sample& sample, const nlohmann::json& extra = {}) = 0;
  /// True if an entry exists (for disk: a file whose header verifies).
  virtual bool contains(const std::string& key) = 0;
  /// True if an entry exists that will be used as it is (for disk: every payload's checksum
  /// verifies, so a fill counts as "from the cache" only entries that are; a damaged one is
  /// reported and computed again).
  virtual bool contains_valid(const std::string& key) { return contains(key); }
  virtual StoreStats stats() const = 0;
};

/// Builds a store; throws ValueError naming the kind (unknown, no CUDA, no dir).
std::unique_ptr<Store> make_store(const StoreOptions& options);

namespace detail {
/// Each kind's factory (MEDFAST_CACHE_KINDS).
#define MEDFAST_CACHE_KIND_FACTORY(name, disk) std::unique_ptr<Store> make_##name##_store(const StoreOptions& options);
MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_FACTORY)
#undef MEDFAST_CACHE_KIND_FACTORY
/// The GPU a device kind keeps its samples on; ValueError naming the kind where there is no CUDA.
at::Device cuda_device(const StoreOptions& options);
}  // namespace detail

/// The entry path of `key` in a disk store at `dir`.
std::string entry_path(const std::string& dir, const std::string& key);

}  // namespace medfast::cache
