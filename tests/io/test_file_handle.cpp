// Conformance suite of the tensor file engine: every backend configuration
// must pass the same cases (sizes around the alignment, unaligned offsets and
// buffers, reads past the end, concurrent requests, write then read back),
// plus fault injection through the OS layer's hooks. Torch-free (the torch-free
// library's suite, and the ThreadSanitizer job); tensors: test_tensor_io.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/random.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "host_device.hpp"
#include "io_conformance.hpp"
#include "test_util.hpp"

namespace medfast::io {
namespace {

using conformance::Config;
using conformance::Conformance;
using conformance::random_bytes;

TEST_P(Conformance, ReadsAnySizeAtAnyOffsetIntoAnyBuffer) {
  const std::string data = random_bytes((3u << 20) + 777, 1);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  EXPECT_EQ(f.size(), data.size());
  os::Buffer buf = os::Buffer::allocate((2u << 20) + 8192);
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                           std::size_t{(1u << 20) + 3}}) {
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4095}, std::uint64_t{4096},
                                 std::uint64_t{12345}, std::uint64_t{1u << 20}}) {
      for (std::size_t shift : {std::size_t{0}, std::size_t{1}, std::size_t{512}}) {  // aligned and misaligned buffers
        char* dst = buf.as<char>() + shift;
        std::memset(dst, 0x5a, size + 16);
        SCOPED_TRACE(str("size ", size, " offset ", offset, " buffer shift ", shift));
        ASSERT_EQ(f.read(dst, size, offset), size);
        ASSERT_EQ(std::memcmp(dst, data.data() + offset, size), 0);
        ASSERT_EQ(static_cast<unsigned char>(dst[size]), 0x5a) << "wrote past the end of the buffer";
      }
    }
  }
}

TEST_P(Conformance, ReadsPastTheEndAreShortAndReadExactNamesTheFile) {
  const std::string data = random_bytes(10000, 2);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::string out(20000, '\0');
  EXPECT_EQ(f.read(out.data(), 5000, 9000), 1000u);
  EXPECT_EQ(out.substr(0, 1000), data.substr(9000));
  EXPECT_EQ(f.read(out.data(), 100, 10000), 0u);
  EXPECT_EQ(f.read(out.data(), 100, 50000), 0u);
  EXPECT_EQ(f.read(out.data(), 20000, 0), 10000u);
  const std::string m = test::error_of<FormatError>([&] { f.read_exact(out.data(), 4096, 8192); });
  EXPECT_TRUE(test::contains_all(m, {dir / "f", "offset 8192", "4096 bytes"}));
}

// Every backend refuses a FIFO (a socket, a device) at open, naming it, instead of
// waiting for a writer forever; for writing too.
TEST_P(Conformance, AFifoIsRefusedAtOpenNotWaitedOn) {
  const std::string fifo = dir / "entry.mfc";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto opened = std::async(std::launch::async, [&] {
    return test::error_of<OsError>([&] { FileHandle::open(fifo, FileHandle::Mode::read, options()); }) + "\n" +
           test::error_of<OsError>([&] { FileHandle::open(fifo, FileHandle::Mode::write, options()); });
  });
  if (opened.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    const int w = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // lets a blocked open return
    ADD_FAILURE() << "open() of a FIFO blocked";
    opened.wait();
    ::close(w);
    return;
  }
  const std::string m = opened.get();
  EXPECT_EQ(m, "cannot open " + fifo + ": a FIFO, not a regular file (medfast reads and writes only regular files: "
                "a FIFO, socket or device could block or never end)\ncannot open " + fifo +
                ": a FIFO, not a regular file (medfast reads and writes only regular files: a FIFO, socket or device "
                "could block or never end)");
}

