#include "medfast/io/file_handle.hpp"

#include <fcntl.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <new>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/registry.hpp"
#include "medfast/core/thread_pool.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"

#include "file_backend.hpp"

namespace medfast::io {

// ---------------------------------------------------------------------------
// Names and options
// ---------------------------------------------------------------------------

namespace {

/// The backend table, made from MEDFAST_IO_BACKENDS as the enum is: row i is Backend i
/// (the factories are referenced here, so static linking keeps every backend).
constexpr Registered<detail::BackendFactory> kBackends[] = {
#define MEDFAST_IO_BACKEND_ROW(n) {#n, &detail::make_##n##_backend},
    MEDFAST_IO_BACKENDS(MEDFAST_IO_BACKEND_ROW)
#undef MEDFAST_IO_BACKEND_ROW
};

const Registered<detail::BackendFactory>& row_of(Backend b) { return kBackends[static_cast<std::size_t>(b)]; }

}  // namespace

const char* backend_name(Backend b) { return row_of(b).name; }

Backend parse_backend(const std::string& name) {
  if (const auto* row = find_registered(kBackends, name)) return static_cast<Backend>(row - kBackends);
  throw ValueError(str("I/O backend '", name, "' is not one of auto, ", registered_text(kBackends)));
}

// ---------------------------------------------------------------------------
// Probe
// ---------------------------------------------------------------------------

const IoProbe& probe() {
  static const IoProbe p = [] {
    IoProbe r;
    r.io_uring = detail::io_uring_available(r.io_uring_detail);
    log::info("io: host backend ", r.io_uring ? "io_uring" : "posix",
              r.io_uring ? "" : str(" (io_uring unavailable: ", r.io_uring_detail, ")"));
    return r;
  }();
  return p;
}

Backend select_backend(const IoOptions& options) {
  if (options.backend == "auto") return probe().io_uring ? Backend::io_uring : Backend::posix;
  const Backend b = parse_backend(options.backend);
  if (b == Backend::io_uring && !probe().io_uring) {
    throw Error(str("I/O backend io_uring was requested but is unavailable here: ", probe().io_uring_detail,
                    "; use io_backend=posix or auto"));
  }
  return b;
}

// ---------------------------------------------------------------------------
// Engine pieces the backends share (file_backend.hpp)
// ---------------------------------------------------------------------------

namespace detail {

namespace {

/// The engine's worker pools, one per thread count. A forked child (a PyTorch
/// DataLoader worker reading a disk cache) inherits the pools but not their
/// threads: the child drops them (without joining threads it does not have) and
/// makes its own on first use.
struct Pools {
  std::mutex mutex;
  std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::unique_ptr<ThreadPool> async;
};
Pools& pools() {
  static Pools* p = [] {
    auto* created = new Pools;
    ::pthread_atfork(nullptr, nullptr, [] {
      Pools& inherited = pools();
      new (&inherited.mutex) std::mutex;  // a parent thread may have held it at the fork
      for (auto& [n, pool] : inherited.pools) (void)pool.release();
      inherited.pools.clear();
      (void)inherited.async.release();
    });
    return created;
  }();
  return *p;
}

}  // namespace

ThreadPool& shared_pool(int threads) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto& pool = p.pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

/// Workers for async calls. Each call blocks on its own pieces (run on shared_pool), so
/// the two pools are separate: pieces never wait behind the calls that wait for them.
constexpr int kAsyncWorkers = 4;

ThreadPool& async_pool() {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.async) p.async = std::make_unique<ThreadPool>(kAsyncWorkers);
  return *p.async;
}

namespace {

/// Per-thread aligned scratch, one buffer per Slot.
template <int Slot>
char* scratch_block(std::size_t size) {
  thread_local os::Buffer buffer;
  if (buffer.size() < size) buffer = os::Buffer::allocate(size);
  return buffer.as<char>();
}

}  // namespace

char* bounce_block(std::size_t size) { return scratch_block<0>(size); }
char* patch_block(std::size_t size) { return scratch_block<1>(size); }

os::File OpenFile::open_direct_file() const {
  try {
    return os::File::open(path, mode == FileHandle::Mode::read ? os::File::Mode::read : os::File::Mode::read_write, O_DIRECT);
  } catch (const OsError& e) {
    if (e.errno_value() != EINVAL) throw;
    static std::once_flag once;
    std::call_once(once, [&] {
      log::info("io: the file system of ", path, " refuses O_DIRECT; using buffered I/O there");
    });
    return os::File();
  }
}

void OpenFile::open_direct() {
  if (!opt.direct) return;
  dfile = open_direct_file();
  direct = dfile.is_open();
}

}  // namespace detail

