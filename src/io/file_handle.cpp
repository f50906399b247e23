#include "medfast/io/file_handle.hpp"

#include <fcntl.h>
#include <pthread.h>

#include <new>
#if MEDFAST_HAVE_IO_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/thread_pool.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/shim/cufile.hpp"

namespace medfast::io {

// ---------------------------------------------------------------------------
// Names and options
// ---------------------------------------------------------------------------

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::posix: return "posix";
    case Backend::odirect: return "odirect";
    case Backend::io_uring: return "io_uring";
    case Backend::cufile: return "cufile";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  if (name == "posix") return Backend::posix;
  if (name == "odirect") return Backend::odirect;
  if (name == "io_uring") return Backend::io_uring;
  if (name == "cufile") return Backend::cufile;
  throw ValueError(str("I/O backend '", name, "' is not one of auto, posix, odirect, io_uring, cufile"));
}

IoOptions& IoOptions::set_backend(const std::string& v) {
  if (v != "auto") parse_backend(v);
  backend = v;
  return *this;
}
IoOptions& IoOptions::set_block_size(std::uint64_t v) {
  IoOptions next = *this;
  next.block_size = v;
  next.validate();
  block_size = v;
  return *this;
}
IoOptions& IoOptions::set_queue_depth(int v) {
  if (v < 1) throw ValueError(str("IoOptions: queue_depth ", v, " must be at least 1"));
  queue_depth = v;
  return *this;
}
IoOptions& IoOptions::set_threads(int v) {
  if (v < 1) throw ValueError(str("IoOptions: threads ", v, " must be at least 1"));
  threads = v;
  return *this;
}
IoOptions& IoOptions::set_alignment(std::uint64_t v) {
  IoOptions next = *this;
  next.alignment = v;
  next.validate();
  alignment = v;
  return *this;
}

void IoOptions::validate() const {
  if (alignment != 512 && alignment != 1024 && alignment != 2048 && alignment != 4096) {
    throw ValueError(str("IoOptions: alignment ", alignment, " must be 512, 1024, 2048 or 4096"));
  }
  if (block_size < alignment || block_size % alignment != 0 || block_size > (1ull << 30)) {
    throw ValueError(str("IoOptions: block_size ", block_size, " must be a multiple of the alignment (", alignment,
                         ") and at most 1 GiB"));
  }
  if (queue_depth < 1) throw ValueError(str("IoOptions: queue_depth ", queue_depth, " must be at least 1"));
  if (threads < 1) throw ValueError(str("IoOptions: threads ", threads, " must be at least 1"));
  if (backend != "auto") parse_backend(backend);
}

IoOptions IoOptions::from(const Settings& s) {
  IoOptions o;
  o.backend = s.get("io_backend");
  o.block_size = s.get_bytes("io_block_size");
  o.queue_depth = static_cast<int>(s.get_int("io_queue_depth"));
  const auto t = s.get_int("io_threads");
  o.threads = t > 0 ? static_cast<int>(t) : s.threads();
  o.direct = s.get_bool("io_direct");
  o.alignment = s.get_bytes("io_alignment");
  try {
    o.validate();
  } catch (ValueError& e) {
    e.add_context("settings io_*");
    throw;
  }
  return o;
}

// ---------------------------------------------------------------------------
// Probe
// ---------------------------------------------------------------------------