TEST_P(Conformance, WritesThenReadsBackWithoutPaddingOrDamage) {
  const std::string path = dir / "w";
  const std::string a = random_bytes((1u << 20) + 4097, 3);
  {
    FileHandle f = FileHandle::open(path, FileHandle::Mode::write, options());
    f.write(a.data(), a.size(), 0);
    f.sync();
  }
  EXPECT_EQ(test::read_file(path), a);
  // Overwrite unaligned pieces in the middle and past the end; neighbours survive.
  std::string expect = a;
  const std::string b = random_bytes(5000, 4);
  const std::string c = random_bytes(3, 5);
  {
    FileHandle f = FileHandle::open(path, FileHandle::Mode::read_write, options());
    os::Buffer misaligned = os::Buffer::allocate(8192);
    std::memcpy(misaligned.as<char>() + 1, b.data(), b.size());
    f.write(misaligned.as<char>() + 1, b.size(), 4093);
    expect.replace(4093, b.size(), b);
    f.write(c.data(), c.size(), a.size() + 10);  // a hole of 10 bytes, then 3
    expect += std::string(10, '\0') + c;
    f.write(b.data(), 0, 7);  // empty write is a no-op
  }
  EXPECT_EQ(test::read_file(path), expect);
  FileHandle r = FileHandle::open(path, FileHandle::Mode::read, options());
  std::string back(expect.size(), '\0');
  EXPECT_EQ(r.read(back.data(), back.size(), 0), expect.size());
  EXPECT_EQ(back, expect);
}

TEST_P(Conformance, ConcurrentAndAsyncRequestsOnOneHandle) {
  const std::string data = random_bytes(4u << 20, 6);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::vector<std::string> out(8, std::string(300000, '\0'));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t off = static_cast<std::uint64_t>(t) * 499999 + 13;
      ASSERT_EQ(f.read(out[t].data(), out[t].size(), off), out[t].size());
      EXPECT_EQ(out[t], data.substr(off, out[t].size()));
    });
  }
  for (auto& t : threads) t.join();
  std::string a(1u << 20, '\0'), b(1u << 20, '\0');
  auto fa = f.read_async(a.data(), a.size(), 0);
  auto fb = f.read_async(b.data(), b.size(), 3u << 20);
  EXPECT_EQ(fa.get(), a.size());
  EXPECT_EQ(fb.get(), b.size());
  EXPECT_EQ(a, data.substr(0, a.size()));
  EXPECT_EQ(b, data.substr(3u << 20));
}

// A forked child (a torch DataLoader worker) reads through a handle its parent opened and
// used, while the parent goes on reading: each gets its own bytes, neither hangs (io_uring:
// the child must not submit to the parent's rings, whose queues both processes map).
TEST_P(Conformance, AForkedChildReadsThroughItsParentsHandle) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started in a child of a threaded process";
#elif defined(__SANITIZE_ADDRESS__)
  // glibc's malloc takes its locks around fork; GCC 12's AddressSanitizer runtime (libasan.so.8,
  // which has no fork interceptor) does not, so a child forked while a parent thread is inside
  // the allocator hangs in its first allocation: this test hung so once in CI (2026-11-26) and
  // passed on every rerun. The suites without sanitizers run it.
  GTEST_SKIP() << "AddressSanitizer's allocator (GCC 12) is not fork-safe in a threaded process";
#else
  const std::string data = random_bytes(2u << 20, 9);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::string warm(data.size(), '\0');
  ASSERT_EQ(f.read(warm.data(), warm.size(), 0), warm.size());  // the parent's pool holds a ring now
  auto read_rounds = [&](int seed) {
    std::string out(300000, '\0');
    for (int i = 0; i < 30; ++i) {
      const std::uint64_t off = (static_cast<std::uint64_t>(i) * 7919 + static_cast<std::uint64_t>(seed) * 104729) % (data.size() - out.size());
      if (f.read(out.data(), out.size(), off) != out.size() || out != data.substr(off, out.size())) return false;
    }
    return true;
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) _exit(read_rounds(1) ? 0 : 3);
  const bool parent_ok = read_rounds(2);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(parent_ok);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child read wrong bytes or failed";
  EXPECT_TRUE(read_rounds(3));  // and the parent's rings still work afterwards
#endif
}