// ---------------------------------------------------------------------------
// FileHandle
// ---------------------------------------------------------------------------

struct FileHandle::Impl {
  detail::OpenFile f;  // declared first: outlives the backends that refer to it
  Backend backend = Backend::posix;
  std::unique_ptr<detail::FileBackend> engine;
  /// Device memory under io_backend auto with GPUDirect: a device-only cufile backend.
  std::once_flag device_once;
  std::unique_ptr<detail::FileBackend> device_engine;

  std::atomic<std::uint64_t> from_page_cache{0};

  /// Host memory: the backend, with what the page cache holds first (IoOptions::cache_first).
  std::size_t read(char* out, std::size_t n, std::uint64_t off) {
    if (n == 0) return 0;
    if (!f.direct || !f.opt.cache_first || !os::page_cache_reads()) return engine->read(Memory::host(out, n), off);
    // Cache first. The first block on the calling thread: a file that is not cached costs
    // one call and goes to the engine whole (io_uring's queue depth for a cold file).
    const auto first =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, detail::align_down(off, f.B()) + f.B() - off));
    const std::size_t got = f.file.read_cached(out, first, off);
    from_page_cache.fetch_add(got, std::memory_order_relaxed);
    if (got == 0) return engine->read(Memory::host(out, n), off);
    if (got == n || (got < first && off + got >= f.file.size())) return got;
    // Cached, at least in part: every block takes what the cache holds of it and the rest
    // O_DIRECT, so that a page the kernel dropped costs its block, not the rest of the file.
    return got + detail::run_pieces(detail::shared_pool(f.opt.workers()), off + got, n - got, f.B(),
                                    [&](std::uint64_t o, std::size_t l) {
                                      char* at = out + (o - off);
                                      std::size_t c = f.file.read_cached(at, l, o);
                                      from_page_cache.fetch_add(c, std::memory_order_relaxed);
                                      if (c < l) c += detail::read_direct_range(f, at + c, l - c, o + c);
                                      return c;
                                    });
  }

  /// The backend that reaches device memory itself, or null (the engine bounces it): the
  /// handle's own (cufile by name), or under auto a cufile one where GPUDirect is there.
  detail::FileBackend* device_backend() {
    const detail::DevicePath& path = detail::device_probe();  // logged once, on the first device transfer
    if (engine->reaches_device()) return engine.get();
    if (f.opt.backend != "auto") return nullptr;
    std::call_once(device_once, [&] {
      if (path.gpudirect) device_engine = detail::make_cufile_device_backend(f);
    });
    return device_engine && device_engine->reaches_device() ? device_engine.get() : nullptr;
  }

  std::size_t pread(const Memory& dst, std::uint64_t off, const HostBytes& observe) {
    if (dst.size == 0) return 0;
    if (dst.on_host()) {
      const std::size_t got = read(dst.bytes(), dst.size, off);
      if (observe && got > 0) observe(dst.data, got);
      return got;
    }
    if (!observe) {
      if (detail::FileBackend* direct = device_backend()) return direct->read(dst, off);
    }
    return detail::bounce_read([this](char* p, std::size_t n, std::uint64_t o) { return read(p, n, o); }, dst, off,
                               observe);
  }

  void pwrite(const Memory& src, std::uint64_t off) {
    if (f.mode == Mode::read) throw Error(str(f.path, ": write on a handle opened for reading"));
    if (src.size == 0) return;
    if (src.on_host()) return engine->write(src, off);
    if (detail::FileBackend* direct = device_backend()) return direct->write(src, off);
    detail::bounce_write(
        [this](const char* p, std::size_t n, std::uint64_t o) { engine->write(Memory::host(p, n), o); }, src, off);
  }
};

