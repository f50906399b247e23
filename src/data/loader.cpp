#include "medfast/data/loader.hpp"
#include "medfast/core/trace.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <numeric>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/io/tensor_io.hpp"

namespace medfast::data {

void LoaderOptions::validate() const {
  if (batch_size < 1) throw ValueError(str("loader: batch_size ", batch_size, " must be at least 1"));
  if (threads < 1) {
    throw ValueError(str("loader: threads ", threads, " must be at least 1 (0, the threads setting, is resolved by "
                         "load_pipeline)"));
  }
  if (threads > kMaxThreads) throw ValueError(str("loader: threads ", threads, " is more than ", kMaxThreads));
  if (prefetch < 1) throw ValueError(str("loader: prefetch ", prefetch, " must be at least 1"));
  if (repeats < 1) throw ValueError(str("loader: repeats ", repeats, " must be at least 1"));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw ValueError(str("loader: rank ", rank, " of world size ", world_size, " is not a valid DDP rank"));
  }
  if (device == "auto") return;  // a GPU where one is usable (io::resolve_device)
  try {
    const at::Device parsed(device);
    (void)parsed;
  } catch (const std::exception&) {
    throw ValueError(str("loader: device '", device, "' is not auto, cpu or cuda[:N]"));
  }
}

Loader::Loader(std::size_t size, Source source, transforms::RandomChain chain, LoaderOptions options)
    : size_(size), source_(std::move(source)), chain_(std::move(chain)), options_(std::move(options)) {
  options_.validate();
  // "cuda" means the constructing thread's GPU (the rank's, the Python caller's after
  // torch.cuda.set_device): resolved here, since the worker threads all start on GPU 0;
  // "auto" that GPU where CUDA is usable, else the CPU.
  options_.device = io::resolve_device(options_.device).str();
  if (size_ == 0) throw ValueError("loader: the dataset is empty");
}

Loader::~Loader() { stop(); }

std::vector<std::size_t> Loader::epoch_order(std::uint64_t epoch) const {
  std::vector<std::size_t> order(size_);
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    Rng rng(derive_seed({chain_.seed(), epoch, 0x5eedu}));
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.integer(0, i - 1)]);
  }
  // DistributedSampler: pad with the order's own head to a multiple of world_size, then interleave.
  const std::size_t w = static_cast<std::size_t>(options_.world_size);
  const std::size_t total = (order.size() + w - 1) / w * w;
  for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i % size_]);
  std::vector<std::size_t> mine;
  for (std::size_t i = static_cast<std::size_t>(options_.rank); i < order.size(); i += w) mine.push_back(order[i]);
  return mine;
}

