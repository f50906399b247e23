#pragma once
/// \file
/// SmartCacheDataset (MONAI semantics): `cache_num` items are resident; at
/// each epoch's end update() drops the oldest replace_num =
/// min(ceil(cache_num * replace_rate), n - cache_num) and appends the next
/// replace_num items of the dataset (circularly), so the resident window
/// slides through the data. A background thread computes the replacements
/// while the epoch runs; update() waits only for what is not ready yet.

#include <future>
#include <vector>

#include "medfast/data/cached_dataset.hpp"

namespace medfast::data {

struct SmartCacheOptions {
  std::size_t cache_num = 0;
  double replace_rate = 0.1;
  int threads = 1;  ///< threads filling the initial window
  void validate(std::size_t dataset_size) const;
};

class SmartCacheDataset {
 public:
  SmartCacheDataset(Dataset dataset, transforms::Compose chain, SmartCacheOptions options);
  ~SmartCacheDataset();
  SmartCacheDataset(const SmartCacheDataset&) = delete;
  SmartCacheDataset& operator=(const SmartCacheDataset&) = delete;

  /// Computes the initial window (blocking) and starts preparing replacements.
  /// `slides`: the window as it is after that many update() calls (a resumed run's
  /// epochs), computed directly.
  void start(std::size_t slides = 0);
  /// Checks each sample computed (set it before start()).
  void set_check(SampleCheck check) { check_ = std::move(check); }
  std::size_t size() const { return options_.cache_num; }
  std::size_t replace_num() const { return replace_num_; }
  /// The i-th resident sample (window order).
  const Sample& get(std::size_t i) const;
  /// Dataset indices of the resident samples, in window order.
  std::vector<std::size_t> resident() const { return resident_; }
  /// Epoch end: slide the window by replace_num; rethrows a failed replacement.
  void update();

 private:
  void prepare_next();

  Dataset dataset_;
  transforms::Compose chain_;
  SmartCacheOptions options_;
  SampleCheck check_;
  std::size_t replace_num_ = 0;
  std::size_t start_ = 0;  ///< dataset index of the window's first item
  std::vector<std::size_t> resident_;
  std::vector<Sample> samples_;
  std::future<std::vector<Sample>> next_;
  bool started_ = false;
};

}  // namespace medfast::data
