// The odirect backend: O_DIRECT transfers cut into aligned pieces on the engine's
// workers. Pieces whose caller memory is aligned go straight to the kernel; heads, tails
// and misaligned buffers go through per-thread bounce blocks; partial blocks of a write
// are read, patched and rewritten, and the file is cut back to its true size after.
// The io_uring backend uses the same ranges for what its ring does not take.
#include "file_backend.hpp"

#include <cerrno>
#include <cstring>

#include "medfast/core/error.hpp"

namespace medfast::io::detail {

namespace {

// Writes a whole aligned block region from an aligned buffer, retrying the
// region if a short write leaves an unaligned remainder.
void write_aligned_region(OpenFile& f, const char* buf, std::size_t len, std::uint64_t a) {
  std::size_t done = 0;
  int retries = 0;
  while (done < len) {
    const std::size_t w = f.dfile.write_once(buf + done, len - done, a + done);
    if (w == 0 || ++retries > 1000) {
      throw OsError(str("write of ", len, " bytes at offset ", a, " to ", f.path, " makes no progress"), EIO);
    }
    done += w;
    if (done % f.A() != 0) done = align_down(done, f.A());  // redo the partial block from an aligned start
  }
}

}  // namespace

// Reads [off, off+n) through dfile at any offset/length/address.
std::size_t read_direct_range(const OpenFile& f, char* out, std::size_t n, std::uint64_t off) {
  const std::uint64_t end = off + n;
  std::uint64_t pos = off;
  int stalls = 0;
  while (pos < end) {
    const std::uint64_t a = align_down(pos, f.A());
    char* here = out + (pos - off);
    if (pos == a && is_aligned(here, f.A()) && end - pos >= f.A()) {
      const std::size_t len = static_cast<std::size_t>(std::min(f.B(), align_down(end - pos, f.A())));
      const std::size_t got = f.dfile.read_once(here, len, pos);
      if (got == 0) break;
      pos += got;
    } else {
      const std::size_t len = static_cast<std::size_t>(std::min(f.B(), align_up(end - a, f.A())));
      char* bounce = bounce_block(static_cast<std::size_t>(f.B()));
      const std::size_t got = f.dfile.read_once(bounce, len, a);
      if (a + got <= pos) {
        // Nothing new: end of file, or a short read that stopped before pos.
        if (got == 0 || pos >= f.dfile.size()) break;
        if (++stalls > 1000) {
          throw OsError(str("read at offset ", pos, " from ", f.path, " makes no progress"), EIO);
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

// Writes [off, off+n) through dfile; partial blocks are read, patched and
// rewritten. Returns the end of the last block written (may pass off+n).
std::uint64_t write_direct_range(OpenFile& f, const char* in, std::size_t n, std::uint64_t off) {
  const std::uint64_t end = off + n;
  std::uint64_t pos = off, written_end = off;
  while (pos < end) {
    const std::uint64_t a = align_down(pos, f.A());
    const char* here = in + (pos - off);
    if (pos == a && is_aligned(here, f.A()) && end - pos >= f.A()) {
      const std::size_t len = static_cast<std::size_t>(std::min(f.B(), align_down(end - pos, f.A())));
      write_aligned_region(f, here, len, pos);
      pos += len;
      written_end = std::max(written_end, pos);
    } else {
      const std::size_t len = static_cast<std::size_t>(std::min(f.B(), align_up(end - a, f.A())));
      char* bounce = bounce_block(static_cast<std::size_t>(f.B()));
      std::size_t have = 0;
      while (have < len) {  // existing bytes of the region (short at end of file)
        const std::size_t got = f.dfile.read_once(bounce + have, len - have, a + have);
        if (got == 0) break;
        have += got;
        if (have % f.A() != 0 && have < len) {
          // Unaligned short read: the rest comes from the bounce-read f.path.
          have = static_cast<std::size_t>(align_down(have, f.A()));
          const std::size_t rest = read_direct_range(f, bounce + have, len - have, a + have);
          have += rest;
          break;
        }
      }
      std::memset(bounce + have, 0, len - have);
      const std::uint64_t stop = std::min<std::uint64_t>(end, a + len);
      std::memcpy(bounce + (pos - a), here, static_cast<std::size_t>(stop - pos));
      write_aligned_region(f, bounce, len, a);
      written_end = std::max<std::uint64_t>(written_end, a + len);
      pos = stop;
    }
  }
  return written_end;
}

void trim_direct_padding(OpenFile& f, std::uint64_t size_before, std::uint64_t end) {
  // Only a write ending inside a block pads; one ending on a block boundary leaves the
  // size alone (a concurrent write further on may already have made the file longer).
  if (end % f.A() == 0) return;
  const std::uint64_t want = std::max(size_before, end);
  if (f.dfile.size() > want) f.dfile.truncate(want);
}

namespace {

class OdirectBackend final : public FileBackend {
 public:
  explicit OdirectBackend(OpenFile& f) : f_(f) { f_.open_direct(); }

  std::size_t read(char* out, std::size_t n, std::uint64_t off) override {
    if (!f_.direct) {
      return run_pieces(shared_pool(f_.opt.threads), off, n, f_.B(),
                        [&](std::uint64_t o, std::size_t l) { return f_.file.read_at(out + (o - off), l, o); });
    }
    return run_pieces(shared_pool(f_.opt.threads), off, n, f_.B(),
                      [&](std::uint64_t o, std::size_t l) { return read_direct_range(f_, out + (o - off), l, o); });
  }

  void write(const char* in, std::size_t n, std::uint64_t off) override {
    const bool use_direct = f_.direct;
    const std::uint64_t size_before = use_direct ? f_.dfile.size() : 0;
    run_pieces(shared_pool(f_.opt.threads), off, n, f_.B(), [&](std::uint64_t o, std::size_t l) {
      if (use_direct) write_direct_range(f_, in + (o - off), l, o);
      else f_.file.write_at(in + (o - off), l, o);
      return l;
    });
    // Padding of a final partial block is cut off again.
    if (use_direct) trim_direct_padding(f_, size_before, off + n);
  }

 private:
  OpenFile& f_;
};

}  // namespace

std::unique_ptr<FileBackend> make_odirect_backend(OpenFile& file) { return std::make_unique<OdirectBackend>(file); }

}  // namespace medfast::io::detail
