#include "medfast/image/gzip.hpp"

#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "medfast/core/error.hpp"
#include "medfast/core/parallel.hpp"

namespace medfast {

namespace {

struct DecompressorDeleter {
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};
struct CompressorDeleter {
  void operator()(libdeflate_compressor* c) const { libdeflate_free_compressor(c); }
};

libdeflate_decompressor* thread_decompressor() {
  thread_local std::unique_ptr<libdeflate_decompressor, DecompressorDeleter> d(libdeflate_alloc_decompressor());
  if (!d) throw Error("libdeflate: cannot allocate a decompressor (out of memory)");
  return d.get();
}

bool all_zero(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

constexpr std::size_t kFirstChunk = 64u << 10;
constexpr std::size_t kChunk = 4u << 20;

}  // namespace

bool is_gzip(const void* data, std::size_t size) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  return size >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

// ---------------------------------------------------------------------------
// Streaming reader (zlib)
// ---------------------------------------------------------------------------

struct GzipReader::State {
  z_stream zs{};
  bool initialised = false;
  const os::File* file = nullptr;
  std::string name;
  std::vector<std::uint8_t> buffer;
  std::uint64_t file_offset = 0;     // next file offset to read (file mode)
  std::uint64_t input_total = 0;     // compressed bytes made available so far
  bool input_eof = false;
  bool member_done = false;
  bool finished = false;
  std::uint64_t produced = 0;

  std::uint64_t consumed() const { return input_total - zs.avail_in; }

  void refill() {
    if (input_eof || file == nullptr) {
      input_eof = true;
      return;
    }
    const std::size_t want = file_offset == 0 ? kFirstChunk : kChunk;
    buffer.resize(want);
    const std::size_t got = file->read_at(buffer.data(), want, file_offset);
    file_offset += got;
    input_total += got;
    zs.next_in = buffer.data();
    zs.avail_in = static_cast<uInt>(got);
    if (got < want) input_eof = true;
  }