const IoProbe& probe() {
  static const IoProbe p = [] {
    IoProbe r;
#if MEDFAST_HAVE_IO_URING
    io_uring ring;
    const int e = io_uring_queue_init(4, &ring, 0);
    if (e == 0) {
      io_uring_queue_exit(&ring);
      r.io_uring = true;
    } else {
      r.io_uring_detail = str("io_uring_queue_init: ", std::strerror(-e));
    }
#else
    r.io_uring_detail = "this medfast was built without liburing (cmake -DMEDFAST_WITH_IO_URING=ON needs liburing-dev)";
#endif
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
// Helpers
// ---------------------------------------------------------------------------

namespace {

std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v & ~(a - 1); }
std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }
bool is_aligned(const void* p, std::uint64_t a) { return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0; }

/// The engine's worker pools, one per thread count. A forked child (a PyTorch
/// DataLoader worker reading a disk cache) inherits the pools but not their
/// threads: the child drops them (without joining threads it does not have) and
/// makes its own on first use.
struct Pools {
  std::mutex mutex;
  std::map<int, std::unique_ptr<ThreadPool>> pools;
};
Pools& pools() {
  static Pools* p = [] {
    auto* created = new Pools;
    ::pthread_atfork(nullptr, nullptr, [] {
      Pools& inherited = pools();
      new (&inherited.mutex) std::mutex;  // a parent thread may have held it at the fork
      for (auto& [n, pool] : inherited.pools) (void)pool.release();
      inherited.pools.clear();
    });
    return created;
  }();
  return *p;
}

ThreadPool& shared_pool(int threads) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto& pool = p.pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// A per-thread aligned scratch block for O_DIRECT heads, tails and misaligned buffers.
char* bounce_block(std::size_t size) {
  thread_local os::Buffer buffer;
  if (buffer.size() < size) buffer = os::Buffer::allocate(size);
  return buffer.as<char>();
}

// Runs fn(offset, length) over [offset, offset+size) cut at multiples of
// `block` (so every piece but the first starts aligned), on the pool; returns
// the bytes of the contiguous prefix that every piece reported done.
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

#if MEDFAST_HAVE_IO_URING
// io_uring ring with lazily registered bounce buffers.
struct Ring {
  io_uring ring{};
  std::vector<os::Buffer> bounce;
  std::vector<iovec> iov;
  bool registered = false;
  bool files_registered = false;  // slot 0: buffered descriptor, slot 1: O_DIRECT descriptor
  unsigned entries = 0;
  ~Ring() { io_uring_queue_exit(&ring); }
};
#else
struct Ring {};  // built without liburing: the io_uring backend is never selected (probe() says why)
#endif

constexpr int kMaxBounce = 16;

}  // namespace

// ---------------------------------------------------------------------------
// FileHandle
// ---------------------------------------------------------------------------

struct FileHandle::Impl {
  std::string path;
  IoOptions opt;
  Backend backend = Backend::posix;
  Mode mode = Mode::read;
  os::File file;   // buffered descriptor
  os::File dfile;  // O_DIRECT descriptor, if direct
  bool direct = false;
  std::mutex ring_mutex;
  std::vector<std::unique_ptr<Ring>> rings;
  std::once_flag cufile_once;
  void* cufile = nullptr;
  os::File cufile_file;  // the O_DIRECT descriptor registered with cuFile, if the file system allows it

  /// An O_DIRECT descriptor of the file; a closed File where the file system
  /// refuses O_DIRECT (said once per process).
  os::File open_direct_file() const {
    try {
      return os::File::open(path, mode == Mode::read ? os::File::Mode::read : os::File::Mode::read_write, O_DIRECT);
    } catch (const OsError& e) {
      if (e.errno_value() != EINVAL) throw;
      static std::once_flag once;
      std::call_once(once, [&] {
        log::warn("io: the file system of ", path, " refuses O_DIRECT; using buffered I/O there");
      });
      return os::File();
    }
  }

  ~Impl() {
    if (cufile) shim::cufile()->handle_deregister(cufile);
  }

  std::uint64_t A() const { return opt.alignment; }
  std::uint64_t B() const { return opt.block_size; }

  // ---- O_DIRECT ranges (single thread) ----

