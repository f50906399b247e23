#pragma once
/// \file
/// The OS layer: every system call medfast makes on files goes through here.
///
/// - EINTR is retried and short reads/writes are continued, so callers see
///   either the full transfer, a clean end of file, or an OsError that names
///   the operation, the path, the offset, the size and strerror(errno).
/// - Test hooks (os::testing) can make any call fail with a chosen errno
///   (EIO, ENOSPC, EINTR...) or transfer fewer bytes than asked, so error and
///   retry paths are tested without a broken disk.
/// - Files that medfast writes for the user are written to a temporary name
///   in the same directory, fsynced, renamed over the target, and the
///   directory is fsynced (AtomicWriter): a crash leaves either the old file
///   or the new one, never a torn one.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace medfast::os {

/// The operations a test hook can intercept.
enum class Op { open, read, write, fsync, rename, stat };
const char* op_name(Op op);

namespace testing {
/// What a hook decides for one call: fail with `error` (an errno), or let it
/// proceed and report at most `max_bytes` transferred (the call itself is made
/// in full, as a real short transfer would be, so O_DIRECT stays valid).
struct HookResult {
  int error = 0;
  std::size_t max_bytes = static_cast<std::size_t>(-1);
};
using Hook = std::function<HookResult(Op op, const std::string& path, std::uint64_t offset, std::size_t size)>;

/// Consults the installed hook for one transfer (used by code that does not
/// go through File::read_at, e.g. io_uring completions). Returns the errno to
/// fail with (0: proceed) and may shrink `size`.
int apply_hook(Op op, const std::string& path, std::uint64_t offset, std::size_t& size);

/// Installs a hook for the lifetime of the object (process-wide; tests only).
class ScopedHook {
 public:
  explicit ScopedHook(Hook hook);
  ~ScopedHook();
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;
};
}  // namespace testing

/// What `path` is where it is not a regular file ("a FIFO", "a socket", "a character device",
/// "a block device", "a directory"); "" for a regular file or a path that does not exist. A
/// stat, never an open: a FIFO does not block it.
std::string irregular_kind(const std::string& path);

/// Basic facts about a path.
struct FileInfo {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::uint64_t inode = 0;
  std::uint64_t device = 0;
  bool is_regular = false;
  bool is_directory = false;
};

/// An open file descriptor with its path, closed on destruction.
class File {
 public:
  enum class Mode {
    read,        ///< O_RDONLY
    write,       ///< O_WRONLY | O_CREAT | O_TRUNC
    read_write,  ///< O_RDWR | O_CREAT
    create_new,  ///< O_WRONLY | O_CREAT | O_EXCL
  };

  File() = default;
  /// Opens `path`; extra_flags are OR-ed in (e.g. O_DIRECT). Throws OsError.
  static File open(const std::string& path, Mode mode, int extra_flags = 0, mode_t permissions = 0644);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  FileInfo info() const;
  std::uint64_t size() const { return info().size; }

  /// Reads up to `size` bytes at `offset`, continuing after EINTR and short
  /// reads; returns fewer than `size` only at end of file.
  std::size_t read_at(void* buffer, std::size_t size, std::uint64_t offset) const;
  /// Reads exactly `size` bytes or throws (an early end of file is an error
  /// naming the path, offset, size and the bytes that were there).
  void read_exact(void* buffer, std::size_t size, std::uint64_t offset) const;
  /// One pread(2) (EINTR retried, no continuation of short reads): for
  /// O_DIRECT, where a continuation must restart at an aligned offset.
  std::size_t read_once(void* buffer, std::size_t size, std::uint64_t offset) const;
  /// Reads what the page cache already holds of [offset, offset + size), without waiting
  /// for a device (preadv2 with RWF_NOWAIT, Linux 4.14): stops at the first byte that is not
  /// cached, or at end of file. Returns the bytes read: 0 where none of them was cached, or
  /// where the kernel or the file system cannot read without waiting (page_cache_reads()
  /// then says false). Other errors throw as read_at's do.
  std::size_t read_cached(void* buffer, std::size_t size, std::uint64_t offset) const;
  /// One pwrite(2) (EINTR retried); returns the bytes written.
  std::size_t write_once(const void* buffer, std::size_t size, std::uint64_t offset);
  /// Asks the kernel to drop this file's clean pages from the page cache
  /// (posix_fadvise DONTNEED), so that the next read is cold. Best effort.
  void drop_cache();
  /// ftruncate(2).
  void truncate(std::uint64_t size);
  /// Writes all `size` bytes at `offset` or throws (ENOSPC, EIO...).
  void write_at(const void* buffer, std::size_t size, std::uint64_t offset);
  /// fsync(2).
  void sync();
  /// Closes now and reports a failing close(2) (deferred write errors).
  void close();

 private:
  int fd_ = -1;
  std::string path_;
};

/// Whether File::read_cached can read here (false once the kernel refused RWF_NOWAIT).
bool page_cache_reads();

FileInfo stat(const std::string& path);
bool exists(const std::string& path);
void rename(const std::string& from, const std::string& to);
/// Removes a file; a missing file is not an error.
void remove_file(const std::string& path);
/// mkdir -p.
void make_directories(const std::string& path);
/// Removes an empty directory; a missing one is not an error.
void remove_empty_directory(const std::string& path);
/// fsyncs a directory so that a rename inside it is durable.
void sync_directory(const std::string& path);
std::string parent_directory(const std::string& path);
/// `path` from the root: relative paths are taken from the working directory (leading "./"
/// dropped; nothing else is resolved).
std::string absolute_path(const std::string& path);
std::string read_text_file(const std::string& path);
/// Writes `text` to `path` through an AtomicWriter (temporary name, fsync, rename).
void write_text_file(const std::string& path, const std::string& text);
/// The names in a directory (without . and ..), sorted. OsError naming it.
std::vector<std::string> list_directory(const std::string& dir);

/// Where an AtomicWriter writes `path` first: ".<name>.medfast-tmp-<pid>-<n>" beside it, a name
/// no user would choose, hidden from a plain listing (os/folder_mark.hpp: who removes them).
std::string temporary_path(const std::string& path);
/// The writer's pid if `name` (a file name or path) is a temporary_path name.
std::optional<int> temporary_writer_pid(const std::string& name);
/// Files removed, and their bytes.
struct Removed {
  std::vector<std::string> paths;
  std::uint64_t bytes = 0;
};

/// An exclusive advisory lock (flock) on a file, held while the object lives (and released
/// by the kernel when the process dies, however it ends). The file holds the holder's pid.
class FileLock {
 public:
  FileLock() = default;
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  ~FileLock();
  bool held() const { return fd_ >= 0; }

 private:
  friend std::optional<FileLock> try_lock_file(const std::string& path, int* holder);
  int fd_ = -1;
};
/// Takes the lock on `path` (created if missing) without waiting: nullopt when another
/// process holds it (its pid in *holder where it wrote one, else 0). OsError naming the path
/// for anything else.
std::optional<FileLock> try_lock_file(const std::string& path, int* holder = nullptr);

/// Writes a file atomically: data goes to temporary_path(path) in the same
/// directory; commit() fsyncs it, renames it over `path` and fsyncs the
/// directory. Destroying an uncommitted writer removes the temporary file.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  File& file() { return file_; }
  const std::string& temp_path() const { return temp_path_; }
  /// Appends at the current end; throws on any failure.
  void append(const void* data, std::size_t size);
  std::uint64_t written() const { return written_; }
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  File file_;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace medfast::os
