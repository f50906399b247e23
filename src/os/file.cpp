#include "medfast/os/file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"

namespace medfast::os {

const char* op_name(Op op) {
  switch (op) {
    case Op::open: return "open";
    case Op::read: return "read";
    case Op::write: return "write";
    case Op::fsync: return "fsync";
    case Op::rename: return "rename";
    case Op::stat: return "stat";
  }
  return "?";
}

namespace testing {
namespace {
std::mutex g_hook_mutex;
std::shared_ptr<Hook> g_hook;
std::atomic<bool> g_hook_set{false};
}  // namespace

ScopedHook::ScopedHook(Hook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook = std::make_shared<Hook>(std::move(hook));
  g_hook_set = true;
}

ScopedHook::~ScopedHook() {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook.reset();
  g_hook_set = false;
}
}  // namespace testing

namespace {

// Consults the test hook, if any. Returns the errno to fail with (0: go on)
// and may shrink `size` to simulate a short transfer.
int consult_hook(Op op, const std::string& path, std::uint64_t offset, std::size_t& size) {
  if (!testing::g_hook_set.load(std::memory_order_relaxed)) return 0;
  std::shared_ptr<testing::Hook> hook;
  {
    std::lock_guard<std::mutex> lock(testing::g_hook_mutex);
    hook = testing::g_hook;
  }
  if (!hook) return 0;
  const testing::HookResult r = (*hook)(op, path, offset, size);
  if (r.error != 0) return r.error;
  if (r.max_bytes < size) size = r.max_bytes;
  return 0;
}

}  // namespace

int testing::apply_hook(Op op, const std::string& path, std::uint64_t offset, std::size_t& size) {
  return consult_hook(op, path, offset, size);
}

namespace {

int consult_hook(Op op, const std::string& path) {
  std::size_t size = 0;
  return consult_hook(op, path, 0, size);
}

[[noreturn]] void throw_os(const std::string& what, int err) {
  throw OsError(str(what, ": ", std::strerror(err)), err);
}

FileInfo to_info(const struct ::stat& st) {
  FileInfo fi;
  fi.size = static_cast<std::uint64_t>(st.st_size);
  fi.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  fi.inode = st.st_ino;
  fi.device = st.st_dev;
  fi.is_regular = S_ISREG(st.st_mode);
  fi.is_directory = S_ISDIR(st.st_mode);
  return fi;
}

}  // namespace

namespace {

// What a path that is not a regular file is, for the message that refuses it.
const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISDIR(m)) return "a directory";
  return "not a regular file";
}

}  // namespace

std::string irregular_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  return kind_of(st.st_mode);
}

namespace {

[[noreturn]] void refuse_irregular(const std::string& path, mode_t m) {
  throw OsError(str("cannot open ", path, ": ", kind_of(m), ", not a regular file (medfast reads and writes only "
                    "regular files: a FIFO, socket or device could block or never end)"),
                ENODEV);  // not EINVAL: that is how a file system refuses O_DIRECT (io/file_handle.cpp)
}

}  // namespace