TEST_P(Conformance, AsyncCallsKeepTheFileOpenAfterTheHandleIsGone) {
  const std::string data = random_bytes(6u << 20, 9);
  test::write_file(dir / "f", data);
  std::string out(data.size(), '\0');
  std::future<std::size_t> pending;
  {
    FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
    pending = f.read_async(out.data(), out.size(), 0);
    FileHandle moved = std::move(f);
  }  // both handles gone, the read perhaps still running
  EXPECT_EQ(pending.get(), data.size());
  EXPECT_EQ(out, data);
}

TEST_P(Conformance, ManyAsyncCallsInFlightShareTheEngineWorkers) {
  // More calls in flight than the engine has async workers: disjoint aligned writes,
  // then reads of the same pieces, each awaited only at the end.
  constexpr std::size_t kPiece = 256u << 10;
  constexpr int kPieces = 24;
  const std::string data = random_bytes(kPiece * kPieces, 10);
  {
    FileHandle w = FileHandle::open(dir / "f", FileHandle::Mode::write, options());
    std::vector<std::future<void>> writes;
    for (int i = 0; i < kPieces; ++i) writes.push_back(w.write_async(data.data() + i * kPiece, kPiece, i * kPiece));
    for (auto& f : writes) f.get();
  }
  EXPECT_EQ(test::read_file(dir / "f"), data);
  FileHandle r = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::vector<std::string> out(kPieces, std::string(kPiece, '\0'));
  std::vector<std::future<std::size_t>> reads;
  for (int i = 0; i < kPieces; ++i) reads.push_back(r.read_async(out[i].data(), kPiece, i * kPiece));
  for (int i = 0; i < kPieces; ++i) {
    EXPECT_EQ(reads[i].get(), kPiece);
    EXPECT_EQ(out[i], data.substr(i * kPiece, kPiece)) << "piece " << i;
  }
}

TEST_P(Conformance, AsyncErrorsReachTheFuture) {
  test::write_file(dir / "f", "0123456789");
  FileHandle r = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  const char bytes[4] = {'a', 'b', 'c', 'd'};
  auto pending = r.write_async(bytes, sizeof bytes, 0);
  const std::string m = test::error_of<Error>([&] { pending.get(); });
  EXPECT_NE(m.find("opened for reading"), std::string::npos) << m;
  EXPECT_EQ(test::read_file(dir / "f"), "0123456789");
}

TEST_P(Conformance, RunAsyncSharesTheOpenFile) {
  const std::string data = random_bytes(1u << 20, 11);
  test::write_file(dir / "f", data);
  std::promise<std::string> got;
  {
    FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
    f.run_async([&got](FileHandle& shared) {
      try {
        std::string s(100000, '\0');
        shared.read_exact(s.data(), s.size(), 12345);
        got.set_value(s);
      } catch (...) {
        got.set_exception(std::current_exception());
      }
    });
  }
  auto result = got.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(result.get(), data.substr(12345, 100000));
}

// A write that patches blocks (read-modify-write) while reads come back short: the
// nested reads of the rest of the region must not reuse the block being patched.
TEST_P(Conformance, PartialBlockWritesKeepTheBytesAroundThem) {
  std::string data = random_bytes(20000, 12);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read_write, options());
  const std::string a = random_bytes(10000, 13), b = random_bytes(50, 14);
  {
    os::testing::ScopedHook hook([](os::Op op, const std::string&, std::uint64_t, std::size_t) {
      os::testing::HookResult r;
      if (op == os::Op::read) r.max_bytes = 5000;  // more than a block, not a whole number of them
      return r;
    });
    f.write(a.data(), a.size(), 100);
    f.write(b.data(), b.size(), 15000);
  }
  data.replace(100, a.size(), a);
  data.replace(15000, b.size(), b);
  const std::string back = test::read_file(dir / "f");
  ASSERT_EQ(back.size(), data.size());
  EXPECT_EQ(back.substr(0, 100), data.substr(0, 100)) << "the bytes before the write changed";
  EXPECT_EQ(back, data);
}

