// The io_uring backend: a request is cut into block-sized operations kept in flight on
// a ring (queue_depth deep), with O_DIRECT where the options ask for it: caller memory
// where it is aligned, registered bounce buffers elsewhere. Rings are pooled per open file
// (one per request in flight). Partial blocks of a direct write and short transfers are
// finished synchronously through the odirect ranges (backend_odirect.cpp).
#include "file_backend.hpp"

#if MEDFAST_HAVE_IO_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/os/memory.hpp"
#include "medfast/os/process.hpp"

namespace medfast::io::detail {

#if MEDFAST_HAVE_IO_URING

bool io_uring_available(std::string& why) {
  io_uring ring;
  const int e = io_uring_queue_init(4, &ring, 0);
  if (e != 0) {
    why = str("io_uring_queue_init: ", std::strerror(-e));
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

namespace {

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

constexpr int kMaxBounce = 16;

class IoUringBackend final : public FileBackend {
 public:
  explicit IoUringBackend(OpenFile& f) : f_(f) { f_.open_direct(); }

  std::size_t read(const Memory& dst, std::uint64_t off) override {
    char* out = dst.bytes();
    const std::size_t n = dst.size;
    const std::uint64_t size = f_.file.size();
    if (off >= size) return 0;
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, size - off));
    auto ops = plan(out, want, off, f_.direct);
    run_uring(ops, false, f_.direct ? f_.dfile : f_.file);
    // Short transfers (not at end of file) are finished synchronously.
    std::size_t total = 0;
    for (auto& op : ops) {
      if (op.done < op.user_len) {
        const std::uint64_t from = op.user_off + op.done;
        const std::size_t rest = op.user_len - op.done;
        char* at = op.user + op.done;
        op.done += f_.direct ? read_direct_range(f_, at, rest, from) : f_.file.read_at(at, rest, from);
      }
      total += op.done;
      if (op.done < op.user_len) break;  // end of file
    }
    return total;
  }

  void write(const Memory& src, std::uint64_t off) override {
    const char* in = src.bytes();
    const std::size_t n = src.size;
    const bool use_direct = f_.direct;
    auto ops = plan(const_cast<char*>(in), n, off, use_direct);
    if (use_direct) {
      // Partial blocks need read-modify-write: do those synchronously.
      std::vector<UringOp> ring_ops;
      for (auto& op : ops) {
        if (op.bounce && (op.user_off != op.file_off || op.user_len != op.len)) {
          write_direct_range(f_, op.user, op.user_len, op.user_off);
          op.done = op.user_len;
        } else {
          ring_ops.push_back(op);
        }
      }
      ops.swap(ring_ops);
    }
    run_uring(ops, true, use_direct ? f_.dfile : f_.file);
    for (auto& op : ops) {
      if (op.done < op.user_len) {
        const std::uint64_t from = op.user_off + op.done;
        if (use_direct) write_direct_range(f_, op.user + op.done, op.user_len - op.done, from);
        else f_.file.write_at(op.user + op.done, op.user_len - op.done, from);
      }
    }
  }

 private:
  /// A forked child (a torch DataLoader worker) must not touch the pool: its rings' queues
  /// are mapped shared with the parent, which goes on submitting to them, and the pool's
  /// lock may have been held by a parent thread that did not fork. The child uses rings
  /// of its own, one per call.
  bool forked() const { return os::process_id() != owner_; }

  std::unique_ptr<Ring> take_ring() {
    if (!forked()) {
      std::lock_guard<std::mutex> lock(ring_mutex);
      if (!rings.empty()) {
        auto r = std::move(rings.back());
        rings.pop_back();
        return r;
      }
    }
    auto r = std::make_unique<Ring>();
    r->entries = static_cast<unsigned>(std::min(f_.opt.queue_depth, 4096));
    const int e = io_uring_queue_init(r->entries, &r->ring, 0);
    if (e < 0) throw OsError(str("io_uring_queue_init(", r->entries, ") for ", f_.path, ": ", std::strerror(-e)), -e);
    // Registered descriptors spare the kernel a file lookup per request.
    const int fds[2] = {f_.file.fd(), f_.direct ? f_.dfile.fd() : f_.file.fd()};
    r->files_registered = io_uring_register_files(&r->ring, fds, 2) == 0;
    return r;
  }

  void give_ring(std::unique_ptr<Ring> r) {
    if (forked()) return;  // the child's own ring: closed here
    std::lock_guard<std::mutex> lock(ring_mutex);
    rings.push_back(std::move(r));
  }

  void ensure_bounce(Ring& r) {
    if (!r.bounce.empty()) return;
    const int n = std::min(f_.opt.queue_depth, kMaxBounce);
    for (int i = 0; i < n; ++i) {
      r.bounce.push_back(os::Buffer::allocate(static_cast<std::size_t>(f_.B())));
      r.iov.push_back({r.bounce.back().data(), static_cast<std::size_t>(f_.B())});
    }
    // Registered buffers skip the per-request page pinning; a kernel that
    // refuses (RLIMIT_MEMLOCK) still works with plain reads.
    r.registered = io_uring_register_buffers(&r.ring, r.iov.data(), static_cast<unsigned>(r.iov.size())) == 0;
  }


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


  // Runs ops through a ring, keeping up to queue_depth in flight (UringRun).
  void run_uring(std::vector<UringOp>& ops, bool is_write, const os::File& fd) {
    if (ops.empty()) return;
    std::unique_ptr<Ring> ring = take_ring();
    const bool any_bounce = std::any_of(ops.begin(), ops.end(), [](const UringOp& o) { return o.bounce; });
    if (any_bounce) ensure_bounce(*ring);
    UringRun run(*ring, ops, is_write, fd, f_.path, /*fixed=*/&fd == &f_.dfile ? 1 : 0);
    run.run();
    if (run.inflight == 0) {
      give_ring(std::move(ring));
    } else {
      // Completions that never came: the kernel may still use this ring and its
      // buffers, so it is neither reused nor unmapped (kept for the process's life).
      (void)ring.release();
    }
    if (run.error != 0) {
      throw OsError(str(is_write ? "write" : "read", " at offset ", run.error_offset, " ", is_write ? "to " : "from ",
                        f_.path, " failed (io_uring): ", std::strerror(run.error)),
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
    int wait_failures = 0;

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
          // Requests still in flight write into the caller's memory: keep reaping them
          // (no new ones go in once `error` is set); give up only after many failures.
          if (error == 0) {
            error = -w;
            error_offset = ops[std::min(next, ops.size() - 1)].file_off;
          }
          if (++wait_failures > 1000) break;
          continue;
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

  // Builds the ops of a request: direct transfers where caller memory and
  // offsets allow, bounce buffers elsewhere; buffered I/O needs no alignment.
  std::vector<UringOp> plan(char* user, std::size_t n, std::uint64_t off, bool use_direct) {
    std::vector<UringOp> ops;
    const std::uint64_t end = off + n;
    if (!use_direct) {
      for (std::uint64_t pos = off; pos < end;) {
        const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(f_.B(), end - pos));
        ops.push_back({pos, len, user + (pos - off), pos, len, false});
        pos += len;
      }
      return ops;
    }
    const bool compatible = ((reinterpret_cast<std::uintptr_t>(user) - off) & (f_.A() - 1)) == 0;
    std::uint64_t pos = off;
    while (pos < end) {
      const std::uint64_t a = align_down(pos, f_.A());
      if (compatible && pos == a && end - pos >= f_.A()) {
        const std::size_t len = static_cast<std::size_t>(std::min(f_.B(), align_down(end - pos, f_.A())));
        ops.push_back({pos, len, user + (pos - off), pos, len, false});
        pos += len;
      } else {
        const std::size_t len = static_cast<std::size_t>(std::min(f_.B(), align_up(end - a, f_.A())));
        const std::uint64_t stop = std::min<std::uint64_t>(end, a + len);
        ops.push_back({a, len, user + (pos - off), pos, static_cast<std::size_t>(stop - pos), true});
        pos = stop;
      }
    }
    return ops;
  }


  OpenFile& f_;
  const pid_t owner_ = os::process_id();  // the process whose rings the pool holds
  std::mutex ring_mutex;
  std::vector<std::unique_ptr<Ring>> rings;
};

}  // namespace

std::unique_ptr<FileBackend> make_io_uring_backend(OpenFile& file) { return std::make_unique<IoUringBackend>(file); }

#else  // built without liburing: the backend is never selected (probe() says why)

bool io_uring_available(std::string& why) {
  why = "this medfast was built without liburing (cmake -DMEDFAST_WITH_IO_URING=ON needs liburing-dev)";
  return false;
}

std::unique_ptr<FileBackend> make_io_uring_backend(OpenFile& file) {
  std::string why;
  io_uring_available(why);
  throw Error(str(file.path, ": io_uring: ", why));  // unreachable: select_backend refuses first
}

#endif

}  // namespace medfast::io::detail