  // Reads [off, off+n) through dfile at any offset/length/address.
  std::size_t read_direct_range(char* out, std::size_t n, std::uint64_t off) {
    const std::uint64_t end = off + n;
    std::uint64_t pos = off;
    int stalls = 0;
    while (pos < end) {
      const std::uint64_t a = align_down(pos, A());
      char* here = out + (pos - off);
      if (pos == a && is_aligned(here, A()) && end - pos >= A()) {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_down(end - pos, A())));
        const std::size_t got = dfile.read_once(here, len, pos);
        if (got == 0) break;
        pos += got;
      } else {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_up(end - a, A())));
        char* bounce = bounce_block(static_cast<std::size_t>(B()));
        const std::size_t got = dfile.read_once(bounce, len, a);
        if (a + got <= pos) {
          // Nothing new: end of file, or a short read that stopped before pos.
          if (got == 0 || pos >= dfile.size()) break;
          if (++stalls > 1000) {
            throw OsError(str("read at offset ", pos, " from ", path, " makes no progress"), EIO);
          }
          continue;
        }
        const std::uint64_t stop = std::min<std::uint64_t>(a + got, end);
        std::memcpy(here, bounce + (pos - a), static_cast<std::size_t>(stop - pos));
        pos = stop;
      }
    }
    return static_cast<std::size_t>(pos - off);
  }

  // Writes a whole aligned block region from an aligned buffer, retrying the
  // region if a short write leaves an unaligned remainder.
  void write_aligned_region(const char* buf, std::size_t len, std::uint64_t a) {
    std::size_t done = 0;
    int retries = 0;
    while (done < len) {
      const std::size_t w = dfile.write_once(buf + done, len - done, a + done);
      if (w == 0 || ++retries > 1000) {
        throw OsError(str("write of ", len, " bytes at offset ", a, " to ", path, " makes no progress"), EIO);
      }
      done += w;
      if (done % A() != 0) done = align_down(done, A());  // redo the partial block from an aligned start
    }
  }

  // Writes [off, off+n) through dfile; partial blocks are read, patched and
  // rewritten. Returns the end of the last block written (may pass off+n).
  std::uint64_t write_direct_range(const char* in, std::size_t n, std::uint64_t off) {
    const std::uint64_t end = off + n;
    std::uint64_t pos = off, written_end = off;
    while (pos < end) {
      const std::uint64_t a = align_down(pos, A());
      const char* here = in + (pos - off);
      if (pos == a && is_aligned(here, A()) && end - pos >= A()) {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_down(end - pos, A())));
        write_aligned_region(here, len, pos);
        pos += len;
        written_end = std::max(written_end, pos);
      } else {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_up(end - a, A())));
        char* bounce = bounce_block(static_cast<std::size_t>(B()));
        std::size_t have = 0;
        while (have < len) {  // existing bytes of the region (short at end of file)
          const std::size_t got = dfile.read_once(bounce + have, len - have, a + have);
          if (got == 0) break;
          have += got;
          if (have % A() != 0 && have < len) {
            // Unaligned short read: the rest comes from the bounce-read path.
            have = static_cast<std::size_t>(align_down(have, A()));
            const std::size_t rest = read_direct_range(bounce + have, len - have, a + have);
            have += rest;
            break;
          }
        }
        std::memset(bounce + have, 0, len - have);
        const std::uint64_t stop = std::min<std::uint64_t>(end, a + len);
        std::memcpy(bounce + (pos - a), here, static_cast<std::size_t>(stop - pos));
        write_aligned_region(bounce, len, a);
        written_end = std::max<std::uint64_t>(written_end, a + len);
        pos = stop;
      }
    }
    return written_end;
  }

  // ---- io_uring ----

#if MEDFAST_HAVE_IO_URING
  std::unique_ptr<Ring> take_ring() {
    {
      std::lock_guard<std::mutex> lock(ring_mutex);
      if (!rings.empty()) {
        auto r = std::move(rings.back());
        rings.pop_back();
        return r;
      }
    }
    auto r = std::make_unique<Ring>();
    r->entries = static_cast<unsigned>(std::min(opt.queue_depth, 4096));
    const int e = io_uring_queue_init(r->entries, &r->ring, 0);
    if (e < 0) throw OsError(str("io_uring_queue_init(", r->entries, ") for ", path, ": ", std::strerror(-e)), -e);
    // Registered descriptors spare the kernel a file lookup per request.
    const int fds[2] = {file.fd(), direct ? dfile.fd() : file.fd()};
    r->files_registered = io_uring_register_files(&r->ring, fds, 2) == 0;
    return r;
  }

  void give_ring(std::unique_ptr<Ring> r) {
    std::lock_guard<std::mutex> lock(ring_mutex);
    rings.push_back(std::move(r));
  }

  void ensure_bounce(Ring& r) {
    if (!r.bounce.empty()) return;
    const int n = std::min(opt.queue_depth, kMaxBounce);
    for (int i = 0; i < n; ++i) {
      r.bounce.push_back(os::Buffer::allocate(static_cast<std::size_t>(B())));
      r.iov.push_back({r.bounce.back().data(), static_cast<std::size_t>(B())});
    }
    // Registered buffers skip the per-request page pinning; a kernel that
    // refuses (RLIMIT_MEMLOCK) still works with plain reads.
    r.registered = io_uring_register_buffers(&r.ring, r.iov.data(), static_cast<unsigned>(r.iov.size())) == 0;
  }