// A write ending inside a block, at the end of the file, while another write to a later
// block extends the file: the first must not cut the second off (no padding to trim).
TEST_P(Conformance, AWriteEndingInsideABlockKeepsAConcurrentExtension) {
  FileHandle w = FileHandle::open(dir / "f", FileHandle::Mode::write, options());
  const std::string head = random_bytes(100, 15), tail = random_bytes(4096, 16);
  std::promise<void> tail_written;
  std::shared_future<void> tail_done = tail_written.get_future().share();
  os::testing::ScopedHook hook([tail_done](os::Op op, const std::string&, std::uint64_t offset, std::size_t) {
    if (op == os::Op::write && offset == 0) tail_done.wait();  // the head's write lands after the tail's
    return os::testing::HookResult{};
  });
  auto head_write = std::async(std::launch::async, [&] { w.write(head.data(), head.size(), 0); });
  w.write(tail.data(), tail.size(), 4096);
  tail_written.set_value();
  head_write.get();
  EXPECT_EQ(test::read_file(dir / "f"), head + std::string(4096 - head.size(), '\0') + tail);
}

TEST_P(Conformance, ShortTransfersAndEintrAreContinued) {
  const std::string data = random_bytes((1u << 20) + 100, 8);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::atomic<int> calls{0};  // the hook runs on the engine's workers
  os::testing::ScopedHook hook([&](os::Op op, const std::string&, std::uint64_t, std::size_t) {
    os::testing::HookResult r;
    if (op != os::Op::read && op != os::Op::write) return r;
    const int call = ++calls;
    if (call % 5 == 0) r.error = EINTR;
    else if (call % 2 == 0) r.max_bytes = 1000;  // short transfer at an unaligned length
    return r;
  });
  std::string out(data.size(), '\0');
  ASSERT_EQ(f.read(out.data(), out.size(), 3), out.size() - 3);
  EXPECT_EQ(out.substr(0, out.size() - 3), data.substr(3));
  FileHandle w = FileHandle::open(dir / "w", FileHandle::Mode::write, options());
  w.write(data.data(), data.size(), 0);
  EXPECT_GT(calls.load(), 2);
  EXPECT_EQ(test::read_file(dir / "w"), data);
}

TEST_P(Conformance, EioAndEnospcNamePathOffsetAndSize) {
  const std::string data = random_bytes(3u << 20, 9);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  {
    os::testing::ScopedHook hook([](os::Op op, const std::string&, std::uint64_t offset, std::size_t) {
      os::testing::HookResult r;
      if (op == os::Op::read && offset >= (2u << 20)) r.error = EIO;
      return r;
    });
    std::string out(data.size(), '\0');
    test::with_error<OsError>([&] { f.read(out.data(), out.size(), 0); }, [&](const OsError& e) {
      EXPECT_EQ(e.errno_value(), EIO);
      EXPECT_TRUE(test::contains_all(e.what(), {dir / "f", "offset", std::strerror(EIO)}));
    });
  }
  FileHandle w = FileHandle::open(dir / "w", FileHandle::Mode::write, options());
  os::testing::ScopedHook hook([](os::Op op, const std::string&, std::uint64_t offset, std::size_t) {
    os::testing::HookResult r;
    if (op == os::Op::write && offset >= (1u << 20)) r.error = ENOSPC;
    return r;
  });
  test::with_error<OsError>([&] { w.write(data.data(), data.size(), 0); }, [&](const OsError& e) {
    EXPECT_EQ(e.errno_value(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(dir / "w"), std::string::npos) << e.what();
  });
}

// Device memory no backend here reaches goes through the engine's pinned bounce (host
// memory standing in for the device; its copies land only when waited for): the same
// bytes as a host read at any offset, chunk after chunk, double-buffered, short at the end
// of the file, each chunk shown to an observer in file order; writes round-trip.
TEST_P(Conformance, DeviceMemoryBouncesThroughPinnedBuffers) {
  const std::string data = random_bytes(300001, 21);
  test::write_file(dir / "f", data);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  EXPECT_EQ(f.device_path(), "bounce (pinned host buffers)");
  test_device::HostAsDevice device(64u << 10);
  std::string on_device(data.size() - 4097, '\0');
  std::string seen;
  const auto observe = [&](const void* p, std::size_t n) { seen.append(static_cast<const char*>(p), n); };
  EXPECT_EQ(f.pread(Memory::on_device(on_device.data(), on_device.size(), device), 4097, observe), on_device.size());
  EXPECT_EQ(on_device, data.substr(4097));
  EXPECT_EQ(seen, on_device);
  EXPECT_EQ(device.to_device, 5);  // 295904 bytes in chunks of 64 KiB
  EXPECT_EQ(device.pinned_buffers, 2);
  EXPECT_EQ(device.stream_waits, 0);  // the copies are ordered on the stream: no wait for it
  std::string past(1000, '\0');
  EXPECT_EQ(f.pread(Memory::on_device(past.data(), past.size(), device), data.size() - 10), 10u);
  EXPECT_EQ(past.substr(0, 10), data.substr(data.size() - 10));
  FileHandle w = FileHandle::open(dir / "w", FileHandle::Mode::write, options());
  w.pwrite(Memory::on_device(data.data(), data.size(), device), 13);
  w.pwrite(Memory::on_device(data.data(), 13, device), 0);
  EXPECT_EQ(test::read_file(dir / "w"), data.substr(0, 13) + data);
  EXPECT_EQ(device.to_host, 6);  // 5 chunks, then 1
}

TEST_P(Conformance, MissingFileIsAnOsErrorNamingIt) {
  test::with_error<OsError>([&] { FileHandle::open(dir / "missing.bin", FileHandle::Mode::read, options()); },
                            [](const OsError& e) {
                              EXPECT_EQ(e.errno_value(), ENOENT);
                              EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos);
                            });
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(conformance::configs()),
                         [](const ::testing::TestParamInfo<Config>& i) { return i.param.name; });

