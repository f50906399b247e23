#pragma once
/// \file
/// Internal to src/io: the interface every backend of FileHandle implements, the open
/// file they share, and the engine pieces they use (worker pools, piece splitting,
/// O_DIRECT ranges, the pinned bounce). One file per backend, src/io/backend_<name>.cpp,
/// defining detail::make_<name>_backend; the list of backends is MEDFAST_IO_BACKENDS in
/// include/medfast/core/io_options.hpp (a new backend: its file and one entry there).

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "medfast/core/thread_pool.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/io/memory.hpp"
#include "medfast/os/file.hpp"

namespace medfast::io::detail {

inline std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v & ~(a - 1); }
inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }
inline bool is_aligned(const void* p, std::uint64_t a) { return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0; }

/// One open file as the backends see it: the buffered descriptor, and the O_DIRECT one
/// where a backend asked for it and the file system allows it.
struct OpenFile {
  std::string path;
  IoOptions opt;
  FileHandle::Mode mode = FileHandle::Mode::read;
  os::File file;   ///< buffered descriptor
  os::File dfile;  ///< O_DIRECT descriptor, if direct
  bool direct = false;

  /// An O_DIRECT descriptor of the file; a closed File where the file system refuses
  /// O_DIRECT (said once per process).
  os::File open_direct_file() const;
  /// Opens dfile when the options ask for O_DIRECT (opt.direct) and the file system allows it.
  void open_direct();
  std::uint64_t A() const { return opt.alignment; }
  std::uint64_t B() const { return opt.block_size; }
};

/// How one backend moves a file's bytes to and from memory: host memory always, device
/// memory where reaches_device() says so (cuFile); device memory a backend does not reach is
/// bounced through pinned host buffers by the engine (bounce_read/bounce_write below),
/// never by the backend. Calls may come from many threads at once (FileHandle is shared
/// by the loader's workers and async calls).
class FileBackend {
 public:
  virtual ~FileBackend() = default;
  /// Reads up to dst.size > 0 bytes at `off`; fewer only at end of file.
  virtual std::size_t read(const Memory& dst, std::uint64_t off) = 0;
  /// Writes all src.size > 0 bytes at `off`, or throws OsError naming path, offset and size.
  virtual void write(const Memory& src, std::uint64_t off) = 0;
  /// Whether it moves device memory itself (read and write take it then); host memory
  /// every backend moves.
  virtual bool reaches_device() { return false; }
  /// How it reaches device memory, for logs and `medfast io` ("" where it does not).
  virtual std::string device_path() const { return ""; }
};

/// Makes a backend for an open file (opening what else it needs, e.g. the O_DIRECT descriptor).
using BackendFactory = std::unique_ptr<FileBackend> (*)(OpenFile& file);
#define MEDFAST_IO_BACKEND_FACTORY(name) std::unique_ptr<FileBackend> make_##name##_backend(OpenFile& file);
MEDFAST_IO_BACKENDS(MEDFAST_IO_BACKEND_FACTORY)
#undef MEDFAST_IO_BACKEND_FACTORY

/// How device memory can be reached on this machine, found once per process on the first
/// device transfer (CPU-only runs never load libcufile) and logged once.
struct DevicePath {
  bool cufile = false;     ///< cuFile usable at all
  bool gpudirect = false;  ///< ... and not in compatibility mode
  std::string description;
};
const DevicePath& device_probe();

/// A cufile backend for device memory only (io_backend auto with GPUDirect Storage: host
/// memory stays with the host backend the probe chose).
std::unique_ptr<FileBackend> make_cufile_device_backend(OpenFile& file);

/// Whether the io_uring backend works here (a ring can be made); why not in `why`.
bool io_uring_available(std::string& why);

/// The engine's piece workers, one pool per thread count (a forked child makes its own).
ThreadPool& shared_pool(int threads);
/// The engine's workers for FileHandle's async calls: a fixed pool, not a thread per call.
ThreadPool& async_pool();
/// A per-thread aligned scratch block of at least `size` bytes (O_DIRECT heads, tails and
/// misaligned buffers).
char* bounce_block(std::size_t size);
/// A second one, for the block a write patches (it reads through bounce_block meanwhile).
char* patch_block(std::size_t size);

/// Runs fn(offset, length) over [offset, offset+size) cut at multiples of `block` (so
/// every piece but the first starts aligned), on the pool; returns the bytes of the
/// contiguous prefix that every piece reported done. The first error is rethrown after
/// every piece has finished (none is left writing into the caller's memory).
template <typename Fn>
std::size_t run_pieces(ThreadPool& pool, std::uint64_t offset, std::size_t size, std::uint64_t block, Fn fn) {
  struct Piece {
    std::uint64_t off;
    std::size_t len;
  };
  std::vector<Piece> pieces;
  for (std::uint64_t pos = offset; pos < offset + size;) {
    const std::uint64_t next = std::min<std::uint64_t>(align_down(pos, block) + block, offset + size);
    pieces.push_back({pos, static_cast<std::size_t>(next - pos)});
    pos = next;
  }
  if (pieces.size() <= 1) return pieces.empty() ? 0 : fn(pieces[0].off, pieces[0].len);
  std::vector<std::future<std::size_t>> futures;
  futures.reserve(pieces.size());
  for (const auto& p : pieces) futures.push_back(pool.submit([p, &fn] { return fn(p.off, p.len); }));
  std::size_t done = 0;
  bool complete = true;
  std::exception_ptr error;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    try {
      const std::size_t got = futures[i].get();
      if (complete) {
        done += got;
        if (got < pieces[i].len) complete = false;
      }
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return done;
}

/// Reads [off, off+n) through f.dfile at any offset, length and address (aligned pieces
/// straight into `out`, the rest through a bounce block); fewer bytes only at end of file.
std::size_t read_direct_range(const OpenFile& f, char* out, std::size_t n, std::uint64_t off);
/// Writes [off, off+n) through f.dfile; partial blocks are read, patched and rewritten,
/// except a last one reaching past the end of the file (its bytes go through f.file:
/// no padding, so the file never needs cutting back). Returns off+n.
std::uint64_t write_direct_range(OpenFile& f, const char* in, std::size_t n, std::uint64_t off);

/// The pinned bounce, the engine's composition for device memory a backend cannot reach:
/// `read_host` fills host memory (a backend's read, with the engine's page cache first),
/// `write_host` writes it. Reads are double-buffered: while one buffer's copy to the
/// device runs on the caller's stream, the next chunk is read into the other; `observe`
/// sees each chunk's bytes in file order. Returns the bytes read (fewer at end of file).
using HostRead = std::function<std::size_t(char* dst, std::size_t n, std::uint64_t off)>;
using HostWrite = std::function<void(const char* src, std::size_t n, std::uint64_t off)>;
std::size_t bounce_read(const HostRead& read_host, const Memory& dst, std::uint64_t off, const HostBytes& observe);
void bounce_write(const HostWrite& write_host, const Memory& src, std::uint64_t off);

}  // namespace medfast::io::detail
