#pragma once
/// \file
/// The tensor file engine: one FileHandle whose backend (posix, odirect,
/// io_uring, cufile) is chosen at run time, probed once, logged once, and
/// forceable with MEDFAST_IO_BACKEND; one read and one write (pread, pwrite) for
/// host and device memory (memory.hpp), as kvikio's FileHandle has.
///
/// Device memory goes through cuFile (GPUDirect Storage, loaded with dlopen on
/// the first device transfer) when the nvidia-fs driver is loaded and io_backend
/// is auto or cufile (cufile: also in compatibility mode); otherwise the engine
/// bounces it through two pinned host buffers over the host backend: while one
/// is copied to the device on the caller's stream, the next chunk is read into
/// the other. cuFile moves bytes outside any stream, so the caller's stream is
/// waited for first (the memory may come from work still queued, or be still
/// being computed).
///
/// O_DIRECT protocol: the kernel moves data only between block-aligned file
/// offsets and block-aligned buffers, in block-aligned lengths. A request at
/// any offset, size and address is cut into aligned pieces: pieces whose
/// destination is aligned go straight to (or from) the caller's memory;
/// unaligned heads, tails and misaligned buffers go through aligned bounce
/// buffers (for io_uring, registered with the ring). Writes of partial blocks
/// read the block first (read-modify-write); a last partial block that reaches
/// past the end of the file is written through the page cache instead, so the
/// file is never padded (and never cut back). Concurrent writes that share a
/// block must not overlap in time; writes to different blocks are safe, also
/// while one of them extends the file.
///
/// Short transfers and EINTR are continued; EIO, ENOSPC and the like become
/// OsError naming the path, offset and size. Every system call goes through
/// os/ (io_uring completions pass through the same fault hooks as pread).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "medfast/core/io_options.hpp"  // IoOptions, MEDFAST_IO_BACKENDS
#include "medfast/io/memory.hpp"

namespace medfast::io {

enum class Backend {
#define MEDFAST_IO_BACKEND_ENUM(name) name,
  MEDFAST_IO_BACKENDS(MEDFAST_IO_BACKEND_ENUM)
#undef MEDFAST_IO_BACKEND_ENUM
};
const char* backend_name(Backend backend);
/// A backend's name ("posix", "odirect", ...); throws ValueError listing the names otherwise.
Backend parse_backend(const std::string& name);

/// What the run-time probe found; computed once per process.
struct IoProbe {
  bool io_uring = false;
  std::string io_uring_detail;  ///< why not, if not
};
const IoProbe& probe();

/// The backend `options` select for host memory (auto resolves through the probe).
Backend select_backend(const IoOptions& options);

/// What cuFile offers on this machine, in one line (loads it on first use).
std::string device_transfers();

/// One open file and the backend that moves its bytes.
class FileHandle {
 public:
  enum class Mode {
    read,        ///< existing file
    write,       ///< create or truncate
    read_write,  ///< create if missing, keep contents
  };

  static FileHandle open(const std::string& path, Mode mode, const IoOptions& options = {});
  FileHandle(FileHandle&&) noexcept;
  FileHandle& operator=(FileHandle&&) noexcept;
  ~FileHandle();

  Backend backend() const;
  const std::string& path() const;
  const IoOptions& options() const;
  /// True if O_DIRECT is in use (the file system may refuse it: then false).
  bool direct() const;
  std::uint64_t size() const;
  /// The bytes this handle's O_DIRECT reads took from the page cache (IoOptions::cache_first).
  std::uint64_t page_cache_bytes() const;

  /// Reads up to dst.size bytes at `offset` into host or device memory; fewer only at end
  /// of file. With `observe`, every byte passes through host memory and is shown to it in
  /// file order (device memory then takes the pinned bounce, not cuFile): checksums
  /// without a second pass.
  std::size_t pread(const Memory& dst, std::uint64_t offset, const HostBytes& observe = {});
  /// Writes all of src (host or device memory) at `offset`, or throws OsError naming path,
  /// offset and size.
  void pwrite(const Memory& src, std::uint64_t offset);
  /// pread and pwrite of host memory.
  std::size_t read(void* dst, std::size_t size, std::uint64_t offset) { return pread(Memory::host(dst, size), offset); }
  /// Reads exactly `size` bytes or throws FormatError naming path, offset and size.
  void read_exact(void* dst, std::size_t size, std::uint64_t offset);
  void write(const void* src, std::size_t size, std::uint64_t offset) { pwrite(Memory::host(src, size), offset); }
  /// Asynchronous forms, run on the engine's I/O workers (a fixed pool, not a thread per
  /// call); the memory must stay valid until the future is ready. The file stays open
  /// until the call is done, even if this handle is moved from or destroyed meanwhile.
  std::future<std::size_t> read_async(void* dst, std::size_t size, std::uint64_t offset);
  std::future<void> write_async(const void* src, std::size_t size, std::uint64_t offset);
  /// Runs `work` on the engine's I/O workers with a handle that shares this one's open
  /// file (kept open until `work` returns). `work` reports its own result and errors
  /// (an exception it lets out is lost), and must not wait for other async calls (the
  /// workers are few: waits on each other could take them all).
  void run_async(std::function<void(FileHandle&)> work) const;
  /// fsync.
  void sync();
  /// How device memory is reached for this file: "cufile", "cufile (compatibility
  /// mode)" or "bounce (pinned host buffers)" (loads cuFile where that decides it).
  std::string device_path();

 private:
  struct Impl;
  explicit FileHandle(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with async calls in flight
};

}  // namespace medfast::io