  [[noreturn]] void truncated() const {
    throw FormatError(str(name, ": gzip stream is truncated: the compressed data ends after ", consumed(),
                          " bytes, in the middle of a member, having produced ", produced, " bytes"));
  }
};

GzipReader::GzipReader(const os::File& file) : state_(std::make_unique<State>()) {
  state_->file = &file;
  state_->name = file.path();
  if (inflateInit2(&state_->zs, 16 + MAX_WBITS) != Z_OK) throw Error("zlib: inflateInit2 failed (out of memory)");
  state_->initialised = true;
}

GzipReader::GzipReader(const void* data, std::size_t size, std::string name) : state_(std::make_unique<State>()) {
  state_->name = std::move(name);
  state_->zs.next_in = static_cast<Bytef*>(const_cast<void*>(data));
  // zlib counts in uInt; memory inputs are fed in 1 GiB steps by read().
  state_->input_total = size;
  state_->input_eof = true;
  if (inflateInit2(&state_->zs, 16 + MAX_WBITS) != Z_OK) throw Error("zlib: inflateInit2 failed (out of memory)");
  state_->initialised = true;
  // Memory mode: hand zlib the span in pieces it can count.
  state_->buffer.clear();
  state_->zs.avail_in = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
  state_->input_total = state_->zs.avail_in;
  state_->file_offset = size;  // total span, for the remainder bookkeeping below
}

GzipReader::~GzipReader() {
  if (state_ && state_->initialised) inflateEnd(&state_->zs);
}

std::uint64_t GzipReader::position() const { return state_->produced; }

std::size_t GzipReader::read(void* out, std::size_t size) { return inflate_some(out, size, false); }

void GzipReader::finish_member() {
  State& s = *state_;
  if (s.finished || s.member_done || (s.produced == 0 && s.consumed() == 0)) return;
  // The rest of the member is decompressed and dropped: zlib checks the trailer's
  // CRC-32 and ISIZE when it reaches the member's end.
  std::vector<std::uint8_t> scratch(kFirstChunk);
  while (!s.member_done && !s.finished) inflate_some(scratch.data(), scratch.size(), true);
}

std::size_t GzipReader::inflate_some(void* out, std::size_t size, bool stop_at_member_end) {
  State& s = *state_;
  auto* dst = static_cast<std::uint8_t*>(out);
  std::size_t done = 0;
  while (done < size && !s.finished && !(stop_at_member_end && s.member_done)) {
    if (s.zs.avail_in == 0) {
      if (s.file == nullptr) {
        // Memory mode: expose the next piece of the span, if any.
        const std::uint64_t remaining = s.file_offset - s.input_total;
        if (remaining > 0) {
          const auto piece = static_cast<uInt>(std::min<std::uint64_t>(remaining, 1u << 30));
          s.zs.avail_in = piece;  // next_in already points past the consumed bytes
          s.input_total += piece;
        }
      } else {
        s.refill();
      }
    }
    if (s.member_done) {
      if (s.zs.avail_in == 0) {
        s.finished = true;  // clean end after the last member
        break;
      }
      if (s.zs.next_in[0] == 0) {
        // Zero padding after the last member is allowed (as in gzip(1) and Python).
        const bool zeros = all_zero(s.zs.next_in, s.zs.avail_in);
        s.zs.next_in += s.zs.avail_in;
        s.zs.avail_in = 0;
        if (!zeros) {
          throw FormatError(str(s.name, ": unexpected bytes after a gzip member at compressed offset ", s.consumed()));
        }
        continue;
      }
      if (s.zs.avail_in >= 2 && !is_gzip(s.zs.next_in, s.zs.avail_in)) {
        throw FormatError(str(s.name, ": unexpected bytes after a gzip member at compressed offset ", s.consumed(),
                              " (not the gzip magic 1f 8b)"));
      }
      inflateReset(&s.zs);
      s.member_done = false;
    }
    if (s.zs.avail_in == 0 && s.input_eof && s.file == nullptr && s.input_total >= s.file_offset) s.truncated();
    if (s.zs.avail_in == 0 && s.input_eof && s.file != nullptr) s.truncated();
    const std::size_t want = std::min<std::size_t>(size - done, 1u << 30);
    s.zs.next_out = dst + done;
    s.zs.avail_out = static_cast<uInt>(want);
    const int ret = inflate(&s.zs, Z_NO_FLUSH);
    const std::size_t got = want - s.zs.avail_out;
    done += got;
    s.produced += got;
    if (ret == Z_STREAM_END) {
      s.member_done = true;
    } else if (ret == Z_OK) {
      continue;
    } else if (ret == Z_BUF_ERROR) {
      if (s.zs.avail_in == 0) continue;  // needs more input: next loop refills or reports truncation
      throw FormatError(str(s.name, ": gzip stream makes no progress at compressed offset ", s.consumed()));
    } else if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT) {
      // zlib's "incorrect data check" / "incorrect length check" are the trailer's CRC-32 / ISIZE.
      throw FormatError(str(s.name, ": corrupt gzip data at compressed offset ", s.consumed(), ": ",
                            s.zs.msg ? s.zs.msg : "invalid deflate stream",
                            " (the file is damaged: gzip -t reports the same)"));
    } else {
      throw Error(str(s.name, ": zlib inflate failed with code ", ret));
    }
  }
  return done;
}

// ---------------------------------------------------------------------------
// Whole-buffer path (libdeflate)
// ---------------------------------------------------------------------------

std::size_t gunzip_into(const void* in, std::size_t in_size, void* out, std::size_t out_size,
                        const std::string& name) {
  const auto* src = static_cast<const std::uint8_t*>(in);
  auto* dst = static_cast<std::uint8_t*>(out);
  std::size_t in_pos = 0, out_pos = 0;
  libdeflate_decompressor* d = thread_decompressor();
  while (out_pos < out_size && in_pos < in_size) {
    if (!is_gzip(src + in_pos, in_size - in_pos)) {
      if (in_pos > 0 && all_zero(src + in_pos, in_size - in_pos)) break;
      throw FormatError(str(name, ": ", in_pos == 0 ? "not gzip data" : "unexpected bytes after a gzip member",
                            " at compressed offset ", in_pos, " (expected the gzip magic 1f 8b)"));
    }
    std::size_t in_used = 0, out_used = 0;
    const auto r = libdeflate_gzip_decompress_ex(d, src + in_pos, in_size - in_pos, dst + out_pos,
                                                 out_size - out_pos, &in_used, &out_used);
    if (r == LIBDEFLATE_SUCCESS) {
      in_pos += in_used;
      out_pos += out_used;
      continue;
    }
    // The member holds more than is wanted, or is damaged: zlib streams the
    // rest, stops where we need it to, and names the offset of any damage.
    GzipReader stream(src + in_pos, in_size - in_pos, name);
    const std::size_t got = stream.read(dst + out_pos, out_size - out_pos);
    out_pos += got;
    // Stopping early must not skip the member's CRC-32 and ISIZE: bytes flipped
    // in a deflate stream often still inflate, into other values.
    stream.finish_member();
    if (r != LIBDEFLATE_INSUFFICIENT_SPACE && out_pos < out_size) {
      throw FormatError(str(name, ": corrupt gzip data in the member at compressed offset ", in_pos));
    }
    if (r != LIBDEFLATE_INSUFFICIENT_SPACE) {
      // libdeflate refused the member and zlib found nothing wrong in it: trust neither.
      throw FormatError(str(name, ": corrupt gzip data in the member at compressed offset ", in_pos,
                            " (libdeflate: ", r == LIBDEFLATE_BAD_DATA ? "bad data or checksum" : "short output", ")"));
    }
    break;
  }
  return out_pos;
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

std::vector<std::uint8_t> gzip_compress(const void* data, std::size_t size, int level) {
  if (level < 0 || level > 12) throw ValueError(str("gzip level ", level, " is outside 0..12"));
  std::unique_ptr<libdeflate_compressor, CompressorDeleter> c(libdeflate_alloc_compressor(level));
  if (!c) throw Error("libdeflate: cannot allocate a compressor (out of memory)");
  std::vector<std::uint8_t> out(libdeflate_gzip_compress_bound(c.get(), size));
  const std::size_t n = libdeflate_gzip_compress(c.get(), data, size, out.data(), out.size());
  if (n == 0) throw Error(str("libdeflate: compression of ", size, " bytes failed"));
  out.resize(n);
  return out;
}

void gzip_write(os::AtomicWriter& writer, const std::vector<GzipPart>& parts, int level, int threads) {
  struct Member {
    const std::uint8_t* data;
    std::size_t size;
  };
  std::vector<Member> members;
  for (const auto& p : parts) {
    const auto* b = static_cast<const std::uint8_t*>(p.data);
    if (p.size == 0) continue;
    for (std::size_t off = 0; off < p.size; off += kGzipMemberBytes) {
      members.push_back({b + off, std::min(kGzipMemberBytes, p.size - off)});
    }
  }
  if (members.empty()) {
    const auto empty = gzip_compress(nullptr, 0, level);
    writer.append(empty.data(), empty.size());
    return;
  }
  // Compress a window of members in parallel, then append them in order, so
  // that memory stays bounded by the window, not the volume.
  const std::size_t window = static_cast<std::size_t>(std::max(1, threads));
  for (std::size_t first = 0; first < members.size(); first += window) {
    const std::size_t count = std::min(window, members.size() - first);
    std::vector<std::vector<std::uint8_t>> out(count);
    parallel_for(count, threads, [&](std::size_t i) {
      out[i] = gzip_compress(members[first + i].data, members[first + i].size, level);
    });
    for (const auto& o : out) writer.append(o.data(), o.size());
  }
}

}  // namespace medfast
