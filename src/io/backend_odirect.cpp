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

// Writes [off, off+n) through dfile; partial blocks are read, patched and rewritten,
// except a last one that would need padding past the end of the file: its bytes go
// through the buffered descriptor, so the file never grows past off+n and there is
// nothing to cut back (cutting back would race with writers extending the file).
// Returns the end of the last byte written.
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
      // Its own scratch: read_direct_range below uses bounce_block for its unaligned reads.
      char* patch = patch_block(static_cast<std::size_t>(f.B()));
      std::size_t have = 0;
      while (have < len) {  // existing bytes of the region (short at end of file)
        const std::size_t got = f.dfile.read_once(patch + have, len - have, a + have);
        if (got == 0) break;
        have += got;
        if (have % f.A() != 0 && have < len) {
          // Unaligned short read: the rest comes from the bounce-read path.
          have = static_cast<std::size_t>(align_down(have, f.A()));
          const std::size_t rest = read_direct_range(f, patch + have, len - have, a + have);
          have += rest;
          break;
        }
      }
      const std::uint64_t stop = std::min<std::uint64_t>(end, a + len);
      if (stop < a + len && have < len) {
        // The end of the file lies in the region and so does the end of the data: a
        // direct write would pad the file past `end`. Written as it is instead.
        f.file.write_at(here, static_cast<std::size_t>(stop - pos), pos);
      } else {
        std::memset(patch + have, 0, len - have);  // a hole before pos reads as zeros
        std::memcpy(patch + (pos - a), here, static_cast<std::size_t>(stop - pos));
        write_aligned_region(f, patch, len, a);
      }
      written_end = std::max<std::uint64_t>(written_end, stop);
      pos = stop;
    }
  }
  return written_end;
}

namespace {

/// O_DIRECT pieces; where the options or the file system rule O_DIRECT out, the posix
/// backend's buffered pieces.
class OdirectBackend final : public FileBackend {
 public:
  explicit OdirectBackend(OpenFile& f) : f_(f), buffered_(make_posix_backend(f)) { f_.open_direct(); }

  std::size_t read(const Memory& dst, std::uint64_t off) override {
    if (!f_.direct) return buffered_->read(dst, off);
    char* out = dst.bytes();
    return run_pieces(shared_pool(f_.opt.workers()), off, dst.size, f_.B(),
                      [&](std::uint64_t o, std::size_t l) { return read_direct_range(f_, out + (o - off), l, o); });
  }

  void write(const Memory& src, std::uint64_t off) override {
    if (!f_.direct) return buffered_->write(src, off);
    const char* in = src.bytes();
    run_pieces(shared_pool(f_.opt.workers()), off, src.size, f_.B(), [&](std::uint64_t o, std::size_t l) {
      write_direct_range(f_, in + (o - off), l, o);
      return l;
    });
  }

 private:
  OpenFile& f_;
  std::unique_ptr<FileBackend> buffered_;
};

}  // namespace

std::unique_ptr<FileBackend> make_odirect_backend(OpenFile& file) { return std::make_unique<OdirectBackend>(file); }

}  // namespace medfast::io::detail
