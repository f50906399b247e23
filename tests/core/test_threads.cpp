// The torch-free library's shared-state code under many threads: the thread pool,
// parallel_for, the atomic writes cache stores rely on, and the reused-buffer pool.
// Every case checks results; the ThreadSanitizer job (build-tsan) runs them to find
// data races that a passing result can hide.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "medfast/core/parallel.hpp"
#include "medfast/core/thread_pool.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

TEST(ThreadPoolTest, ResultsAndErrorsComeBackThroughTheFutures) {
  ThreadPool pool(3);
  std::vector<std::future<int>> results;
  for (int i = 0; i < 200; ++i) {
    results.push_back(pool.submit([i] {
      if (i % 50 == 7) throw std::runtime_error("task " + std::to_string(i));
      return i * i;
    }));
  }
  for (int i = 0; i < 200; ++i) {
    if (i % 50 == 7) {
      EXPECT_EQ(test::error_of<std::runtime_error>([&] { results[i].get(); }), "task " + std::to_string(i));
    } else {
      EXPECT_EQ(results[i].get(), i * i);
    }
  }
}

TEST(ThreadPoolTest, ManySubmittersAndTheDestructorFinishesQueuedTasks) {
  std::atomic<int> done{0};
  std::vector<int> slots(4 * 500, 0);
  {
    ThreadPool pool(2);
    std::vector<std::thread> submitters;
    for (int t = 0; t < 4; ++t) {
      submitters.emplace_back([&, t] {
        for (int i = 0; i < 500; ++i) {
          (void)pool.submit([&, t, i] {
            slots[static_cast<std::size_t>(t * 500 + i)] += 1;  // each slot written by one task only
            done.fetch_add(1);
          });
        }
      });
    }
    for (auto& s : submitters) s.join();
  }  // the destructor runs what is still queued, then joins
  EXPECT_EQ(done.load(), 2000);
  for (int v : slots) EXPECT_EQ(v, 1);
}

TEST(ParallelFor, EveryIndexOnceAndTheFirstErrorWins) {
  std::vector<int> seen(10000, 0);
  parallel_for(seen.size(), 4, [&](std::size_t i) { seen[i] += 1; });
  for (int v : seen) ASSERT_EQ(v, 1);
  std::atomic<int> calls{0};
  EXPECT_THROW(parallel_for(1000, 4,
                            [&](std::size_t i) {
                              calls.fetch_add(1);
                              if (i == 10) throw std::runtime_error("item 10");
                            }),
               std::runtime_error);
  EXPECT_LE(calls.load(), 1000);
}

// Cache stores write an entry through os::AtomicWriter (temporary, fsync, rename):
// several writers of one entry and readers at the same time. A reader sees no file or
// one writer's whole bytes, never a mix; no temporary is left.
TEST(AtomicWrites, ConcurrentWritersOfOneEntryLeaveOneWholeVersion) {
  test::TempDir dir;
  const std::string target = dir / "entry.mfc";
  constexpr int kWriters = 4;
  constexpr std::size_t kSize = 256u << 10;
  auto version = [](int w) { return std::string(kSize, static_cast<char>('a' + w)); };
  std::atomic<bool> writing{true};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (writing.load()) {
      std::string got;
      try {
        got = test::read_file(target);
      } catch (...) {
        continue;  // not there yet
      }
      if (got.empty()) continue;
      if (got.size() != kSize || got.find_first_not_of(got[0]) != std::string::npos) torn.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int round = 0; round < 5; ++round) {
        os::AtomicWriter out(target);
        const std::string bytes = version(w);
        out.append(bytes.data(), bytes.size() / 2);
        out.append(bytes.data() + bytes.size() / 2, bytes.size() - bytes.size() / 2);
        out.commit();
      }
    });
  }
  for (auto& w : writers) w.join();
  writing = false;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  const std::string last = test::read_file(target);
  ASSERT_EQ(last.size(), kSize);
  EXPECT_EQ(last.find_first_not_of(last[0]), std::string::npos);
  const auto names = os::list_directory(dir.path());
  EXPECT_EQ(names.size(), 1u) << "temporaries left behind";
}

TEST(BufferPool, ManyThreadsAllocateFillAndFree) {
  os::trim_buffer_pool();
  std::vector<std::thread> threads;
  std::atomic<int> damaged{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const std::size_t size = (static_cast<std::size_t>(1 + (t + i) % 4)) << 20;
        os::Buffer b = os::Buffer::allocate(size);
        std::memset(b.data(), t + 1, b.size());
        std::this_thread::yield();
        for (std::size_t k = 0; k < b.size(); k += 4096) {
          if (b.as<unsigned char>()[k] != t + 1) damaged.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(damaged.load(), 0) << "a buffer was handed to two threads at once";
  os::trim_buffer_pool();
  EXPECT_EQ(os::buffer_pool_bytes(), 0u);
}

}  // namespace
}  // namespace medfast