#endif

  struct UringOp {
    std::uint64_t file_off;  // where the kernel transfer starts (aligned for direct)
    std::size_t len;         // kernel transfer length
    char* user;              // caller memory for this op (direct transfers) or copy target/source
    std::uint64_t user_off;  // file offset of the caller bytes this op covers
    std::size_t user_len;    // caller bytes this op covers
    bool bounce;             // transfer through a ring bounce buffer
    int buffer = -1;
    std::size_t done = 0;    // caller bytes completed
  };

#if MEDFAST_HAVE_IO_URING
  // Runs ops through a ring, keeping up to queue_depth in flight (UringRun).
  void run_uring(std::vector<UringOp>& ops, bool is_write, const os::File& fd) {
    if (ops.empty()) return;
    std::unique_ptr<Ring> ring = take_ring();
    const bool any_bounce = std::any_of(ops.begin(), ops.end(), [](const UringOp& o) { return o.bounce; });
    if (any_bounce) ensure_bounce(*ring);
    UringRun run(*ring, ops, is_write, fd, path, /*fixed=*/&fd == &dfile ? 1 : 0);
    run.run();
    give_ring(std::move(ring));
    if (run.error != 0) {
      throw OsError(str(is_write ? "write" : "read", " at offset ", run.error_offset, " ", is_write ? "to " : "from ",
                        path, " failed (io_uring): ", std::strerror(run.error)),
                    run.error);
    }
  }

  /// One batch of ops through a ring: the queue kept full, completions reaped as
  /// they come, EINTR/EAGAIN completions resubmitted, bounce buffers recycled,
  /// the first error remembered (with its offset) while in-flight ops drain.
  struct UringRun {
    UringRun(Ring& ring, std::vector<UringOp>& o, bool write, const os::File& file, const std::string& p, int fixed)
        : r(ring), ops(o), is_write(write), fd(file), path(p), fixed_index(fixed) {}
    Ring& r;
    std::vector<UringOp>& ops;
    bool is_write;
    const os::File& fd;
    const std::string& path;
    int fixed_index;
    std::vector<int> free_buffers;
    std::size_t next = 0, inflight = 0;
    std::deque<std::size_t> retry;
    int error = 0;
    std::uint64_t error_offset = 0;

    void run() {
      for (int i = static_cast<int>(r.bounce.size()) - 1; i >= 0; --i) free_buffers.push_back(i);
      while (next < ops.size() || inflight > 0 || !retry.empty()) {
        if (fill_queue()) {
          const int s = io_uring_submit(&r.ring);
          if (s < 0 && s != -EINTR && s != -EAGAIN) {
            error = -s;
            error_offset = ops[std::min(next, ops.size() - 1)].file_off;
          }
        }
        if (inflight == 0) {
          if (error != 0 || (next >= ops.size() && retry.empty())) break;
          continue;
        }
        io_uring_cqe* cqe = nullptr;
        const int w = io_uring_wait_cqe(&r.ring, &cqe);
        if (w == -EINTR) continue;
        if (w < 0) {
          error = -w;
          break;
        }
        // Reap everything that is ready.
        unsigned head;
        unsigned seen = 0;
        io_uring_for_each_cqe(&r.ring, head, cqe) {
          ++seen;
          complete(*cqe);
        }
        io_uring_cq_advance(&r.ring, seen);
      }
    }

    /// Submits retries first, then new ops, while the ring has room; true if any went in.
    bool fill_queue() {
      bool submitted = false;
      while (error == 0 && inflight < r.entries) {
        std::size_t i;
        if (!retry.empty()) {
          i = retry.front();
        } else if (next < ops.size()) {
          i = next;
        } else {
          break;
        }
        if (!submit(i)) break;
        if (!retry.empty() && retry.front() == i) retry.pop_front();
        else ++next;
        submitted = true;
      }
      return submitted;
    }

    bool submit(std::size_t i) {
      UringOp& op = ops[i];
      if (op.bounce && op.buffer < 0) {
        if (free_buffers.empty()) return false;
        op.buffer = free_buffers.back();
        free_buffers.pop_back();
        if (is_write) {
          std::memcpy(r.bounce[op.buffer].as<char>() + (op.user_off - op.file_off), op.user, op.user_len);
        }
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
      if (!sqe) return false;
      void* buf = op.bounce ? r.bounce[op.buffer].data() : static_cast<void*>(op.user);
      const auto len = static_cast<unsigned>(op.len);
      const bool fixed = op.bounce && r.registered;
      if (is_write) {
        if (fixed) io_uring_prep_write_fixed(sqe, fd.fd(), buf, len, op.file_off, op.buffer);
        else io_uring_prep_write(sqe, fd.fd(), buf, len, op.file_off);
      } else {
        if (fixed) io_uring_prep_read_fixed(sqe, fd.fd(), buf, len, op.file_off, op.buffer);
        else io_uring_prep_read(sqe, fd.fd(), buf, len, op.file_off);
      }
      if (r.files_registered) {
        sqe->fd = fixed_index;
        sqe->flags |= IOSQE_FIXED_FILE;
      }
      io_uring_sqe_set_data64(sqe, i);
      ++inflight;
      return true;
    }

    void complete(const io_uring_cqe& cqe) {
      --inflight;
      const std::size_t i = static_cast<std::size_t>(io_uring_cqe_get_data64(&cqe));
      UringOp& op = ops[i];
      int res = cqe.res;
      std::size_t got = res > 0 ? static_cast<std::size_t>(res) : 0;
      if (res >= 0) {
        // The OS layer's fault hooks apply to ring transfers as to pread/pwrite.
        if (int herr = os::testing::apply_hook(is_write ? os::Op::write : os::Op::read, path, op.file_off, got)) {
          res = -herr;
        }
      }
      if (res == -EINTR || res == -EAGAIN) {
        retry.push_back(i);
        return;
      }
      if (res < 0) {
        if (error == 0) {
          error = -res;
          error_offset = op.file_off;
        }
      } else if (op.bounce) {
        // Caller bytes that arrived in this transfer.
        const std::uint64_t avail_end = op.file_off + got;
        const std::uint64_t user_end = op.user_off + op.user_len;
        const std::uint64_t stop = std::min(avail_end, user_end);
        if (!is_write && stop > op.user_off) {
          std::memcpy(op.user, r.bounce[op.buffer].as<char>() + (op.user_off - op.file_off),
                      static_cast<std::size_t>(stop - op.user_off));
        }
        op.done = stop > op.user_off ? static_cast<std::size_t>(stop - op.user_off) : 0;
      } else {
        op.done = std::min(got, op.user_len);
      }
      if (op.buffer >= 0) {
        free_buffers.push_back(op.buffer);
        op.buffer = -1;
      }
    }
  };
#else
  void run_uring(std::vector<UringOp>&, bool, const os::File&) {
    throw Error(str(path, ": io_uring: ", probe().io_uring_detail));  // unreachable: select_backend refuses first
  }
#endif

  // Builds the ops of a request: direct transfers where caller memory and
  // offsets allow, bounce buffers elsewhere; buffered I/O needs no alignment.
  std::vector<UringOp> plan(char* user, std::size_t n, std::uint64_t off, bool use_direct) {
    std::vector<UringOp> ops;
    const std::uint64_t end = off + n;
    if (!use_direct) {
      for (std::uint64_t pos = off; pos < end;) {
        const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(B(), end - pos));
        ops.push_back({pos, len, user + (pos - off), pos, len, false});
        pos += len;
      }
      return ops;
    }
    const bool compatible = ((reinterpret_cast<std::uintptr_t>(user) - off) & (A() - 1)) == 0;
    std::uint64_t pos = off;
    while (pos < end) {
      const std::uint64_t a = align_down(pos, A());
      if (compatible && pos == a && end - pos >= A()) {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_down(end - pos, A())));
        ops.push_back({pos, len, user + (pos - off), pos, len, false});
        pos += len;
      } else {
        const std::size_t len = static_cast<std::size_t>(std::min(B(), align_up(end - a, A())));
        const std::uint64_t stop = std::min<std::uint64_t>(end, a + len);
        ops.push_back({a, len, user + (pos - off), pos, static_cast<std::size_t>(stop - pos), true});
        pos = stop;
      }
    }
    return ops;
  }

  // ---- public operations ----

  std::size_t read(void* dst, std::size_t n, std::uint64_t off) {
    if (n == 0) return 0;
    char* out = static_cast<char*>(dst);
    switch (backend) {
      case Backend::posix:
      case Backend::cufile:  // host buffers under the cufile backend use the posix path
        return run_pieces(shared_pool(opt.threads), off, n, B(),
                          [&](std::uint64_t o, std::size_t l) { return file.read_at(out + (o - off), l, o); });
      case Backend::odirect:
        if (!direct) {
          return run_pieces(shared_pool(opt.threads), off, n, B(),
                            [&](std::uint64_t o, std::size_t l) { return file.read_at(out + (o - off), l, o); });
        }
        return run_pieces(shared_pool(opt.threads), off, n, B(),
                          [&](std::uint64_t o, std::size_t l) { return read_direct_range(out + (o - off), l, o); });
      case Backend::io_uring: {
        const std::uint64_t size = file.size();
        if (off >= size) return 0;
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, size - off));
        auto ops = plan(out, want, off, direct);
        run_uring(ops, false, direct ? dfile : file);
        // Short transfers (not at end of file) are finished synchronously.
        std::size_t total = 0;
        for (auto& op : ops) {
          if (op.done < op.user_len) {
            const std::uint64_t from = op.user_off + op.done;
            const std::size_t rest = op.user_len - op.done;
            char* at = op.user + op.done;
            op.done += direct ? read_direct_range(at, rest, from) : file.read_at(at, rest, from);
          }
          total += op.done;
          if (op.done < op.user_len) break;  // end of file
        }
        return total;
      }
    }
    return 0;
  }

  void write(const void* src, std::size_t n, std::uint64_t off) {
    if (n == 0) return;
    const char* in = static_cast<const char*>(src);
    const bool use_direct = direct && (backend == Backend::odirect || backend == Backend::io_uring);
    const std::uint64_t size_before = use_direct ? dfile.size() : 0;
    switch (backend) {
      case Backend::posix:
      case Backend::cufile:
        run_pieces(shared_pool(opt.threads), off, n, B(), [&](std::uint64_t o, std::size_t l) {
          file.write_at(in + (o - off), l, o);
          return l;
        });
        break;
      case Backend::odirect:
        run_pieces(shared_pool(opt.threads), off, n, B(), [&](std::uint64_t o, std::size_t l) {
          if (use_direct) write_direct_range(in + (o - off), l, o);
          else file.write_at(in + (o - off), l, o);
          return l;
        });
        break;
      case Backend::io_uring: {
        auto ops = plan(const_cast<char*>(in), n, off, use_direct);
        if (use_direct) {
          // Partial blocks need read-modify-write: do those synchronously.
          std::vector<UringOp> ring_ops;
          for (auto& op : ops) {
            if (op.bounce && (op.user_off != op.file_off || op.user_len != op.len)) {
              write_direct_range(op.user, op.user_len, op.user_off);
              op.done = op.user_len;
            } else {
              ring_ops.push_back(op);
            }
          }
          ops.swap(ring_ops);
        }
        run_uring(ops, true, use_direct ? dfile : file);
        for (auto& op : ops) {
          if (op.done < op.user_len) {
            const std::uint64_t from = op.user_off + op.done;
            if (use_direct) write_direct_range(op.user + op.done, op.user_len - op.done, from);
            else file.write_at(op.user + op.done, op.user_len - op.done, from);
          }
        }
        break;
      }
    }
    if (use_direct) {
      // Padding of a final partial block is cut off again.
      const std::uint64_t want = std::max(size_before, off + n);
      if (dfile.size() > want) dfile.truncate(want);
    }
  }
};