FileHandle::FileHandle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileHandle::FileHandle(FileHandle&&) noexcept = default;
FileHandle& FileHandle::operator=(FileHandle&&) noexcept = default;
FileHandle::~FileHandle() = default;

FileHandle FileHandle::open(const std::string& path, Mode mode, const IoOptions& options) {
  options.validate();
  auto impl = std::make_shared<Impl>();
  detail::OpenFile& f = impl->f;
  f.path = path;
  f.opt = options;
  f.mode = mode;
  impl->backend = select_backend(options);
  const auto fmode = mode == Mode::read ? os::File::Mode::read : os::File::Mode::read_write;
  f.file = os::File::open(path, fmode);
  if (mode == Mode::write) f.file.truncate(0);
  impl->engine = row_of(impl->backend).make(f);  // opens the O_DIRECT descriptor if it uses one
  return FileHandle(std::move(impl));
}

Backend FileHandle::backend() const { return impl_->backend; }
const std::string& FileHandle::path() const { return impl_->f.path; }
const IoOptions& FileHandle::options() const { return impl_->f.opt; }
bool FileHandle::direct() const { return impl_->f.direct; }
std::uint64_t FileHandle::size() const { return impl_->f.file.size(); }
std::uint64_t FileHandle::page_cache_bytes() const {
  return impl_->from_page_cache.load(std::memory_order_relaxed);
}

std::size_t FileHandle::pread(const Memory& dst, std::uint64_t offset, const HostBytes& observe) {
  return impl_->pread(dst, offset, observe);
}

void FileHandle::pwrite(const Memory& src, std::uint64_t offset) { impl_->pwrite(src, offset); }

void FileHandle::read_exact(void* dst, std::size_t size, std::uint64_t offset) {
  const std::size_t got = read(dst, size, offset);
  if (got != size) {
    throw FormatError(str(impl_->f.path, ": file is shorter than requested: needed ", size, " bytes at offset ", offset,
                          " but only ", got, " are there (file size ", impl_->f.file.size(), ")"));
  }
}

// The calls hold the Impl, not `this`: the handle may be moved or destroyed meanwhile.
std::future<std::size_t> FileHandle::read_async(void* dst, std::size_t size, std::uint64_t offset) {
  return detail::async_pool().submit([impl = impl_, dst, size, offset] { return impl->pread(Memory::host(dst, size), offset, {}); });
}

std::future<void> FileHandle::write_async(const void* src, std::size_t size, std::uint64_t offset) {
  return detail::async_pool().submit([impl = impl_, src, size, offset] { impl->pwrite(Memory::host(src, size), offset); });
}

void FileHandle::run_async(std::function<void(FileHandle&)> work) const {
  // The future is not kept: `work` reports its own result (ThreadPool keeps its
  // exceptions in the future, so `work` must catch what it wants to report).
  (void)detail::async_pool().submit([impl = impl_, work = std::move(work)] {
    FileHandle shared(impl);
    work(shared);
  });
}

void FileHandle::sync() { impl_->f.file.sync(); }

std::string FileHandle::device_path() {
  const detail::FileBackend* direct = impl_->device_backend();
  return direct ? direct->device_path() : "bounce (pinned host buffers)";
}

std::string device_transfers() { return detail::device_probe().description; }

}  // namespace medfast::io
