#include "medfast/cache/store.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>
#include <tuple>
#include <map>

#include "medfast/core/log.hpp"
#include "medfast/core/units.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/cache/entry_file.hpp"
#include "medfast/cache/folder.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"

namespace medfast::cache {

StoreOptions& StoreOptions::set_kind(const std::string& name) {
  const auto k = parse_choice<StoreKind>(name);
  if (!k) throw ValueError(str("cache kind '", name, "' is not one of ", choice_list<StoreKind>()));
  kind = *k;
  return *this;
}

std::string entry_path(const std::string& dir, const std::string& key) { return dir + "/" + key + kEntrySuffix; }

std::string device_room_error(std::uint64_t need, std::uint64_t free, std::uint64_t total, const StoreStats& so_far,
                              const std::string& device) {
  constexpr std::uint64_t kGiB = 1ull << 30;
  const std::uint64_t reserve = std::max<std::uint64_t>(total / 10, kGiB);
  if (need + reserve <= free) return "";
  return str("cache kind device: the next sample needs ", format_bytes(need), " on ", device, ", which has ",
             format_bytes(free), " free of ", format_bytes(total), " with ", so_far.entries, " samples (",
             format_bytes(so_far.bytes), ") cached, and ", format_bytes(reserve),
             " stays free for training (a tenth of the GPU, at least 1 GiB). The dataset does not fit in GPU memory: "
             "use data.cache.kind disk_device (read from the disk cache into the GPU each epoch) or memory");
}

namespace {

Sample to_device(const Sample& s, const at::Device& device) {
  Sample out;
  out.meta = s.meta;
  for (const auto& [k, v] : s.volumes) {
    Volume moved = v;
    moved.data = v.data.to(device);
    out.volumes[k] = std::move(moved);
  }
  // Index arrays stay on the host: RandCropByPosNegLabel reads them with the CPU, and on
  // the GPU they would be copied back, blocking, for every sample (issue 21, finding 9).
  out.arrays = s.arrays;
  return out;
}

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(StoreKind kind, std::optional<at::Device> device = std::nullopt)
      : kind_(kind), device_(device) {}
  std::string kind() const override { return name_of(kind_); }
  std::optional<Sample> get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = items_.find(key);
    if (it == items_.end()) {
      ++stats_.misses;
      return std::nullopt;
    }
    ++stats_.hits;
    return it->second;  // shares tensors: cached outputs are read-only by contract
  }
  void put(const std::string& key, const Sample& sample, const nlohmann::json&) override {
    Sample stored;
    if (device_) {
      // The check and the copy together, one fill thread at a time: threads that all
      // checked first would each see the same free memory and overrun the reserve.
      std::lock_guard<std::mutex> room(room_mutex_);
      check_room(sample);
      stored = to_device(sample, *device_);
    } else {
      stored = sample;
    }
    // In C order, as disk entries store them: the random chain's resamplings and gathers
    // then read along rows (a chain may end on data in the file's x-fastest order).
    for (auto& [k, v] : stored.volumes) v.data = v.data.contiguous();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = items_.find(key);
    if (it != items_.end()) stats_.bytes -= it->second.bytes();
    else ++stats_.entries;
    stats_.bytes += stored.bytes();
    ++stats_.writes;
    items_[key] = std::move(stored);
  }
  bool contains(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.count(key) > 0;
  }
  StoreStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  /// A device cache that filled the GPU would leave training to fail on its first step
  /// with an out-of-memory error far from the cause: it stops here, naming the cache.
  void check_room(const Sample& sample) const {
    std::uint64_t total = 0;
    const auto free = io::cuda_free_bytes(*device_, &total);
    if (!free) return;  // unknown (a libtorch without CUDA's headers): the allocator reports
    const std::string m = device_room_error(sample.bytes(), *free, total, stats(), device_->str());
    if (!m.empty()) throw Error(m);
  }

  StoreKind kind_;
  std::optional<at::Device> device_;
  mutable std::mutex mutex_;
  std::mutex room_mutex_;  ///< device stores: check_room and the copy to the GPU
  std::map<std::string, Sample> items_;
  StoreStats stats_;
};