// Cache first: an O_DIRECT handle takes what the page cache holds from it, the rest direct.
//
// The kernel may take pages of a cached file at any time: under memory pressure from whatever
// else the machine runs (seen in CI under a parallel ctest: 25 pages of a 2 MiB file), and a
// page it is reclaiming refuses an RWF_NOWAIT read while mincore still counts it. A figure is
// therefore judged only from an attempt that the kernel left alone: one in which every page the
// test cached was in the cache before and after its read (mincore). Each test tries up to five
// times and skips, saying so, if the kernel took pages in every attempt. The bytes read must
// be the file's in every attempt.
class CacheFirst : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr std::size_t B = 65536;
  test::TempDir dir;
  IoOptions options(bool cache_first = true) const {
    return IoOptions().set_backend(GetParam()).set_threads(3).set_block_size(B).set_cache_first(cache_first);
  }
  /// A file of `n` bytes written and then dropped from the page cache (clean pages).
  std::string cold_file(std::size_t n, std::uint64_t seed) {
    const std::string data = random_bytes(n, seed);
    test::write_file(dir / "f", data);
    os::File::open(dir / "f", os::File::Mode::read).drop_cache();
    return data;
  }
  /// Which of the first `n` bytes' pages of dir/f the page cache holds now (bit 0 of each).
  std::vector<unsigned char> resident(std::size_t n) const {
    const os::File held = os::File::open(dir / "f", os::File::Mode::read);
    std::vector<unsigned char> pages((n + 4095) / 4096);
    void* map = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, held.fd(), 0);
    EXPECT_NE(map, MAP_FAILED) << std::strerror(errno);
    if (map == MAP_FAILED) return pages;
    EXPECT_EQ(::mincore(map, n, pages.data()), 0) << std::strerror(errno);
    ::munmap(map, n);
    return pages;
  }
  /// The pages of [from, to) missing in `before` or `after`.
  static std::size_t missing_pages(const std::vector<unsigned char>& before, const std::vector<unsigned char>& after,
                                   std::size_t from, std::size_t to) {
    std::size_t missing = 0;
    for (std::size_t p = from / 4096; p * 4096 < to && p < before.size(); ++p) missing += !(before[p] & after[p] & 1);
    return missing;
  }
  /// Runs `attempt`, which returns the pages the kernel took from it, until one returns 0, at
  /// most five times; false if the kernel took pages in every attempt.
  template <class Attempt>
  static bool left_alone(Attempt attempt) {
    for (int i = 0; i < 5; ++i)
      if (attempt() == 0) return true;
    return false;
  }
  void SetUp() override {
    if (GetParam() == "io_uring" && !probe().io_uring) GTEST_SKIP() << "no io_uring here: " << probe().io_uring_detail;
    test::write_file(dir / "probe", std::string(4096, 'x'));
    const FileHandle f = FileHandle::open(dir / "probe", FileHandle::Mode::read, options());
    if (!f.direct()) GTEST_SKIP() << dir.path() << " refuses O_DIRECT: no direct reads to put the cache before";
    if (!os::page_cache_reads()) GTEST_SKIP() << "this kernel refuses RWF_NOWAIT reads";
  }
};