FileHandle::FileHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileHandle::FileHandle(FileHandle&&) noexcept = default;
FileHandle& FileHandle::operator=(FileHandle&&) noexcept = default;
FileHandle::~FileHandle() = default;

FileHandle FileHandle::open(const std::string& path, Mode mode, const IoOptions& options) {
  options.validate();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = options;
  impl->mode = mode;
  impl->backend = select_backend(options);
  const auto fmode = mode == Mode::read ? os::File::Mode::read : os::File::Mode::read_write;
  impl->file = os::File::open(path, fmode);
  if (mode == Mode::write) impl->file.truncate(0);
  if (options.direct && (impl->backend == Backend::odirect || impl->backend == Backend::io_uring)) {
    impl->dfile = impl->open_direct_file();
    impl->direct = impl->dfile.is_open();
  }
  return FileHandle(std::move(impl));
}

Backend FileHandle::backend() const { return impl_->backend; }
const std::string& FileHandle::path() const { return impl_->path; }
const IoOptions& FileHandle::options() const { return impl_->opt; }
bool FileHandle::direct() const { return impl_->direct; }
std::uint64_t FileHandle::size() const { return impl_->file.size(); }

std::size_t FileHandle::read(void* dst, std::size_t size, std::uint64_t offset) {
  return impl_->read(dst, size, offset);
}