class DiskStore final : public Store {
 public:
  DiskStore(StoreKind kind, std::string dir, io::IoOptions io, std::string device)
      : kind_(kind), dir_(std::move(dir)), io_(std::move(io)), device_(std::move(device)) {
    if (dir_.empty()) throw ValueError(str("cache kind ", name_of(kind_), " needs a directory (cache.dir)"));
    // A folder of its own (os/folder_mark.hpp): made and marked, or an earlier medfast's cache,
    // marked now; a folder that holds anything else is refused before anything is written.
    os::claim_folder(dir_, os::kCacheFolder, "data.cache.dir", [this](const std::vector<std::string>& names) {
      return earlier_cache_folder(dir_, names);
    });
  }
  std::string kind() const override { return name_of(kind_); }
  std::optional<Sample> get(const std::string& key) override {
    const std::string path = entry_path(dir_, key);
    if (!os::exists(path)) {
      ++misses_;
      return std::nullopt;
    }
    try {
      // Device entries: checksums verified on the first read in this process (through
      // host memory); later reads may go GPU-direct (entries never change once written).
      const bool verify = device_ == "cpu" || !verified(key);
      Sample s = read_entry(path, key, io_, device_, verify);
      if (verify && device_ != "cpu") {
        std::lock_guard<std::mutex> lock(mutex_);
        verified_.insert(key);
      }
      ++hits_;
      return s;
    } catch (const CorruptEntry& e) {
      report_corrupt(key, e.what());
      ++misses_;
      return std::nullopt;
    }
  }
  void put(const std::string& key, const Sample& sample, const nlohmann::json& extra) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      verified_.erase(key);  // a new file under this key
    }
    const std::uint64_t n = write_entry(entry_path(dir_, key), key, sample, extra);
    bytes_ += n;
    ++writes_;
  }
  bool contains(const std::string& key) override {
    const std::string path = entry_path(dir_, key);
    if (!os::exists(path)) return false;
    try {
      return read_entry_meta(path).value("key", "") == key;
    } catch (const CorruptEntry& e) {
      report_corrupt(key, e.what());
      return false;
    }
  }
  bool contains_valid(const std::string& key) override {
    const std::string path = entry_path(dir_, key);
    if (!os::exists(path)) return false;
    try {
      verify_entry(path, key, io_);
    } catch (const CorruptEntry& e) {
      report_corrupt(key, e.what());
      return false;
    }
    if (device_ != "cpu") {
      std::lock_guard<std::mutex> lock(mutex_);
      verified_.insert(key);  // read GPU-direct from now on
    }
    return true;
  }
  StoreStats stats() const override {
    StoreStats s;
    s.hits = hits_;
    s.misses = misses_;
    s.corrupt = corrupt_;
    s.writes = writes_;
    s.bytes = bytes_;
    s.entries = writes_;
    return s;
  }

 private:
  void report_corrupt(const std::string& key, const std::string& why) {
    ++corrupt_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (warned_.insert(key).second) log::warn("cache: ", why, "; recomputing the entry");
  }

  StoreKind kind_;
  std::string dir_;
  io::IoOptions io_;
  std::string device_;
  std::atomic<std::uint64_t> hits_{0}, misses_{0}, corrupt_{0}, writes_{0}, bytes_{0};
  bool verified(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return verified_.count(key) > 0;
  }

  std::mutex mutex_;
  std::set<std::string> warned_;
  std::set<std::string> verified_;  // device entries whose checksums this process has checked
};

}  // namespace

namespace detail {

at::Device cuda_device(const StoreOptions& o) {
  if (!at::hasCUDA()) {
    throw ValueError(str("cache kind ", name_of(o.kind), " keeps samples in GPU memory, but no CUDA device is available "
                         "(libtorch without CUDA, or no GPU); use memory or disk"));
  }
  return io::resolve_device(o.device);  // "cuda": this thread's GPU, not the fill threads' GPU 0
}

std::unique_ptr<Store> make_memory_store(const StoreOptions& o) { return std::make_unique<MemoryStore>(o.kind); }
std::unique_ptr<Store> make_device_store(const StoreOptions& o) {
  return std::make_unique<MemoryStore>(o.kind, cuda_device(o));
}
std::unique_ptr<Store> make_disk_store(const StoreOptions& o) {
  return std::make_unique<DiskStore>(o.kind, o.dir, o.io, "cpu");
}
std::unique_ptr<Store> make_disk_device_store(const StoreOptions& o) {
  return std::make_unique<DiskStore>(o.kind, o.dir, o.io, cuda_device(o).str());
}

}  // namespace detail

namespace {
// The kinds' table, made from MEDFAST_CACHE_KINDS as the enum is: row i is StoreKind i.
using StoreFactory = std::unique_ptr<Store> (*)(const StoreOptions&);
constexpr StoreFactory kStores[] = {
#define MEDFAST_CACHE_KIND_ROW(name, disk) &detail::make_##name##_store,
    MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_ROW)
#undef MEDFAST_CACHE_KIND_ROW
};
}  // namespace

std::unique_ptr<Store> make_store(const StoreOptions& o) {
  const auto row = static_cast<std::size_t>(o.kind);
  if (row < std::size(kStores)) return kStores[row](o);
  throw ValueError(str("cache kind ", static_cast<int>(o.kind), " is not one of ", choice_list<StoreKind>()));
}

}  // namespace medfast::cache
