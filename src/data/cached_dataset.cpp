#include "medfast/data/cached_dataset.hpp"
#include "medfast/core/trace.hpp"

#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "medfast/core/error.hpp"
#include "medfast/core/rank_env.hpp"
#include <optional>

#include "medfast/core/parallel.hpp"
#include "medfast/core/thread_pool.hpp"
#include "medfast/core/units.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/image/dicom.hpp"

namespace medfast::data {

CacheConfig& CacheConfig::from_environment() {
  const RankEnvironment env = RankEnvironment::read();
  rank = env.rank;
  world_size = env.world_size;
  return *this;
}

void CacheConfig::validate() const {
  if (!(cache_rate >= 0 && cache_rate <= 1)) throw ValueError(str("cache: cache_rate ", cache_rate, " is outside 0..1"));
  if (threads < 1) throw ValueError(str("cache: threads ", threads, " must be at least 1"));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw ValueError(str("cache: rank ", rank, " of world size ", world_size, " is not a valid DDP rank"));
  }
}

namespace {

std::string hex64(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string item_context(const Dataset& dataset, std::size_t g) {
  std::string files;
  for (const auto& [k, paths] : dataset.items.at(g).files)
    files += (files.empty() ? "" : ", ") + k + "=" + paths.text();
  return str("item ", g, " (", files, ")");
}

std::string content_digest(const std::string& path) {
  const os::File f = os::File::open(path, os::File::Mode::read);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  os::Buffer buf = os::Buffer::allocate(8u << 20);
  for (std::uint64_t off = 0;;) {
    const std::size_t n = f.read_at(buf.data(), buf.size(), off);
    if (n == 0) break;
    XXH3_64bits_update(state, buf.data(), n);
    off += n;
  }
  const auto h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hex64(h);
}

}  // namespace

nlohmann::json file_identity(const std::string& path, bool content_hash) {
  const os::FileInfo fi = os::stat(path);
  if (fi.is_directory) {
    nlohmann::json files = nlohmann::json::array();
    for (const std::string& f : dicom::files_of(path)) files.push_back(file_identity(f, content_hash));
    return {{"path", path}, {"files", files}};
  }
  if (content_hash) return {{"path", path}, {"xxh3", content_digest(path)}};
  return {{"path", path}, {"size", fi.size}, {"mtime_ns", fi.mtime_ns}};
}

CachedDataset::CachedDataset(Dataset dataset, transforms::Compose chain, CacheConfig config)
    : dataset_(std::move(dataset)), chain_(std::move(chain)), config_(std::move(config)) {
  config_.validate();
  store_ = cache::make_store(config_.store);
  const std::size_t n = dataset_.items.size(), w = static_cast<std::size_t>(config_.world_size);
  // Padded: every rank holds ceil(n / w) items (the last ones wrap around to the
  // start, as torch's DistributedSampler pads), so all ranks run the same steps.
  const std::size_t per_rank = config_.pad_partition ? (n + w - 1) / w : 0;
  for (std::size_t k = 0, i = static_cast<std::size_t>(config_.rank); config_.pad_partition ? k < per_rank : i < n;
       ++k, i += w) {
    indices_.push_back(i % n);
  }
  // MONAI: int(len(data) * cache_rate), truncating.
  cached_count_ = static_cast<std::size_t>(config_.cache_rate * static_cast<double>(indices_.size()));
  chain_hash_ = chain_.hash();
}

std::string CachedDataset::key(std::size_t i) const {
  {
    std::lock_guard<std::mutex> lock(*keys_mutex_);
    if (keys_.size() != indices_.size()) keys_.resize(indices_.size());
    if (!keys_.at(i).empty()) return keys_[i];
  }
  const DatasetItem& item = dataset_.items.at(indices_.at(i));
  nlohmann::json inputs = nlohmann::json::object();
  try {
    // Every file of a key: one file's identity as before (its entries keep their keys), a
    // key's channel files as a list of them, so a changed channel file is a changed item.
    for (const auto& [k, paths] : item.files) {
      if (paths.size() == 1) {
        inputs[k] = file_identity(paths.first(), config_.content_hash);
        continue;
      }
      nlohmann::json ids = nlohmann::json::array();
      for (const auto& path : paths) ids.push_back(file_identity(path, config_.content_hash));
      inputs[k] = ids;
    }
    for (const auto& [k, value] : item.attrs) inputs[k] = value;
  } catch (...) {
    rethrow_with_context(item_context(dataset_, indices_.at(i)));
  }
  const nlohmann::json id = {{"format", cache::kEntryFormatVersion}, {"chain", chain_.config()}, {"inputs", inputs}};
  const std::string text = id.dump();
  const std::string k = hex64(XXH3_64bits(text.data(), text.size()));
  std::lock_guard<std::mutex> lock(*keys_mutex_);
  keys_[i] = k;
  return k;
}

Sample compute_item(const Dataset& dataset, const transforms::Compose& chain, std::size_t g, const SampleCheck& check) {
  Sample s;
  for (const auto& [k, paths] : dataset.items.at(g).files) s.meta[k] = paths.to_json();
  for (const auto& [k, value] : dataset.items.at(g).attrs) s.meta[k] = value;
  s.meta["index"] = g;
  try {
    chain.apply(s);
  } catch (...) {
    rethrow_with_context(item_context(dataset, g));
  }
  // Cached outputs are stored C-contiguous, the layout batches and networks
  // use, so the transposition from file order is paid once per item here,
  // not once per random crop in the loader.
  for (auto& [k, v] : s.volumes) v.data = v.data.contiguous();
  if (check) check(s);
  return s;
}

Sample CachedDataset::compute(std::size_t i) const {
  return compute_item(dataset_, chain_, indices_.at(i), check_);
}

Sample CachedDataset::get(std::size_t i) {
  if (!cached(i)) return compute(i);
  const std::string k = key(i);
  if (auto s = store_->get(k)) return std::move(*s);
  Sample s = compute(i);
  store_->put(k, s, {{"chain", chain_hash_}, {"dataset", dataset_.source}});
  return s;
}

FillReport CachedDataset::fill(const std::function<void(std::size_t, std::size_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  FillReport r;
  r.items = cached_count_;
  std::atomic<std::size_t> done{0}, computed{0}, reused{0};
  std::atomic<std::uint64_t> bytes{0};
  std::mutex progress_mutex;
  {
    ThreadPool pool(config_.threads);
    std::vector<std::future<void>> jobs;
    for (std::size_t i = 0; i < cached_count_; ++i) {
      jobs.push_back(pool.submit([&, i] {
        const std::string k = key(i);
        if (store_->contains_valid(k)) {  // used as it is: a damaged entry is computed again, not counted here
          ++reused;
        } else {
          trace::Range range("cache_fill", "cache");
          range.arg("item", static_cast<double>(i));
          // Items are the parallelism when there are several: each one's kernels run serially.
          std::optional<ItemWorkerScope> serial;
          if (cached_count_ > 1 && config_.threads > 1) serial.emplace();
          const Sample s = compute(i);
          bytes += s.bytes();
          store_->put(k, s, {{"chain", chain_hash_}, {"dataset", dataset_.source}});
          ++computed;
        }
        const std::size_t n = ++done;
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mutex);
          progress(n, cached_count_);
        }
      }));
    }
    std::exception_ptr error;
    for (auto& j : jobs) {
      try {
        j.get();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
  r.computed = computed;
  r.reused = reused;
  r.bytes = bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace medfast::data
