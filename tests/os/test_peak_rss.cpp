// os::peak_rss_bytes / reset_peak_rss: the per-epoch peak memory in metrics.jsonl.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

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

}  // namespace
}  // namespace medfast::os