File File::open(const std::string& path, Mode mode, int extra_flags, mode_t permissions) {
  // Only regular files (and directories asked for with O_DIRECTORY) are opened. Opening a
  // FIFO waits for its other end, forever where there is none, so the open is made
  // O_NONBLOCK (it returns at once, or fails with ENXIO for a writer without a reader),
  // fstat refuses anything else with the path, and O_NONBLOCK is cleared again.
  int flags = O_CLOEXEC | O_NONBLOCK | extra_flags;
  switch (mode) {
    case Mode::read: flags |= O_RDONLY; break;
    case Mode::write: flags |= O_WRONLY | O_CREAT | O_TRUNC; break;
    case Mode::read_write: flags |= O_RDWR | O_CREAT; break;
    case Mode::create_new: flags |= O_WRONLY | O_CREAT | O_EXCL; break;
  }
  if (int err = consult_hook(Op::open, path)) throw_os(str("cannot open ", path), err);
  int fd;
  do {
    fd = ::open(path.c_str(), flags, permissions);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    struct ::stat st {};
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse_irregular(path, st.st_mode);
    throw_os(str("cannot open ", path), err);
  }
  File f;  // closes fd on the way out of a refusal
  f.fd_ = fd;
  f.path_ = path;
  struct ::stat st {};
  if (::fstat(fd, &st) != 0) throw_os(str("cannot stat ", path), errno);
  const bool directory_asked = (extra_flags & O_DIRECTORY) != 0;
  if (!S_ISREG(st.st_mode) && !(directory_asked && S_ISDIR(st.st_mode))) refuse_irregular(path, st.st_mode);
  if ((extra_flags & O_NONBLOCK) == 0) {
    const int now = ::fcntl(fd, F_GETFL);
    if (now < 0 || ::fcntl(fd, F_SETFL, now & ~O_NONBLOCK) != 0) throw_os(str("cannot set the flags of ", path), errno);
  }
  return f;
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

FileInfo File::info() const {
  if (int err = consult_hook(Op::stat, path_)) throw_os(str("cannot stat ", path_), err);
  struct ::stat st {};
  if (::fstat(fd_, &st) != 0) throw_os(str("cannot stat ", path_), errno);
  return to_info(st);
}

namespace {

/// The loop every pread/pwrite goes through: pieces of at most 1 GiB (Linux
/// moves at most 0x7ffff000 bytes per call), EINTR retried, short transfers
/// continued, the test hook consulted before each call (it may fail it or
/// shorten it). Reads stop at end of file; returns the bytes moved.
template <typename Syscall>
std::size_t transfer_all(Op op, const std::string& path, std::size_t size, std::uint64_t offset, Syscall&& call) {
  const bool write = op == Op::write;
  auto fail = [&](std::uint64_t at, int err) {
    throw_os(str(write ? "write of " : "read of ", size, " bytes at offset ", offset, write ? " to " : " from ", path,
                 " failed at offset ", at),
             err);
  };
  std::size_t done = 0;
  while (done < size) {
    const std::size_t chunk = std::min<std::size_t>(size - done, 0x40000000);
    const std::uint64_t at = offset + done;
    std::size_t limit = chunk;
    if (int err = consult_hook(op, path, at, limit)) {
      if (err == EINTR) continue;
      fail(at, err);
    }
    ssize_t n = call(done, chunk, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(at, errno);
    }
    if (static_cast<std::size_t>(n) > limit) n = static_cast<ssize_t>(limit);  // a simulated short transfer
    if (n == 0 && !write) break;                                                // end of file
    done += static_cast<std::size_t>(n);
  }
  return done;
}

}  // namespace

std::size_t File::read_at(void* buffer, std::size_t size, std::uint64_t offset) const {
  auto* out = static_cast<char*>(buffer);
  return transfer_all(Op::read, path_, size, offset, [&](std::size_t done, std::size_t chunk, std::uint64_t at) {
    return ::pread(fd_, out + done, chunk, static_cast<off_t>(at));
  });
}

namespace {

/// One pread/pwrite (`call(chunk)`) of at most 1 GiB, through the fault hook, EINTR
/// retried; the bytes moved (a hook may cut them short).
template <typename Call>
std::size_t transfer_once(Op op, const std::string& path, std::size_t size, std::uint64_t offset, Call call) {
  const auto fail = [&](int err) {
    throw_os(op == Op::read ? str("read of ", size, " bytes at offset ", offset, " from ", path, " failed")
                            : str("write of ", size, " bytes at offset ", offset, " to ", path, " failed"),
             err);
  };
  for (;;) {
    const std::size_t chunk = std::min<std::size_t>(size, 0x40000000);
    std::size_t limit = chunk;
    if (int err = consult_hook(op, path, offset, limit)) {
      if (err == EINTR) continue;
      fail(err);
    }
    const ssize_t n = call(chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    return std::min(static_cast<std::size_t>(n), limit);
  }
}

}  // namespace

std::size_t File::read_once(void* buffer, std::size_t size, std::uint64_t offset) const {
  return transfer_once(Op::read, path_, size, offset,
                       [&](std::size_t chunk) { return ::pread(fd_, buffer, chunk, static_cast<off_t>(offset)); });
}

namespace {
std::atomic<bool> g_nowait_refused{false};
}  // namespace

bool page_cache_reads() {
  return !g_nowait_refused.load(std::memory_order_relaxed);
}

std::size_t File::read_cached(void* buffer, std::size_t size, std::uint64_t offset) const {
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size && !g_nowait_refused.load(std::memory_order_relaxed)) {
    std::size_t chunk = std::min<std::size_t>(size - done, 0x40000000);
    if (int err = consult_hook(Op::read, path_, offset + done, chunk)) {
      if (err == EINTR) continue;
      throw_os(str("read of ", size - done, " bytes at offset ", offset + done, " from ", path_, " failed"), err);
    }
#ifdef RWF_NOWAIT
    iovec iov{out + done, chunk};
    const ssize_t n = ::preadv2(fd_, &iov, 1, static_cast<off_t>(offset + done), RWF_NOWAIT);
#else
    const ssize_t n = -1;
    errno = ENOSYS;
#endif
    if (n > 0) {
      done += std::min(static_cast<std::size_t>(n), chunk);
      continue;
    }
    if (n == 0) break;  // end of file
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;  // the next byte is not cached
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      g_nowait_refused.store(true, std::memory_order_relaxed);  // this kernel or file system: never
      break;
    }
    throw_os(str("read of ", size - done, " bytes at offset ", offset + done, " from ", path_, " failed"), errno);
  }
  return done;
}

