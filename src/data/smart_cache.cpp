#include "medfast/data/smart_cache.hpp"

#include <cmath>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"

namespace medfast::data {

void SmartCacheOptions::validate(std::size_t n) const {
  if (cache_num < 1 || cache_num > n) {
    throw ValueError(str("smart cache: cache_num ", cache_num, " must be between 1 and the dataset size ", n));
  }
  if (!(replace_rate >= 0 && replace_rate <= 1)) {
    throw ValueError(str("smart cache: replace_rate ", replace_rate, " is outside 0..1"));
  }
  if (threads < 1) throw ValueError(str("smart cache: threads ", threads, " must be at least 1"));
}

SmartCacheDataset::SmartCacheDataset(Dataset dataset, transforms::Compose chain, SmartCacheOptions options)
    : dataset_(std::move(dataset)), chain_(std::move(chain)), options_(options) {
  options_.validate(dataset_.items.size());
  const auto n = dataset_.items.size();
  replace_num_ = std::min<std::size_t>(
      static_cast<std::size_t>(std::ceil(static_cast<double>(options_.cache_num) * options_.replace_rate)),
      n - options_.cache_num);
}

SmartCacheDataset::~SmartCacheDataset() {
  if (next_.valid()) next_.wait();  // the background work reads members: let it finish
}

void SmartCacheDataset::start(std::size_t slides) {
  if (started_) return;
  const auto n = dataset_.items.size();
  start_ = (start_ + (slides % n) * (replace_num_ % n)) % n;
  resident_.clear();
  for (std::size_t i = 0; i < options_.cache_num; ++i) resident_.push_back((start_ + i) % n);
  samples_.assign(options_.cache_num, Sample{});
  parallel_for(options_.cache_num, options_.threads,
               [&](std::size_t i) { samples_[i] = compute_item(dataset_, chain_, resident_[i], check_); });
  started_ = true;
  prepare_next();
}

void SmartCacheDataset::prepare_next() {
  if (replace_num_ == 0) return;
  const auto n = dataset_.items.size();
  std::vector<std::size_t> indices;
  for (std::size_t k = 0; k < replace_num_; ++k) indices.push_back((start_ + options_.cache_num + k) % n);
  next_ = std::async(std::launch::async, [this, indices] {
    std::vector<Sample> out;
    for (auto g : indices) out.push_back(compute_item(dataset_, chain_, g, check_));
    return out;
  });
}

const Sample& SmartCacheDataset::get(std::size_t i) const {
  if (!started_) throw Error("smart cache: get() before start()");
  return samples_.at(i);
}

void SmartCacheDataset::update() {
  if (!started_) throw Error("smart cache: update() before start()");
  if (replace_num_ == 0) return;
  std::vector<Sample> incoming = next_.get();  // rethrows a failed replacement
  const auto n = dataset_.items.size();
  resident_.erase(resident_.begin(), resident_.begin() + static_cast<std::ptrdiff_t>(replace_num_));
  samples_.erase(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(replace_num_));
  for (std::size_t k = 0; k < replace_num_; ++k) {
    resident_.push_back((start_ + options_.cache_num + k) % n);
    samples_.push_back(std::move(incoming[k]));
  }
  start_ = (start_ + replace_num_) % n;
  prepare_next();
}

}  // namespace medfast::data