std::size_t Loader::batches_per_epoch() const {
  const std::size_t n = epoch_order(0).size(), b = static_cast<std::size_t>(options_.batch_size);
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void Loader::start(std::uint64_t epoch, std::size_t first_step) {
  stop();
  std::lock_guard<std::mutex> lock(mutex_);
  epoch_ = epoch;
  order_ = epoch_order(epoch);
  const std::size_t b = static_cast<std::size_t>(options_.batch_size);
  batches_ = options_.drop_last ? order_.size() / b : (order_.size() + b - 1) / b;
  const std::size_t repeats = static_cast<std::size_t>(std::max(1, options_.repeats));
  next_to_build_ = next_to_return_ = std::min(first_step / repeats, batches_);
  first_repeat_ = first_step % repeats;
  repeat_ = 0;
  ready_.clear();
  current_.reset();
  error_ = nullptr;
  stopping_ = false;
  const at::Device device(options_.device);
  if (!device.is_cpu() && side_streams_.empty()) {
    c10::impl::VirtualGuardImpl guard(device.type());
    std::vector<c10::Stream> streams;  // all or none: a failure leaves the loader as it was
    for (int t = 0; t < options_.threads; ++t) streams.push_back(guard.getStreamFromGlobalPool(device));
    side_streams_ = std::move(streams);
  }
  for (int t = 0; t < options_.threads; ++t) {
    workers_.emplace_back([this, t] {
      trace::set_thread_name(str("loader ", t));
      ItemWorkerScope serial_kernels;  // the workers are the parallelism
      work(t);
    });
  }
}

void Loader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_work_.notify_all();
  cv_ready_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void Loader::work(int worker) {
  for (;;) {
    std::size_t b;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_work_.wait(lock, [&] {
        return stopping_ || error_ || next_to_build_ >= batches_ ||
               next_to_build_ < next_to_return_ + static_cast<std::size_t>(options_.prefetch);
      });
      if (stopping_ || error_ || next_to_build_ >= batches_) return;
      b = next_to_build_++;
    }
    try {
      Batch batch = build(b, worker);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(b, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    cv_ready_.notify_all();
  }
}

namespace {
/// "image=..., label=...": the files a sample was read from.
std::string files_text(const Sample& s) {
  std::string files;
  for (const auto& [k, v] : s.meta.items()) {
    if (v.is_string()) {
      files += (files.empty() ? "" : ", ") + k + "=" + v.get<std::string>();
    } else if (v.is_array() && !v.empty() && v[0].is_string()) {  // a key's channel files
      std::string list;
      for (const auto& f : v) list += (list.empty() ? "" : " + ") + (f.is_string() ? f.get<std::string>() : f.dump());
      files += (files.empty() ? "" : ", ") + k + "=" + list;
    }
  }
  return files;
}

std::string files_of(const Sample& s, std::size_t item) {
  const std::string files = files_text(s);
  return str("item ", item, files.empty() ? "" : " (" + files + ")");
}
}  // namespace

// The batch as its first item's samples say (each key's shape and dtype once its pending
// steps are applied), before the batch's other items are made.
void Loader::check_batch_size(std::size_t b, std::size_t items, const std::vector<Sample>& samples,
                              const std::vector<transforms::PendingSteps>& pending) const {
  if (samples.empty()) return;
  // Samples that live on a GPU (device caches) are batched there: the host's memory is not
  // what they need, and only a limit given for them applies.
  const auto& volumes = samples.front().volumes;
  if (options_.max_batch_bytes == 0 && !volumes.empty() && !volumes.begin()->second.data.is_cpu()) return;
  long double item_bytes = 0;
  std::string parts;
  for (const auto& [k, v] : samples.front().volumes) {
    const auto [shape, dtype] = transforms::planned_output(samples.front(), pending.front(), k);
    long double bytes = static_cast<long double>(at::elementSize(dtype));
    for (auto n : shape) bytes *= static_cast<long double>(n);
    item_bytes += bytes * static_cast<long double>(samples.size());
    parts += str(parts.empty() ? "" : ", ", k, " ", at::IntArrayRef(shape), " ", dtype);
  }
  item_bytes += static_cast<long double>(transforms::kSampleOverheadBytes) * static_cast<long double>(samples.size());
  transforms::check_batch_memory(
      item_bytes * static_cast<long double>(items),
      str("loader: batch ", b, ": ", items, " items (data.loader.batch_size ", options_.batch_size, ") x ",
          samples.size(), " samples each (", parts, ")"),
      options_.max_batch_bytes);
}

Batch Loader::build(std::size_t b, int worker) {
  const std::size_t bs = static_cast<std::size_t>(options_.batch_size);
  const std::size_t first = b * bs, last = std::min(first + bs, order_.size());
  trace::Range range("batch", "loader");
  range.arg("batch", static_cast<double>(b)).arg("epoch", static_cast<double>(epoch_));
  Batch batch;
  batch.index = b;
  batch.epoch = epoch_;
  const at::Device device(options_.device);
  // Device batches are made on a side stream: the random transforms of samples
  // that already live on the GPU (device and disk_device caches), the stacking,
  // and the host-to-device copies of host samples. An event recorded at the end
  // orders all of it before the consumer's work (next()).
  std::optional<c10::StreamGuard> on_side_stream;
  if (!device.is_cpu()) {
    // One side stream per worker, kept for the loader's life: the caching allocator
    // reuses blocks per stream, and a fresh pool stream per batch (cycling through 32)
    // let reserved memory grow toward 32 batches' worth (issue 21, finding 8). A stream
    // per worker *thread* was not enough: start() makes new threads every epoch, and
    // on the first GPU machine reserved memory still grew 10 -> 58 MiB over 12 epochs.
    on_side_stream.emplace(side_streams_.at(static_cast<std::size_t>(worker)));
  }
  // Every sample of the batch with its last composed steps (flips, turns, intensity steps
  // or a resampling) still pending: they are written straight into the batch (one pass
  // per sample and key from the cached volume).
  std::vector<Sample> samples;
  std::vector<transforms::PendingSteps> pending;
  std::vector<std::size_t> sample_items;  // each sample's item
  for (std::size_t p = first; p < last; ++p) {
    const std::size_t item = order_[p];
    batch.items.push_back(item);
    Sample input;
    try {
      trace::Range read("cache_read", "loader");
      read.arg("item", static_cast<double>(item));
      input = source_(item);
    } catch (...) {
      rethrow_with_context(str("loader: item ", item));
    }
    batch.files.push_back(files_text(input));
    if (on_side_stream) {
      // Cached GPU tensors are read on the side stream: should the cache drop one
      // (the smart cache's replacements), its memory must wait for this work.
      for (auto& [k, v] : input.volumes) {
        if (v.data.is_cuda()) v.data.record_stream(on_side_stream->current_stream());
      }
    }
    try {
      std::vector<transforms::PendingSteps> plans;
      std::vector<Sample> out = chain_.run(input, epoch_, item_id_ ? item_id_(item) : item, plans);
      for (std::size_t k = 0; k < out.size(); ++k) {
        samples.push_back(std::move(out[k]));
        pending.push_back(std::move(plans[k]));
        sample_items.push_back(item);
      }
    } catch (...) {
      rethrow_with_context(str("loader: ", files_of(input, item)));
    }
    if (p == first) check_batch_size(b, last - first, samples, pending);
  }
  trace::Range collate("collate", "loader");
  if (samples.empty()) return batch;
  for (const auto& [k, first_volume] : samples.front().volumes) {
    auto [shape, dtype] = transforms::planned_output(samples.front(), pending.front(), k);
    const at::Device where = first_volume.data.device();
    std::vector<at::ScalarType> dtypes;  // each sample's
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const auto [si, ti] = transforms::planned_output(samples[i], pending[i], k);
      const at::Device di = samples[i].volume(k).data.device();
      if (si != shape || di != where) {
        throw ValueError(str("loader: batch ", b, " key '", k,
                             "' has samples of different shapes or devices: ", at::IntArrayRef(si), " on ", di,
                             " from ", files_of(samples[i], sample_items[i]), " vs ", at::IntArrayRef(shape), " on ",
                             where, " from ", files_of(samples.front(), sample_items.front()),
                             "; crop or pad them to one size (RandCropByPosNegLabel, ResizeWithPadOrCrop)"));
      }
      // Files of one key may store different types (a label saved float32 by one tool, uint8 by
      // another): the batch takes the type that holds them all, as torch.stack does.
      dtype = at::promote_types(dtype, ti);
      dtypes.push_back(ti);
    }
    std::vector<std::int64_t> batch_shape = shape;
    batch_shape.insert(batch_shape.begin(), static_cast<std::int64_t>(samples.size()));
    at::Tensor stacked;
    // A channels-last network's batches are written NDHWC where they are gathered (the
    // exact strides also with one channel), so nothing lays them out again on the device.
    const auto layout = options_.channels_last && batch_shape.size() == 5 ? at::MemoryFormat::ChannelsLast3d
                                                                           : at::MemoryFormat::Contiguous;
    if (where.is_cpu() && (options_.pin_memory || !device.is_cpu())) {
      // Host samples bound for a GPU: gathered into pinned memory, so that the copy
      // below is asynchronous (pin_memory needs a CUDA-capable libtorch).
      stacked = at::empty(batch_shape, at::TensorOptions().dtype(dtype).pinned_memory(at::hasCUDA()).memory_format(layout));
    } else if (where.is_cpu() && layout == at::MemoryFormat::Contiguous) {
      stacked = pooled_empty(batch_shape, dtype);  // recycled pages, not freshly zeroed ones
    } else {
      stacked = at::empty(batch_shape, at::TensorOptions().dtype(dtype).device(where).memory_format(layout));  // the side stream
    }
    for (std::size_t i = 0; i < samples.size(); ++i) {
      at::Tensor into = stacked[static_cast<std::int64_t>(i)];
      if (dtypes[i] == dtype) {
        transforms::write_into(samples[i], pending[i], k, into);
      } else {
        at::Tensor own = at::empty(shape, at::TensorOptions().dtype(dtypes[i]).device(where));
        transforms::write_into(samples[i], pending[i], k, own);
        into.copy_(own);
      }
    }
    // Queued here, on the side stream, so it overlaps the consumer's compute.
    const bool there = stacked.device().type() == device.type() &&
                       (!device.has_index() || stacked.device().index() == device.index());
    if (!there) stacked = stacked.to(device, /*non_blocking=*/!device.is_cpu());
    batch.tensors[k] = stacked;
  }
  if (on_side_stream) {
    batch.copied = std::make_shared<c10::Event>(device.type());
    batch.copied->record(on_side_stream->current_stream());
  }
  return batch;
}

std::optional<Batch> Loader::next() { return next({}); }

std::optional<Batch> Loader::next(const std::function<void()>& waiting, std::chrono::milliseconds every) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (current_ && repeat_ + 1 < static_cast<std::size_t>(options_.repeats)) {
    ++repeat_;
    return current_;
  }
  repeat_ = 0;
  current_.reset();
  if (next_to_return_ >= batches_) return std::nullopt;
  const auto ready = [&] { return error_ || stopping_ || ready_.count(next_to_return_) > 0; };
  while (!cv_ready_.wait_for(lock, every, ready)) {
    if (!waiting) continue;
    lock.unlock();
    try {
      waiting();
    } catch (...) {
      stop();
      throw;
    }
    lock.lock();
  }
  if (error_) {
    auto e = error_;
    lock.unlock();
    stop();
    std::rethrow_exception(e);
  }
  if (stopping_ && !ready_.count(next_to_return_)) return std::nullopt;
  auto node = ready_.extract(next_to_return_);
  ++next_to_return_;
  current_ = std::move(node.mapped());
  repeat_ = first_repeat_;  // a mid-epoch start: this batch's repeats taken before the stop
  first_repeat_ = 0;
  cv_work_.notify_all();
  if (current_->copied) {
    // The consumer's stream waits for the side-stream copy; the caching
    // allocator learns that the tensors are used on that stream.
    const at::Device device(options_.device);
    const c10::Stream consumer = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
    current_->copied->block(consumer);
    for (auto& [k, t] : current_->tensors) t.record_stream(consumer);
    current_->copied.reset();
  }
  return current_;
}

}  // namespace medfast::data