std::size_t File::write_once(const void* buffer, std::size_t size, std::uint64_t offset) {
  return transfer_once(Op::write, path_, size, offset,
                       [&](std::size_t chunk) { return ::pwrite(fd_, buffer, chunk, static_cast<off_t>(offset)); });
}

void File::drop_cache() {
  ::fdatasync(fd_);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

void File::truncate(std::uint64_t size) {
  int r;
  do {
    r = ::ftruncate(fd_, static_cast<off_t>(size));
  } while (r != 0 && errno == EINTR);
  if (r != 0) throw_os(str("cannot truncate ", path_, " to ", size, " bytes"), errno);
}

void File::read_exact(void* buffer, std::size_t size, std::uint64_t offset) const {
  const std::size_t got = read_at(buffer, size, offset);
  if (got != size) {
    throw FormatError(str(path_, ": file is truncated: needed ", size, " bytes at offset ", offset,
                          " but the file ends after ", got, " of them (file size ", offset + got, ")"));
  }
}

void File::write_at(const void* buffer, std::size_t size, std::uint64_t offset) {
  const auto* in = static_cast<const char*>(buffer);
  transfer_all(Op::write, path_, size, offset, [&](std::size_t done, std::size_t chunk, std::uint64_t at) {
    return ::pwrite(fd_, in + done, chunk, static_cast<off_t>(at));
  });
}

void File::sync() {
  if (int err = consult_hook(Op::fsync, path_)) throw_os(str("fsync of ", path_, " failed"), err);
  if (::fsync(fd_) != 0) throw_os(str("fsync of ", path_, " failed"), errno);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) throw_os(str("close of ", path_, " failed"), errno);
}

FileInfo stat(const std::string& path) {
  if (int err = consult_hook(Op::stat, path)) throw_os(str("cannot stat ", path), err);
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_os(str("cannot stat ", path), errno);
  return to_info(st);
}

bool exists(const std::string& path) {
  struct ::stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void rename(const std::string& from, const std::string& to) {
  if (int err = consult_hook(Op::rename, to)) throw_os(str("cannot rename ", from, " to ", to), err);
  if (::rename(from.c_str(), to.c_str()) != 0) throw_os(str("cannot rename ", from, " to ", to), errno);
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_os(str("cannot remove ", path), errno);
}

void remove_empty_directory(const std::string& path) {
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) throw_os(str("cannot remove folder ", path), errno);
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}
FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}
FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<FileLock> try_lock_file(const std::string& path, int* holder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw_os(str("cannot open lock file ", path), errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) {
      ::close(fd);
      throw_os(str("cannot lock ", path), e);
    }
    if (holder != nullptr) {
      char text[32] = {};
      const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
      *holder = n > 0 ? std::atoi(text) : 0;
    }
    ::close(fd);
    return std::nullopt;
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int e = errno;
    ::close(fd);
    throw_os(str("cannot write ", path), e);
  }
  FileLock lock;
  lock.fd_ = fd;
  return lock;
}