constexpr const char* kTakenInEveryAttempt =
    "the kernel took cached pages of the file in each of 5 attempts (memory pressure): no figure to judge";

TEST_P(CacheFirst, AFileInThePageCacheIsReadFromIt) {
  const std::string data = random_bytes((3u << 20) + 777, 21);
  std::string warm(data.size(), '\0');
  std::uint64_t from_cache = 0;
  const bool judged = left_alone([&] {
    test::write_file(dir / "f", data);               // buffered: its pages are in the cache
    EXPECT_EQ(test::read_file(dir / "f"), data);  // and read once, so that they stay
    const std::vector<unsigned char> before = resident(data.size());
    FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
    EXPECT_EQ(f.read(warm.data(), warm.size() - 5, 5), warm.size() - 5);  // an unaligned start too
    EXPECT_EQ(warm.substr(0, warm.size() - 5), data.substr(5));
    from_cache = f.page_cache_bytes();
    return missing_pages(before, resident(data.size()), 5, data.size());
  });
  if (!judged) GTEST_SKIP() << kTakenInEveryAttempt;
  EXPECT_EQ(from_cache, data.size() - 5);
  // Reads past the end stop at it.
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  EXPECT_EQ(f.read(warm.data(), 100, data.size() - 10), 10u);
  EXPECT_EQ(warm.substr(0, 10), data.substr(data.size() - 10));
  // cache_first off: every byte O_DIRECT, the same bytes.
  FileHandle direct = FileHandle::open(dir / "f", FileHandle::Mode::read, options(false));
  std::string out(data.size(), '\0');
  ASSERT_EQ(direct.read(out.data(), out.size(), 0), out.size());
  EXPECT_EQ(out, data);
  EXPECT_EQ(direct.page_cache_bytes(), 0u);
}

TEST_P(CacheFirst, AColdFileIsReadDirectAndAPartlyCachedOneFromBoth) {
  const std::string data = cold_file(2u << 20, 22);
  FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
  std::string out(data.size(), '\0');
  ASSERT_EQ(f.read(out.data(), out.size(), 0), out.size());
  EXPECT_EQ(out, data);
  EXPECT_LT(f.page_cache_bytes(), B) << "a dropped file came from the cache";
  // Its first half cached again (a buffered read, readahead may take more): the cached part
  // from the cache, the rest direct, the bytes the file's.
  std::string half(data.size() / 2, '\0');
  std::uint64_t from_cache = 0;
  const bool judged = left_alone([&] {
    os::File::open(dir / "f", os::File::Mode::read).drop_cache();
    EXPECT_EQ(os::File::open(dir / "f", os::File::Mode::read).read_at(half.data(), half.size(), 0), half.size());
    const std::vector<unsigned char> before = resident(data.size());
    FileHandle g = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
    std::fill(out.begin(), out.end(), '\0');
    EXPECT_EQ(g.read(out.data(), out.size(), 0), out.size());
    EXPECT_EQ(out, data);
    from_cache = g.page_cache_bytes();
    return missing_pages(before, resident(data.size()), 0, half.size());
  });
  if (!judged) GTEST_SKIP() << kTakenInEveryAttempt;
  EXPECT_GE(from_cache, half.size());
}

