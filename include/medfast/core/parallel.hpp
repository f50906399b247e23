#pragma once
/// \file A minimal parallel-for over std::thread; the first exception wins and is rethrown.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace medfast {

/// Whether this thread is one of a pool that already works on items in parallel (the
/// loader's workers, the cache fill's pool): kernels then run serially on it rather than
/// start libtorch's intra-op threads from every worker (oversubscribed, and their idle
/// threads spin against the workers), as PyTorch's DataLoader workers set one thread.
inline bool& item_worker_flag() {
  thread_local bool flag = false;
  return flag;
}
inline bool item_worker() { return item_worker_flag(); }
/// Marks the calling thread as an item worker for its lifetime.
struct ItemWorkerScope {
  ItemWorkerScope() { item_worker_flag() = true; }
  ~ItemWorkerScope() { item_worker_flag() = false; }
  ItemWorkerScope(const ItemWorkerScope&) = delete;
  ItemWorkerScope& operator=(const ItemWorkerScope&) = delete;
};

/// Calls fn(i) for i in [0, n) on up to `threads` threads (dynamic scheduling).
template <typename Fn>
void parallel_for(std::size_t n, int threads, Fn&& fn) {
  const std::size_t workers = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace medfast
