// os::peak_rss_bytes / reset_peak_rss: the per-epoch peak memory in metrics.jsonl.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "medfast/os/process.hpp"

namespace medfast::os {
namespace {

TEST(OsPeakRss, GrowsWithTouchedMemoryAndResets) {
  constexpr std::size_t kBytes = std::size_t{96} << 20;
  const std::uint64_t before = peak_rss_bytes();
  EXPECT_GT(before, 0u);
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);  // resident now
  const std::uint64_t high = peak_rss_bytes();
  EXPECT_GE(high, before);
  EXPECT_GE(high, kBytes);
  ::munmap(p, kBytes);
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here: the peak stays the lifetime one";
  EXPECT_LT(peak_rss_bytes(), high - kBytes / 2) << "after a reset the peak is today's resident set";
}

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// After keep_freed_memory(), a large block freed and allocated again reuses its pages
// (without it, glibc unmaps it at free and the next one faults every page in again).
TEST(OsMemory, KeepFreedMemoryReusesALargeFreedBlock) {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator stands in for glibc's malloc here: mallopt does not reach it";
#endif
  ASSERT_TRUE(keep_freed_memory()) << "mallopt refused on glibc";
  char* a = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(a, nullptr);
  std::memset(a, 1, kBytes);
  asm volatile("" : : "r"(a) : "memory");  // the pages are touched: no dead-store elimination before free
  std::free(a);
  const long before = minor_faults();
  char* b = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(b, nullptr);
  std::memset(b, 2, kBytes);
  const long faults = minor_faults() - before;
  std::free(b);
  EXPECT_LT(faults, static_cast<long>(kBytes / 4096 / 10)) << "the second block faulted its pages in again";
}

}  // namespace
}  // namespace medfast::os

namespace medfast::os {
namespace {

// The library defining a symbol: what machine.json's "blas" and the reference-BLAS warning use.
TEST(Process, LibraryOfSymbolNamesTheLoadedFile) {
  // gnu_get_libc_version is libc's alone: sanitizers intercept malloc and friends, so under
  // ASan "malloc" resolves into libasan.
  const std::string libc = library_of_symbol("gnu_get_libc_version");
  EXPECT_NE(libc.find("libc"), std::string::npos) << libc;
  EXPECT_EQ(libc.front(), '/');  // a resolved path
  EXPECT_EQ(library_of_symbol("medfast_no_such_symbol_anywhere"), "");
}

// Seconds since the process started: metrics.jsonl's process_seconds (the wait for the first
// epoch line). This test binary started well under a minute ago and time moves forward.
TEST(Process, ProcessSecondsCountFromThisProcessStart) {
  const double a = process_seconds();
  ASSERT_GE(a, 0.0) << "/proc/self/stat and /proc/uptime are readable on Linux";
  EXPECT_LT(a, 600.0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(120);
  while (std::chrono::steady_clock::now() < until) {
  }
  const double b = process_seconds();
  EXPECT_GE(b - a, 0.09) << "clock ticks are 10 ms";
  EXPECT_LT(b - a, 5.0);
}

// The front end marks the command's start before it execs medfast-torch: process_seconds
// then counts from the mark (the environment carries it); a damaged mark is ignored.
TEST(Process, ProcessSecondsCountFromTheMarkedCommandStart) {
  const double since_process = process_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  mark_command_start();
  const double marked = process_seconds();
  EXPECT_GE(marked, 0.0);
  EXPECT_LT(marked, 0.05) << "counted from the mark, not from this process's start";
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_GE(process_seconds(), 0.05);
  ::setenv("MEDFAST_COMMAND_START", "not a time", 1);
  EXPECT_GE(process_seconds(), since_process) << "a damaged mark: this process's start";
  ::setenv("MEDFAST_COMMAND_START", "1e15", 1);  // in the future
  EXPECT_GE(process_seconds(), since_process);
  ::unsetenv("MEDFAST_COMMAND_START");
}

}  // namespace
}  // namespace medfast::os