TEST_P(CacheFirst, APageTheKernelDroppedCostsOnlyItsBlock) {
  // A block whose pages the kernel dropped (DONTNEED here) is read direct; the blocks after
  // it still come from the cache, not direct to the end of the file.
  const std::string data = random_bytes(2u << 20, 24);
  constexpr std::size_t hole = 1 << 20;
  bool kept = false;
  std::uint64_t from_cache = 0;
  const bool judged = left_alone([&] {
    {
      // Written a page at a time: one large write may put the file in large folios, of which
      // the kernel drops none for a 64 KiB range.
      os::File w = os::File::open(dir / "f", os::File::Mode::write);
      for (std::size_t at = 0; at < data.size(); at += 4096) w.write_at(data.data() + at, 4096, at);
      w.sync();  // clean pages: DONTNEED drops only those
      EXPECT_EQ(::posix_fadvise(w.fd(), hole, B, POSIX_FADV_DONTNEED), 0);  // one block's pages
    }
    const std::vector<unsigned char> before = resident(data.size());
    kept = (before[hole / 4096] & 1) != 0;
    if (kept) return std::size_t{0};
    FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, options());
    std::string out(data.size(), '\0');
    EXPECT_EQ(f.read(out.data(), out.size(), 0), out.size());
    EXPECT_EQ(out, data);
    from_cache = f.page_cache_bytes();
    const std::vector<unsigned char> after = resident(data.size());
    return missing_pages(before, after, 0, hole) + missing_pages(before, after, hole + B, data.size());
  });
  if (kept) GTEST_SKIP() << "the kernel kept the pages DONTNEED named: no hole to read around";
  if (!judged) GTEST_SKIP() << kTakenInEveryAttempt;
  // The hole's block direct, and at most one more: a page the kernel was reclaiming during the
  // read refuses RWF_NOWAIT while mincore, before and after, counts it.
  EXPECT_GE(from_cache, data.size() - 2 * B);
  EXPECT_LT(from_cache, data.size()) << "the dropped block came from the cache";
}

INSTANTIATE_TEST_SUITE_P(Backends, CacheFirst, ::testing::Values("odirect", "io_uring"));

TEST(IoBackend, ForcingSelectsTheBackendThroughTheEnvironment) {
  for (const std::string name : {"posix", "odirect", "io_uring"}) {
    if (name == "io_uring" && !probe().io_uring) continue;
    ::setenv("MEDFAST_IO_BACKEND", name.c_str(), 1);
    Settings s;
    s.load_env();
    ::unsetenv("MEDFAST_IO_BACKEND");
    test::TempDir dir;
    test::write_file(dir / "f", "abc");
    const FileHandle f = FileHandle::open(dir / "f", FileHandle::Mode::read, IoOptions::from(s));
    EXPECT_EQ(backend_name(f.backend()), name);
    EXPECT_EQ(f.direct(), name != "posix");
  }
  const IoOptions automatic;
  EXPECT_EQ(select_backend(automatic), probe().io_uring ? Backend::io_uring : Backend::posix);
}

TEST(IoBackend, OptionsAreValidatedWithTheBadValue) {
  EXPECT_THROW(IoOptions().set_backend("tape"), ValueError);
  EXPECT_THROW(IoOptions().set_block_size(1000), ValueError);
  EXPECT_THROW(IoOptions().set_alignment(3000), ValueError);
  EXPECT_THROW(IoOptions().set_queue_depth(0), ValueError);
  EXPECT_VALUE_ERROR(IoOptions().set_block_size(6000), "6000");
  Settings s;
  EXPECT_THROW(s.set("io_direct", "maybe", SettingSource::flag), ValueError);
  EXPECT_TRUE(IoOptions::from(s).cache_first);
  s.set("io_cache_first", "off", SettingSource::flag);
  EXPECT_FALSE(IoOptions::from(s).cache_first);
  EXPECT_EQ(IoOptions::from(s).block_size, kDefaultIoBlockSize);
  EXPECT_EQ(IoOptions::from(s).queue_depth, kDefaultIoQueueDepth);
}

}  // namespace
}  // namespace medfast::io