void make_directories(const std::string& path) {
  if (path.empty()) return;
  std::string partial;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw_os(str("cannot create directory ", partial), errno);
    }
  }
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw OsError(str("cannot create directory ", path, ": a file of that name exists"), ENOTDIR);
  }
}

std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string absolute_path(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  std::vector<char> buf(4096);
  while (::getcwd(buf.data(), buf.size()) == nullptr) {
    if (errno != ERANGE) throw_os("cannot read the working directory", errno);
    buf.resize(buf.size() * 2);
  }
  std::string dir(buf.data());
  std::string rest = path;
  while (rest.rfind("./", 0) == 0) rest = rest.substr(2);
  if (rest.empty() || rest == ".") return dir;
  return (dir == "/" ? "" : dir) + "/" + rest;
}

void sync_directory(const std::string& path) {
  File dir = File::open(path, File::Mode::read, O_DIRECTORY);
  if (int err = consult_hook(Op::fsync, path)) throw_os(str("fsync of directory ", path, " failed"), err);
  // Some file systems do not support fsync on directories; that is not a data-loss error.
  if (::fsync(dir.fd()) != 0 && errno != EINVAL && errno != EROFS) {
    throw_os(str("fsync of directory ", path, " failed"), errno);
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  AtomicWriter w(path);
  w.append(text.data(), text.size());
  w.commit();
}

std::string read_text_file(const std::string& path) {
  File f = File::open(path, File::Mode::read);
  std::string text(f.size(), '\0');
  text.resize(f.read_at(text.data(), text.size(), 0));
  return text;
}

std::vector<std::string> list_directory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw_os(str("cannot list folder ", dir), errno);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) throw_os(str("cannot list folder ", dir), err);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
std::atomic<std::uint64_t> g_temp_counter{0};
constexpr const char* kTempMarker = ".medfast-tmp-";
}  // namespace

std::string temporary_path(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return str(dir, ".", name, kTempMarker, ::getpid(), "-", g_temp_counter.fetch_add(1));
}

std::optional<int> temporary_writer_pid(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.size() < 2 || name[0] != '.') return std::nullopt;
  const auto pos = name.rfind(kTempMarker);
  if (pos == std::string::npos || pos < 2) return std::nullopt;  // ".<target>" before it
  const std::string rest = name.substr(pos + std::strlen(kTempMarker));  // <pid>-<n>
  const auto dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos || dash + 1 == rest.size()) return std::nullopt;
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c == '-' || (c >= '0' && c <= '9'); }) ||
      rest.find('-', dash + 1) != std::string::npos || dash > 9) {
    return std::nullopt;
  }
  return std::atoi(rest.substr(0, dash).c_str());
}

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw_os(str("cannot write ", path_, ": it is a folder (a file name was expected)"), EISDIR);
  }
  temp_path_ = temporary_path(path_);
  try {
    file_ = File::open(temp_path_, File::Mode::create_new);
  } catch (const OsError& e) {  // named by the file asked for, not its temporary name
    throw_os(str("cannot write ", path_, " (its temporary ", temp_path_, ")"), e.errno_value());
  }
}

AtomicWriter::~AtomicWriter() {
  if (!committed_) {
    file_ = File();
    ::unlink(temp_path_.c_str());
  }
}

void AtomicWriter::append(const void* data, std::size_t size) {
  file_.write_at(data, size, written_);
  written_ += size;
}

void AtomicWriter::commit() {
  file_.sync();
  file_.close();
  os::rename(temp_path_, path_);
  committed_ = true;
  sync_directory(parent_directory(path_));
}

}  // namespace medfast::os
