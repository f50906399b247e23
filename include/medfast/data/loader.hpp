#pragma once
/// \file
/// The threaded prefetching loader.
///
/// Per epoch: the item order is a permutation seeded by (seed, epoch), padded
/// to a multiple of world_size and split as torch's DistributedSampler does
/// (rank r takes positions r, r + w, ...). Batch b holds the order's items
/// [b*B, (b+1)*B); each item runs the random chain (seeded by item, not by
/// thread: see random.hpp) and its samples are stacked ([n, C, X, Y, Z]).
/// Workers build batches ahead of the consumer, at most `prefetch` of them,
/// and the consumer receives them in order, so results do not depend on the
/// thread count or prefetch depth. For a CUDA (or ROCm) device, batches are
/// stacked into pinned host memory and copied asynchronously on a side stream;
/// an event per batch orders the copy before the consumer's work. A worker's exception is rethrown by next()
/// with the item's files; stop() or destruction abandons an epoch cleanly.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/transforms/random.hpp"

namespace medfast::data {

struct LoaderOptions {
  int batch_size = 2;
  int threads = 0;  ///< 0: the threads setting (load_pipeline resolves it); a Loader needs >= 1
  int prefetch = 4;  ///< batches built ahead of the consumer
  bool shuffle = true;
  bool drop_last = false;
  int repeats = 1;  ///< times each batch is yielded (MONAI ThreadDataLoader)
  std::string device = "auto";  ///< auto (a GPU where one is usable) | cpu | cuda[:N]
  /// The largest a batch may be, estimated before it is made (from its first item's samples,
  /// and a crop's num_samples before the crops are made); 0: the memory available then.
  std::uint64_t max_batch_bytes = 0;
  bool pin_memory = false;
  int rank = 0, world_size = 1;  ///< set by the trainer under DDP (not config keys)
  /// Set by the trainer for a channels-last network (not a config key): 5-D batches are
  /// written NDHWC (at::MemoryFormat::ChannelsLast3d), on the host and on the device alike.
  bool channels_last = false;

  /// data.loader's keys.
  static constexpr auto fields() {
    using O = LoaderOptions;
    return std::make_tuple(field("batch_size", &O::batch_size, "items per batch (samples: items x the crops per item)"),
                           field("threads", &O::threads, "threads running the random chain (0: the threads setting)"),
                           field("shuffle", &O::shuffle, "a new item order every epoch (seeded by data.seed)"),
                           field("drop_last", &O::drop_last, "drop the last, smaller batch"),
                           field("repeats", &O::repeats, "times each batch is yielded (MONAI's ThreadDataLoader)"),
                           field("prefetch", &O::prefetch, "batches built ahead of the training step"),
                           field("pin_memory", &O::pin_memory, "page-locked host batches (for CUDA copies)"),
                           field("device", &O::device, "where batches are delivered: auto (a GPU where one is usable, else the CPU) | cpu | cuda[:N]"),
                           field("max_batch_bytes", &O::max_batch_bytes,
                                 "largest batch in bytes, estimated before it is made (items x crops x each key's shape "
                                 "and dtype); larger ones are refused (0: the memory available then: MemAvailable, "
                                 "within a cgroup's limit)")
                               .written_when_set());
  }
  void validate() const;
};

struct Batch {
  std::map<std::string, at::Tensor> tensors;  ///< each key's samples stacked
  /// For device batches: recorded on the side stream after the copies; next()
  /// makes the consumer's current stream wait on it (no host synchronisation).
  std::shared_ptr<c10::Event> copied;
  std::vector<std::size_t> items;             ///< dataset indices, in order
  std::vector<std::string> files;             ///< per item its files ("image=..., label=..."), for messages
  std::size_t index = 0;
  std::uint64_t epoch = 0;
  std::size_t samples() const { return tensors.empty() ? 0 : static_cast<std::size_t>(tensors.begin()->second.size(0)); }
};

class Loader {
 public:
  using Source = std::function<Sample(std::size_t)>;
  /// `size` items, item i from `source(i)` (the deterministic, cached output).
  Loader(std::size_t size, Source source, transforms::RandomChain chain, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Seeds an item's augmentation with `id(i)` instead of i: under DDP each rank's
  /// dataset is its partition, and the global index keeps an item's samples the same
  /// whatever the rank count (and different across ranks).
  void set_item_ids(std::function<std::uint64_t(std::size_t)> id) { item_id_ = std::move(id); }
  /// The items this rank visits in `epoch`, in order.
  std::vector<std::size_t> epoch_order(std::uint64_t epoch) const;
  std::size_t batches_per_epoch() const;
  /// Starts (or restarts) an epoch; with `first_step`, after that many of its steps (a run
  /// resumed mid-epoch): the batches before are not made, and those after are what they would
  /// have been (each item's augmentation is seeded by the epoch, the item and the sample).
  void start(std::uint64_t epoch, std::size_t first_step = 0);
  /// The next batch, or nullopt at the end of the epoch.
  std::optional<Batch> next();
  /// The same; while it waits, `waiting` runs every `every` (a Python caller checks
  /// for Ctrl-C there; an exception it throws abandons the wait and the epoch).
  std::optional<Batch> next(const std::function<void()>& waiting,
                            std::chrono::milliseconds every = std::chrono::milliseconds(100));
  /// Abandons the epoch: workers stop after their current item.
  void stop();

 private:
  void work(int worker);
  Batch build(std::size_t b, int worker);
  void check_batch_size(std::size_t b, std::size_t items, const std::vector<Sample>& samples,
                        const std::vector<transforms::PendingSteps>& pending) const;

  std::size_t size_;
  Source source_;
  std::function<std::uint64_t(std::size_t)> item_id_;
  transforms::RandomChain chain_;
  LoaderOptions options_;

  std::mutex mutex_;
  std::condition_variable cv_work_, cv_ready_;
  std::vector<std::thread> workers_;
  /// Device batches: worker t's side stream, taken from the pool once and kept across
  /// epochs (new threads each epoch must not take new streams: see build()).
  std::vector<c10::Stream> side_streams_;
  std::vector<std::size_t> order_;
  std::uint64_t epoch_ = 0;
  std::size_t batches_ = 0, next_to_build_ = 0, next_to_return_ = 0, repeat_ = 0;
  std::size_t first_repeat_ = 0;  // the first batch's repeats already taken (a mid-epoch start)
  std::map<std::size_t, Batch> ready_;
  std::optional<Batch> current_;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace medfast::data