void FileHandle::read_exact(void* dst, std::size_t size, std::uint64_t offset) {
  const std::size_t got = read(dst, size, offset);
  if (got != size) {
    throw FormatError(str(impl_->path, ": file is shorter than requested: needed ", size, " bytes at offset ", offset,
                          " but only ", got, " are there (file size ", impl_->file.size(), ")"));
  }
}

void FileHandle::write(const void* src, std::size_t size, std::uint64_t offset) {
  if (impl_->mode == Mode::read) throw Error(str(impl_->path, ": write on a handle opened for reading"));
  impl_->write(src, size, offset);
}

std::future<std::size_t> FileHandle::read_async(void* dst, std::size_t size, std::uint64_t offset) {
  return std::async(std::launch::async, [this, dst, size, offset] { return read(dst, size, offset); });
}

std::future<void> FileHandle::write_async(const void* src, std::size_t size, std::uint64_t offset) {
  return std::async(std::launch::async, [this, src, size, offset] { write(src, size, offset); });
}

void FileHandle::sync() { impl_->file.sync(); }

void* FileHandle::cufile_handle() {
  std::call_once(impl_->cufile_once, [this] {
    const shim::CuFileApi* api = shim::cufile();
    if (!api) return;
    // GPUDirect needs an O_DIRECT descriptor; compatibility mode takes any.
    impl_->cufile_file = impl_->open_direct_file();
    shim::CUfileDescr d{};
    d.type = shim::kCuFileHandleTypeOpaqueFd;
    d.handle.fd = impl_->cufile_file.is_open() ? impl_->cufile_file.fd() : impl_->file.fd();
    shim::CUfileHandle h = nullptr;
    const shim::CUfileError e = api->handle_register(&h, &d);
    if (e.err == 0) {
      impl_->cufile = h;
    } else {
      log::warn("io: cuFile refused ", impl_->path, " (cuFile error ", e.err, "); bouncing through host memory");
    }
  });
  return impl_->cufile;
}

}  // namespace medfast::io
