#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "test_util.hpp"

namespace medfast::os {
namespace {

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return s;
}

TEST(OsFile, ReadExactAndReadAtEnd) {
  test::TempDir dir;
  const auto data = pattern(10000);
  test::write_file(dir / "f", data);
  File f = File::open(dir / "f", File::Mode::read);
  EXPECT_EQ(f.size(), 10000u);
  std::string buf(100, '\0');
  f.read_exact(buf.data(), 100, 5000);
  EXPECT_EQ(buf, data.substr(5000, 100));
  std::string tail(500, '\0');
  EXPECT_EQ(f.read_at(tail.data(), 500, 9800), 200u);  // short only at end of file
  EXPECT_EQ(tail.substr(0, 200), data.substr(9800));
}

TEST(OsFile, TruncatedReadNamesPathOffsetAndSize) {
  test::TempDir dir;
  test::write_file(dir / "short", pattern(100));
  File f = File::open(dir / "short", File::Mode::read);
  std::string buf(64, '\0');
  const std::string m = test::error_of<FormatError>([&] { f.read_exact(buf.data(), 64, 80); });
  EXPECT_TRUE(test::contains_all(m, {dir / "short", "offset 80", "64 bytes"}));
}

TEST(OsFile, MissingFileIsAnOsErrorWithThePath) {
  const std::string path = "/nonexistent/medfast/file.nii";
  test::with_error<OsError>([&] { File::open(path, File::Mode::read); }, [&](const OsError& e) {
    EXPECT_EQ(e.errno_value(), ENOENT);
    EXPECT_TRUE(test::contains_all(e.what(), {path, std::strerror(ENOENT)}));
  });
}

// Runs fn on a thread and waits at most `seconds`; a call that blocks past that (an open
// of a FIFO waits for a writer) fails the test instead of hanging it, and `release` then
// unblocks it so that the thread can end.
template <typename Fn>
bool finishes_within(double seconds, Fn&& fn, const std::function<void()>& release) {
  std::promise<void> done;
  std::future<void> f = done.get_future();
  std::thread t([&] {
    fn();
    done.set_value();
  });
  const bool in_time = f.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
  if (!in_time) release();
  t.join();
  return in_time;
}

// A FIFO, a socket, a device or a directory given as a file is refused at open, with its
// path and what it is, at once: opening a FIFO used to wait for a writer forever (train,
// info, plan, infer and cache verify hung with no output).
TEST(OsFile, NonRegularFilesAreRefusedAtOpenWithThePath) {
  test::TempDir dir;
  const std::string fifo = dir / "image.nii.gz";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const auto release = [&] {  // an open() blocked for its other end returns once that opens
    const int other = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    if (other >= 0) ::close(other);
  };
  for (const File::Mode mode : {File::Mode::read, File::Mode::write, File::Mode::read_write}) {
    std::string m;
    EXPECT_TRUE(finishes_within(5.0, [&] { m = test::error_of<OsError>([&] { File::open(fifo, mode); }); }, release));
    EXPECT_TRUE(test::contains_all(m, {"cannot open " + fifo + ": a FIFO, not a regular file"}));
  }
  std::string text;
  EXPECT_TRUE(finishes_within(5.0, [&] { text = test::error_of<OsError>([&] { read_text_file(fifo); }); }, release));
  EXPECT_TRUE(test::contains_all(text, {fifo, "a FIFO"}));

  const std::string sock = dir / "entry.mfc";
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  EXPECT_TRUE(test::contains_all(test::error_of<OsError>([&] { File::open(sock, File::Mode::read); }),
                                 {"cannot open " + sock + ": a socket, not a regular file"}));
  ::close(s);
  EXPECT_TRUE(test::contains_all(test::error_of<OsError>([&] { File::open("/dev/null", File::Mode::read); }),
                                 {"cannot open /dev/null: a character device"}));
  EXPECT_TRUE(test::contains_all(test::error_of<OsError>([&] { File::open(dir.path(), File::Mode::read); }),
                                 {"cannot open " + dir.path() + ": a directory"}));
  // A directory asked for as one still opens (fsync of a folder), and regular files as before.
  EXPECT_NO_THROW(sync_directory(dir.path()));
  test::write_file(dir / "plain", "abc");
  EXPECT_EQ(read_text_file(dir / "plain"), "abc");
  // The descriptor of a regular file blocks as usual: O_NONBLOCK was cleared after the check.
  const File f = File::open(dir / "plain", File::Mode::read);
  EXPECT_EQ(::fcntl(f.fd(), F_GETFL) & O_NONBLOCK, 0);
}

TEST(OsFile, EintrAndShortReadsAreRetried) {
  test::TempDir dir;
  const auto data = pattern(1 << 20);
  test::write_file(dir / "f", data);
  File f = File::open(dir / "f", File::Mode::read);
  int calls = 0;
  testing::ScopedHook hook([&](Op op, const std::string&, std::uint64_t, std::size_t) {
    testing::HookResult r;
    if (op != Op::read) return r;
    ++calls;
    if (calls % 3 == 1) r.error = EINTR;  // interrupted
    else r.max_bytes = 777;              // short transfer
    return r;
  });
  std::string buf(data.size(), '\0');
  f.read_exact(buf.data(), buf.size(), 0);
  EXPECT_EQ(buf, data);
  EXPECT_GT(calls, 1000);
}

TEST(OsFile, InjectedEioNamesPathOffsetSizeAndStrerror) {
  test::TempDir dir;
  test::write_file(dir / "f", pattern(8192));
  File f = File::open(dir / "f", File::Mode::read);
  testing::ScopedHook hook([](Op op, const std::string&, std::uint64_t offset, std::size_t) {
    testing::HookResult r;
    if (op == Op::read && offset >= 4096) r.error = EIO;
    else r.max_bytes = 4096;
    return r;
  });
  std::string buf(8192, '\0');
  test::with_error<OsError>([&] { f.read_exact(buf.data(), 8192, 0); }, [&](const OsError& e) {
    EXPECT_EQ(e.errno_value(), EIO);
    EXPECT_TRUE(test::contains_all(
        e.what(), {dir / "f", "8192 bytes at offset 0", "failed at offset 4096", std::strerror(EIO)}));
  });
}

TEST(OsFile, EnospcDuringAtomicWriteKeepsTheOldFileAndLeavesNoTemp) {
  test::TempDir dir;
  const std::string target = dir / "out.bin";
  test::write_file(target, "old contents");
  std::string temp;
  {
    testing::ScopedHook hook([](Op op, const std::string&, std::uint64_t offset, std::size_t) {
      testing::HookResult r;
      if (op == Op::write && offset >= 1000) r.error = ENOSPC;
      return r;
    });
    AtomicWriter w(target);
    temp = w.temp_path();
    const auto data = pattern(5000);
    test::with_error<OsError>(
        [&] {
          w.append(data.data(), 1000);
          w.append(data.data() + 1000, 4000);
        },
        [](const OsError& e) {
          EXPECT_EQ(e.errno_value(), ENOSPC);
          EXPECT_NE(std::string(e.what()).find("offset 1000"), std::string::npos) << e.what();
        });
  }
  EXPECT_EQ(test::read_file(target), "old contents");
  EXPECT_FALSE(exists(temp));
}

TEST(OsFile, AtomicWriterReplacesOnCommit) {
  test::TempDir dir;
  const std::string target = dir / "sub/dir/out.bin";
  make_directories(parent_directory(target));
  AtomicWriter w(target);
  w.append("hello ", 6);
  w.append("world", 5);
  EXPECT_FALSE(exists(target));  // nothing visible before commit
  w.commit();
  EXPECT_EQ(test::read_file(target), "hello world");
  EXPECT_FALSE(exists(w.temp_path()));
}

// An AtomicWriter that cannot start names the file asked for: a folder there, or no folder
// to write in (not only its temporary name).
TEST(OsFile, AtomicWriterErrorsNameTheTarget) {
  test::TempDir dir;
  make_directories(dir / "folder");
  const std::string in_folder = test::error_of<OsError>([&] { AtomicWriter w(dir / "folder"); });
  EXPECT_NE(in_folder.find("cannot write " + (dir / "folder") + ": it is a folder"), std::string::npos) << in_folder;
  const std::string missing = test::error_of<OsError>([&] { AtomicWriter w(dir / "missing/out.html"); });
  EXPECT_EQ(missing.rfind("cannot write " + (dir / "missing/out.html") + " (its temporary ", 0), 0u) << missing;
  EXPECT_NE(missing.find(std::strerror(ENOENT)), std::string::npos) << missing;
}

// Two holders of one lock file: the second is refused and told the first's pid; the lock
// goes with its holder.
TEST(OsFile, FileLockIsExclusiveAndNamesItsHolder) {
  test::TempDir dir;
  {
    std::optional<FileLock> first = try_lock_file(dir / "lock");
    ASSERT_TRUE(first && first->held());
    int holder = 0;
    EXPECT_FALSE(try_lock_file(dir / "lock", &holder));
    EXPECT_EQ(holder, ::getpid());
  }
  EXPECT_TRUE(try_lock_file(dir / "lock"));
}

TEST(OsFile, FsyncFailureIsReported) {
  test::TempDir dir;
  testing::ScopedHook hook([](Op op, const std::string&, std::uint64_t, std::size_t) {
    testing::HookResult r;
    if (op == Op::fsync) r.error = EIO;
    return r;
  });
  AtomicWriter w(dir / "x");
  w.append("abc", 3);
  EXPECT_THROW(w.commit(), OsError);
  EXPECT_FALSE(exists(dir / "x"));
}

TEST(OsMemory, BuffersAreAlignedAndWritable) {
  for (std::size_t n : {std::size_t{1}, std::size_t{4096}, std::size_t{5u << 20}, std::size_t{33u << 20} + 3}) {
    Buffer b = Buffer::allocate(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u);
    std::memset(b.data(), 0xab, n);
    EXPECT_EQ(b.as<unsigned char>()[n - 1], 0xab);
  }
  Buffer b = Buffer::allocate(8u << 20);
  void* p = b.release();
  EXPECT_EQ(b.data(), nullptr);
  Buffer::free(p, 8u << 20);
}

TEST(OsMemory, FreedLargeBuffersAreReusedWithinTheLimit) {
  trim_buffer_pool();
  set_buffer_pool_limit(kDefaultBufferPoolBytes);
  void* first;
  {
    Buffer a = Buffer::allocate(8u << 20);
    first = a.data();
    std::memset(a.data(), 1, a.size());
  }
  EXPECT_EQ(buffer_pool_bytes(), 8u << 20);
  {
    Buffer b = Buffer::allocate((8u << 20) - 100000);  // similar size: reused
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(buffer_pool_bytes(), 0u);
    Buffer c = Buffer::allocate(64u << 20);  // much larger: a new mapping
    EXPECT_NE(c.data(), first);
  }
  {
    Buffer d = Buffer::allocate(5u << 20);  // 8 MiB block is more than 25% too big: not reused
    EXPECT_NE(d.data(), first);
  }
  trim_buffer_pool();
  EXPECT_EQ(buffer_pool_bytes(), 0u);
  set_buffer_pool_limit(0);  // pooling off: freed memory goes back to the OS
  { Buffer e = Buffer::allocate(8u << 20); }
  EXPECT_EQ(buffer_pool_bytes(), 0u);
  set_buffer_pool_limit(kDefaultBufferPoolBytes);
}

}  // namespace
}  // namespace medfast::os
