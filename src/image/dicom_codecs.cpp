// Compressed DICOM pixel data (see dicom_codecs.hpp). Every length and count read from
// a stream is checked against the stream before it is used.
#include "dicom_codecs.hpp"

#if MEDFAST_HAVE_DICOM_CODECS
#include <charls/charls.h>
#include <openjpeg.h>
#endif

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#if MEDFAST_HAVE_DICOM_CODECS
#include <jpeglib.h>
#endif

#include "medfast/core/endian.hpp"
#include "medfast/core/error.hpp"

namespace medfast::dicom::codecs {

namespace {

const char* const kRle = "1.2.840.10008.1.2.5";

bool is_jpeg(const std::string& s) {
  return s == "1.2.840.10008.1.2.4.50" || s == "1.2.840.10008.1.2.4.51" || s == "1.2.840.10008.1.2.4.57" ||
         s == "1.2.840.10008.1.2.4.70";
}
bool is_jpegls(const std::string& s) { return s == "1.2.840.10008.1.2.4.80" || s == "1.2.840.10008.1.2.4.81"; }
bool is_j2k(const std::string& s) { return s == "1.2.840.10008.1.2.4.90" || s == "1.2.840.10008.1.2.4.91"; }

std::string where(const FrameSpec& spec) { return str(spec.file, " (Transfer Syntax UID ", spec.syntax, ")"); }

[[noreturn]] void fail(const FrameSpec& spec, const std::string& what) {
  throw FormatError(str(where(spec), ": ", what));
}

/// A decoded frame's samples before they are written out: stored bit patterns.
struct Samples {
  std::vector<std::uint16_t> values;
  int width = 0, height = 0, precision = 0;
  bool sign_extended = false;  ///< already two's complement in 16 bits (JPEG 2000 signed)
};

/// Checks a decoded frame against the spec and writes it out.
void store(const FrameSpec& spec, const Samples& s, char* out) {
  if (s.width != spec.columns || s.height != spec.rows) {
    fail(spec, str("the compressed frame is ", s.width, " x ", s.height, " pixels, but Columns x Rows is ",
                   spec.columns, " x ", spec.rows));
  }
  if (s.precision < 1 || s.precision > spec.bits_allocated) {
    fail(spec, str("the compressed frame has ", s.precision, "-bit samples, more than Bits Allocated (",
                   spec.bits_allocated, ")"));
  }
  const std::size_t n = static_cast<std::size_t>(s.width) * static_cast<std::size_t>(s.height);
  if (s.values.size() != n) fail(spec, "the decoder returned a short frame");
  // Signed values narrower than Bits Stored are sign-extended from the stream's precision
  // (the reader masks to Bits Stored and sign-extends from there).
  const bool extend = spec.is_signed && !s.sign_extended && s.precision < spec.bits_stored && s.precision < 16;
  const std::uint32_t sign = 1u << (s.precision - 1), mask = (s.precision >= 16) ? 0xffffu : ((1u << s.precision) - 1);
  auto value = [&](std::size_t i) -> std::uint16_t {
    std::uint32_t v = s.values[i];
    if (extend) {
      v &= mask;
      if (v & sign) v |= ~mask;
    }
    return static_cast<std::uint16_t>(v);
  };
  if (spec.bits_allocated == 8) {
    auto* o = reinterpret_cast<unsigned char*>(out);
    for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<unsigned char>(value(i));
  } else {
    auto* o = reinterpret_cast<unsigned char*>(out);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t v = value(i);
      o[2 * i] = static_cast<unsigned char>(v & 0xff);
      o[2 * i + 1] = static_cast<unsigned char>(v >> 8);
    }
  }
}

// ---------------------------------------------------------------------------
// RLE Lossless (PS3.5 Annex G): a 64-byte header (segment count, 15 offsets), then one
// PackBits segment per byte plane, most significant byte first.
// ---------------------------------------------------------------------------

void decode_rle(const FrameSpec& spec, const unsigned char* data, std::size_t size, char* out) {
  if (spec.bits_allocated % 8 != 0) fail(spec, str("RLE with Bits Allocated ", spec.bits_allocated, " is not read"));
  const int planes = spec.bits_allocated / 8;
  if (size < 64) fail(spec, str("the RLE frame has ", size, " bytes, less than its 64-byte header"));
  const std::uint32_t segments = le32(data);
  if (segments != static_cast<std::uint32_t>(planes)) {
    fail(spec, str("the RLE header lists ", segments, " segments, expected ", planes, " for Bits Allocated ",
                   spec.bits_allocated, " and one sample per pixel"));
  }
  const std::size_t pixels = static_cast<std::size_t>(spec.rows) * static_cast<std::size_t>(spec.columns);
  auto* o = reinterpret_cast<unsigned char*>(out);
  for (int s = 0; s < planes; ++s) {
    const std::size_t begin = le32(data + 4 + 4 * s);
    const std::size_t end = s + 1 < planes ? le32(data + 8 + 4 * s) : size;
    if (begin < 64 || begin > end || end > size) {
      fail(spec, str("RLE segment ", s + 1, " lies at bytes ", begin, "-", end, " of a ", size, "-byte frame"));
    }
    // Segment s holds byte (planes - 1 - s) of each little-endian sample.
    unsigned char* dst = o + (planes - 1 - s);
    std::size_t at = begin, got = 0;
    while (got < pixels && at < end) {
      const int header = static_cast<signed char>(data[at++]);
      if (header >= 0) {
        const std::size_t count = static_cast<std::size_t>(header) + 1;
        if (at + count > end || got + count > pixels) break;
        for (std::size_t k = 0; k < count; ++k) dst[(got + k) * planes] = data[at + k];
        at += count;
        got += count;
      } else if (header != -128) {
        const std::size_t count = static_cast<std::size_t>(1 - header);
        if (at >= end || got + count > pixels) break;
        const unsigned char v = data[at++];
        for (std::size_t k = 0; k < count; ++k) dst[(got + k) * planes] = v;
        got += count;
      }
    }
    if (got != pixels) {
      fail(spec, str("RLE segment ", s + 1, " decodes to ", got, " bytes before it ends or overruns, expected ",
                     pixels));
    }
  }
}

// ---------------------------------------------------------------------------
// JPEG: the markers up to the first scan, then lossless (SOF3) decoded here and DCT
// processes (8-bit) by libjpeg-turbo.
// ---------------------------------------------------------------------------

struct Huffman {
  bool defined = false;
  std::array<std::uint8_t, 256> values{};
  std::array<std::int32_t, 18> maxcode{};
  std::array<std::int32_t, 17> valptr{}, mincode{};
  // Codes of up to kLook bits, decoded by one lookup: (length << 8) | value, 0 if longer.
  static constexpr int kLook = 9;
  std::array<std::uint16_t, 1 << kLook> look{};
};

struct JpegHeader {
  enum class Process { none, lossless, dct } process = Process::none;
  int precision = 0, height = 0, width = 0, components = 0, component_id = -1;
  int predictor = 0, point_transform = 0, table = 0;
  std::size_t restart = 0;
  std::size_t scan_start = 0;  ///< first byte of entropy-coded data
  std::array<Huffman, 4> dc;
};

struct Cursor {
  const FrameSpec& spec;
  const unsigned char* p;
  std::size_t n, at = 0;
  std::uint8_t byte() {
    if (at >= n) fail(spec, "the JPEG stream ends inside its header");
    return p[at++];
  }
  std::uint16_t u16() {
    const std::uint16_t hi = byte();
    return static_cast<std::uint16_t>(hi << 8 | byte());
  }
};

void build_huffman(const FrameSpec& spec, const std::array<std::uint8_t, 17>& bits, const std::uint8_t* vals,
                   int count, Huffman& h) {
  h = Huffman{};
  std::copy(vals, vals + count, h.values.begin());
  std::int32_t code = 0;
  int k = 0;
  for (int l = 1; l <= 16; ++l) {
    h.valptr[l] = k;
    h.mincode[l] = code;
    for (int i = 0; i < bits[l]; ++i, ++k, ++code) {
      if (code >= (1 << l)) fail(spec, "a JPEG Huffman table has more codes than fit their lengths");
      if (l <= Huffman::kLook) {
        const int shift = Huffman::kLook - l;
        for (int fill = 0; fill < (1 << shift); ++fill) {
          h.look[static_cast<std::size_t>((code << shift) | fill)] = static_cast<std::uint16_t>(l << 8 | vals[k]);
        }
      }
    }
    h.maxcode[l] = bits[l] ? code - 1 : -1;
    code <<= 1;
  }
  h.maxcode[17] = 0x7fffffff;
  h.defined = true;
}

void read_dht(Cursor& c, std::size_t end, JpegHeader& jh) {
  while (c.at < end) {
    const std::uint8_t tc_th = c.byte();
    const int tc = tc_th >> 4, th = tc_th & 15;
    if (tc > 1 || th > 3) fail(c.spec, str("a JPEG Huffman table has class ", tc, " and slot ", th));
    std::array<std::uint8_t, 17> bits{};
    int count = 0;
    for (int l = 1; l <= 16; ++l) count += bits[l] = c.byte();
    if (count > 256 || c.at + static_cast<std::size_t>(count) > end) {
      fail(c.spec, str("a JPEG Huffman table lists ", count, " codes, more than its segment holds"));
    }
    if (tc == 0) build_huffman(c.spec, bits, c.p + c.at, count, jh.dc[th]);
    c.at += count;
  }
}

/// Reads markers from SOI to the first SOS.
JpegHeader read_jpeg_header(const FrameSpec& spec, const unsigned char* p, std::size_t n) {
  Cursor c{spec, p, n};
  JpegHeader jh;
  if (n < 2 || p[0] != 0xff || p[1] != 0xd8) fail(spec, "the frame does not start with a JPEG SOI marker");
  c.at = 2;
  for (;;) {
    if (c.byte() != 0xff) fail(spec, str("a JPEG marker was expected at byte ", c.at - 1));
    std::uint8_t m = c.byte();
    while (m == 0xff) m = c.byte();  // fill bytes
    if (m == 0xd9) fail(spec, "the JPEG stream ends (EOI) before its first scan");
    if (m == 0x01 || (m >= 0xd0 && m <= 0xd7)) continue;  // markers without a segment
    const std::size_t length = c.u16();
    if (length < 2 || c.at + length - 2 > n) fail(spec, str("a JPEG marker segment (0xFF", int(m), ") overruns the frame"));
    const std::size_t end = c.at + length - 2;
    if (m == 0xc3 || m == 0xc0 || m == 0xc1 || m == 0xc2 || m == 0xc9 || m == 0xca) {
      if (jh.process != JpegHeader::Process::none) fail(spec, "the JPEG stream has two frame headers");
      jh.process = m == 0xc3 ? JpegHeader::Process::lossless : JpegHeader::Process::dct;
      jh.precision = c.byte();
      jh.height = c.u16();
      jh.width = c.u16();
      jh.components = c.byte();
      if (jh.components >= 1) jh.component_id = c.byte();
      if (jh.process == JpegHeader::Process::dct) return jh;  // libjpeg reads the rest
    } else if ((m >= 0xc5 && m <= 0xc7) || (m >= 0xcb && m <= 0xcf && m != 0xcc)) {
      fail(spec, str("JPEG process 0xFF", int(m), " (hierarchical or arithmetic lossless) is not read"));
    } else if (m == 0xcc) {
      fail(spec, "arithmetic-coded lossless JPEG is not read");
    } else if (m == 0xc4) {
      read_dht(c, end, jh);
    } else if (m == 0xdd) {
      if (length != 4) fail(spec, "a JPEG DRI segment is not 4 bytes long");
      jh.restart = c.u16();
    } else if (m == 0xda) {
      if (jh.process == JpegHeader::Process::none) fail(spec, "a JPEG scan comes before its frame header");
      const int ns = c.byte();
      if (ns != 1) fail(spec, str("a JPEG lossless scan has ", ns, " components, expected 1"));
      const int cs = c.byte(), tables = c.byte();
      if (cs != jh.component_id) fail(spec, "the JPEG scan names a component the frame does not have");
      jh.table = tables >> 4;
      jh.predictor = c.byte();
      c.byte();  // Se
      jh.point_transform = c.byte() & 15;
      jh.scan_start = end;
      return jh;
    }
    c.at = end;
  }
}

/// Bits of entropy-coded data: 0xFF00 is a data 0xFF; any other marker ends the data
/// (zeros are supplied past it, and counted, so a truncated stream is an error).
class BitReader {
 public:
  BitReader(const unsigned char* p, std::size_t n, std::size_t at) : p_(p), n_(n), at_(at) {}

  int peek(int k) {
    if (bits_ < k) fill();
    return static_cast<int>((acc_ >> (bits_ - k)) & ((std::uint64_t(1) << k) - 1));
  }
  void skip(int k) {
    bits_ -= k;
    used_ += k;
  }
  int get(int k) {
    if (k == 0) return 0;
    const int v = peek(k);
    skip(k);
    return v;
  }
  /// Whether more bits were taken than the data held.
  bool overran() const { return used_ > real_; }
  /// At a restart interval's end: drops the buffered bits and reads RSTm.
  bool restart(int m) {
    bits_ = 0;
    acc_ = 0;
    used_ = real_ = 0;
    marker_ = false;
    if (at_ + 1 < n_ && p_[at_] == 0xff && p_[at_ + 1] == 0xd0 + (m & 7)) {
      at_ += 2;
      return true;
    }
    return false;
  }

 private:
  void fill() {
    while (bits_ <= 56) {
      std::uint64_t b = 0;
      if (!marker_ && at_ < n_) {
        if (p_[at_] == 0xff) {
          if (at_ + 1 < n_ && p_[at_ + 1] == 0x00) {
            b = 0xff;
            at_ += 2;
            real_ += 8;
          } else {
            marker_ = true;  // stays at the marker
          }
        } else {
          b = p_[at_++];
          real_ += 8;
        }
      }
      acc_ = (acc_ << 8) | b;
      bits_ += 8;
    }
  }

  const unsigned char* p_;
  std::size_t n_, at_;
  std::uint64_t acc_ = 0;
  int bits_ = 0;
  bool marker_ = false;
  std::uint64_t used_ = 0, real_ = 0;
};

int decode_category(const FrameSpec& spec, BitReader& br, const Huffman& h) {
  const int look = br.peek(Huffman::kLook);
  const std::uint16_t e = h.look[static_cast<std::size_t>(look)];
  if (e) {
    br.skip(e >> 8);
    return e & 0xff;
  }
  int l = 1;
  std::int32_t code = br.get(1);
  while (code > h.maxcode[l]) {
    code = (code << 1) | br.get(1);
    if (++l > 16) fail(spec, "the JPEG data holds a code its Huffman table does not have");
  }
  const std::int32_t index = h.valptr[l] + code - h.mincode[l];
  if (code < h.mincode[l] || index < 0 || index > 255) fail(spec, "the JPEG data holds a code its Huffman table does not have");
  return h.values[static_cast<std::size_t>(index)];
}

Samples decode_jpeg_lossless(const FrameSpec& spec, const JpegHeader& jh, const unsigned char* p, std::size_t n) {
  if (jh.components != 1) fail(spec, str("the JPEG frame has ", jh.components, " components, expected 1"));
  if (jh.precision < 2 || jh.precision > 16) fail(spec, str("the JPEG frame has precision ", jh.precision));
  if (jh.width <= 0 || jh.height <= 0) fail(spec, "the JPEG frame has no width or height (DNL is not read)");
  if (jh.width != spec.columns || jh.height != spec.rows) {
    fail(spec, str("the compressed frame is ", jh.width, " x ", jh.height, " pixels, but Columns x Rows is ",
                   spec.columns, " x ", spec.rows));
  }
  if (jh.predictor < 1 || jh.predictor > 7) fail(spec, str("the JPEG lossless predictor is ", jh.predictor));
  if (jh.point_transform >= jh.precision) fail(spec, "the JPEG point transform is not below the precision");
  if (jh.table > 3 || !jh.dc[static_cast<std::size_t>(jh.table)].defined) {
    fail(spec, "the JPEG scan uses a Huffman table the stream does not define");
  }
  const std::size_t width = static_cast<std::size_t>(jh.width), height = static_cast<std::size_t>(jh.height);
  if (jh.restart % width != 0) {
    fail(spec, str("a JPEG lossless restart interval of ", jh.restart, " samples is not whole lines of ", width));
  }
  const Huffman& h = jh.dc[static_cast<std::size_t>(jh.table)];
  Samples s;
  s.width = jh.width;
  s.height = jh.height;
  s.precision = jh.precision;
  s.values.resize(width * height);
  const int pt = jh.point_transform, reduced = jh.precision - pt;
  const int initial = 1 << (reduced - 1);
  const std::uint32_t mask = (reduced >= 16) ? 0xffffu : ((1u << reduced) - 1);
  std::vector<std::uint16_t> prev(width), cur(width);
  BitReader br(p, n, jh.scan_start);
  const std::size_t lines_per_interval = jh.restart ? jh.restart / width : height;
  int rst = 0;
  for (std::size_t y = 0; y < height; ++y) {
    const bool interval_start = y % lines_per_interval == 0;
    if (interval_start && y > 0) {
      if (br.overran()) fail(spec, "the JPEG data ends before its restart interval does");
      if (!br.restart(rst++)) fail(spec, str("the JPEG restart marker before line ", y, " is missing"));
    }
    for (std::size_t x = 0; x < width; ++x) {
      const int t = decode_category(spec, br, h);
      if (t > 16) fail(spec, str("the JPEG data holds a difference category of ", t));
      int diff = 0;
      if (t == 16) {
        diff = 32768;
      } else if (t > 0) {
        diff = br.get(t);
        if (diff < (1 << (t - 1))) diff -= (1 << t) - 1;
      }
      int pred;
      if (interval_start) {
        pred = x == 0 ? initial : cur[x - 1];
      } else if (x == 0) {
        pred = prev[0];
      } else {
        const int ra = cur[x - 1], rb = prev[x], rc = prev[x - 1];
        switch (jh.predictor) {
          case 1: pred = ra; break;
          case 2: pred = rb; break;
          case 3: pred = rc; break;
          case 4: pred = ra + rb - rc; break;
          case 5: pred = ra + ((rb - rc) >> 1); break;
          case 6: pred = rb + ((ra - rc) >> 1); break;
          default: pred = (ra + rb) >> 1; break;
        }
      }
      cur[x] = static_cast<std::uint16_t>(static_cast<std::uint32_t>(pred + diff) & mask);
    }
    for (std::size_t x = 0; x < width; ++x) s.values[y * width + x] = static_cast<std::uint16_t>(cur[x] << pt);
    std::swap(prev, cur);
  }
  if (br.overran()) fail(spec, "the JPEG data ends before the frame does (truncated stream)");
  return s;
}

#if MEDFAST_HAVE_DICOM_CODECS
// libjpeg-turbo, for the DCT processes. Its errors longjmp back here; its warnings
// (corrupt data it would paper over with zeros) are errors too.
struct JpegError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int warnings;
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_emit(j_common_ptr cinfo, int level) {
  if (level < 0) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    if (e->warnings++ == 0) (*cinfo->err->format_message)(cinfo, e->message);
  }
}

/// Decodes into s (allocated by the caller to width*height); returns "" or libjpeg's message.
/// Plain data only between setjmp and longjmp.
bool run_libjpeg(const unsigned char* p, std::size_t n, JpegError& err, jpeg_decompress_struct& cinfo, int rows,
                 int columns, std::uint16_t* out, unsigned char* line) {
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit;
  err.warnings = 0;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, p, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.num_components != 1 || static_cast<int>(cinfo.image_width) != columns ||
      static_cast<int>(cinfo.image_height) != rows || cinfo.data_precision != 8) {
    std::snprintf(err.message, sizeof err.message, "the JPEG frame is %u x %u pixels, %d component(s) of %d bits",
                  cinfo.image_width, cinfo.image_height, cinfo.num_components, cinfo.data_precision);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = JCS_GRAYSCALE;
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = line;
    const int y = static_cast<int>(cinfo.output_scanline);
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) break;
    for (int x = 0; x < columns; ++x) out[static_cast<std::size_t>(y) * columns + x] = line[x];
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return err.warnings == 0;
}

Samples decode_jpeg_dct(const FrameSpec& spec, const JpegHeader& jh, const unsigned char* p, std::size_t n) {
  if (jh.precision != 8) {
    fail(spec, str("lossy JPEG with ", jh.precision, "-bit samples is not read (8-bit lossy and lossless JPEG are)"));
  }
  if (jh.width != spec.columns || jh.height != spec.rows || jh.components != 1) {
    fail(spec, str("the compressed frame is ", jh.width, " x ", jh.height, " pixels with ", jh.components,
                   " component(s), but Columns x Rows is ", spec.columns, " x ", spec.rows, " with one sample"));
  }
  Samples s;
  s.width = jh.width;
  s.height = jh.height;
  s.precision = 8;
  s.values.resize(static_cast<std::size_t>(s.width) * static_cast<std::size_t>(s.height));
  std::vector<unsigned char> line(static_cast<std::size_t>(s.width));
  auto err = std::make_unique<JpegError>();
  auto cinfo = std::make_unique<jpeg_decompress_struct>();
  if (!run_libjpeg(p, n, *err, *cinfo, spec.rows, spec.columns, s.values.data(), line.data())) {
    fail(spec, str("libjpeg could not decode the frame: ", err->message[0] ? err->message : "damaged data"));
  }
  return s;
}
#else
std::string built_without(const char* codec) {
  return str(codec, " is not in this build: medfast was built without the DICOM codecs (cmake "
             "-DMEDFAST_WITH_DICOM_CODECS=ON, with libcharls-dev, libopenjp2-7-dev and libjpeg-dev installed)");
}
Samples decode_jpeg_dct(const FrameSpec& spec, const JpegHeader&, const unsigned char*, std::size_t) {
  fail(spec, built_without("Lossy JPEG (libjpeg-turbo)"));
}
#endif

Samples decode_jpeg(const FrameSpec& spec, const unsigned char* p, std::size_t n) {
  const JpegHeader jh = read_jpeg_header(spec, p, n);
  return jh.process == JpegHeader::Process::lossless ? decode_jpeg_lossless(spec, jh, p, n)
                                                     : decode_jpeg_dct(spec, jh, p, n);
}

#if MEDFAST_HAVE_DICOM_CODECS
// ---------------------------------------------------------------------------
// JPEG-LS: CharLS.
// ---------------------------------------------------------------------------

Samples decode_jpegls(const FrameSpec& spec, const unsigned char* p, std::size_t n) {
  std::unique_ptr<charls_jpegls_decoder, void (*)(const charls_jpegls_decoder*)> dec(
      charls_jpegls_decoder_create(), charls_jpegls_decoder_destroy);
  if (!dec) throw std::bad_alloc();
  auto check = [&](charls_jpegls_errc e) {
    if (e != charls_jpegls_errc::success) fail(spec, str("CharLS could not decode the frame: ", charls_get_error_message(e)));
  };
  check(charls_jpegls_decoder_set_source_buffer(dec.get(), p, n));
  check(charls_jpegls_decoder_read_header(dec.get()));
  charls_frame_info info{};
  check(charls_jpegls_decoder_get_frame_info(dec.get(), &info));
  if (info.component_count != 1) fail(spec, str("the JPEG-LS frame has ", info.component_count, " components, expected 1"));
  if (info.width != static_cast<std::uint32_t>(spec.columns) || info.height != static_cast<std::uint32_t>(spec.rows)) {
    fail(spec, str("the compressed frame is ", info.width, " x ", info.height, " pixels, but Columns x Rows is ",
                   spec.columns, " x ", spec.rows));
  }
  if (info.bits_per_sample < 2 || info.bits_per_sample > 16) fail(spec, str("the JPEG-LS frame has ", info.bits_per_sample, "-bit samples"));
  const std::size_t pixels = static_cast<std::size_t>(info.width) * info.height;
  const std::size_t bytes = info.bits_per_sample > 8 ? 2 : 1;
  std::size_t need = 0;
  check(charls_jpegls_decoder_get_destination_size(dec.get(), 0, &need));
  if (need != pixels * bytes) fail(spec, str("CharLS would write ", need, " bytes, expected ", pixels * bytes));
  std::vector<unsigned char> raw(need);
  check(charls_jpegls_decoder_decode_to_buffer(dec.get(), raw.data(), raw.size(), 0));
  Samples s;
  s.width = static_cast<int>(info.width);
  s.height = static_cast<int>(info.height);
  s.precision = info.bits_per_sample;
  s.values.resize(pixels);
  for (std::size_t i = 0; i < pixels; ++i) {
    s.values[i] = bytes == 1 ? raw[i] : static_cast<std::uint16_t>(raw[2 * i] | raw[2 * i + 1] << 8);
  }
  return s;
}

// ---------------------------------------------------------------------------
// JPEG 2000: OpenJPEG, reading from memory.
// ---------------------------------------------------------------------------

struct MemoryStream {
  const unsigned char* p;
  std::size_t n, at;
};

OPJ_SIZE_T opj_read(void* buffer, OPJ_SIZE_T k, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (m->at >= m->n) return static_cast<OPJ_SIZE_T>(-1);
  const std::size_t take = std::min<std::size_t>(k, m->n - m->at);
  std::memcpy(buffer, m->p + m->at, take);
  m->at += take;
  return take;
}
OPJ_OFF_T opj_skip(OPJ_OFF_T k, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (k < 0) {
    if (static_cast<std::size_t>(-k) > m->at) return -1;
    m->at -= static_cast<std::size_t>(-k);
    return k;
  }
  const std::size_t take = std::min<std::size_t>(static_cast<std::size_t>(k), m->n - std::min(m->at, m->n));
  m->at += take;
  return static_cast<OPJ_OFF_T>(take);
}
OPJ_BOOL opj_seek(OPJ_OFF_T k, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (k < 0 || static_cast<std::size_t>(k) > m->n) return OPJ_FALSE;
  m->at = static_cast<std::size_t>(k);
  return OPJ_TRUE;
}
void opj_message(const char* msg, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->empty() && msg) {
    *out = msg;
    while (!out->empty() && (out->back() == '\n' || out->back() == ' ')) out->pop_back();
  }
}
void opj_quiet(const char*, void*) {}

Samples decode_j2k(const FrameSpec& spec, const unsigned char* p, std::size_t n) {
  static const unsigned char jp2_signature[] = {0, 0, 0, 12, 'j', 'P', ' ', ' '};
  const bool jp2 = n >= 8 && std::memcmp(p, jp2_signature, 8) == 0;
  if (!jp2 && !(n >= 2 && p[0] == 0xff && p[1] == 0x4f)) {
    fail(spec, "the frame is neither a JPEG 2000 codestream (SOC marker) nor a JP2 file");
  }
  MemoryStream ms{p, n, 0};
  std::unique_ptr<opj_stream_t, void (*)(opj_stream_t*)> stream(opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE),
                                                                opj_stream_destroy);
  std::unique_ptr<opj_codec_t, void (*)(opj_codec_t*)> codec(opj_create_decompress(jp2 ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K),
                                                             opj_destroy_codec);
  if (!stream || !codec) throw std::bad_alloc();
  opj_stream_set_user_data(stream.get(), &ms, nullptr);
  opj_stream_set_user_data_length(stream.get(), n);
  opj_stream_set_read_function(stream.get(), opj_read);
  opj_stream_set_skip_function(stream.get(), opj_skip);
  opj_stream_set_seek_function(stream.get(), opj_seek);
  std::string message;
  opj_set_error_handler(codec.get(), opj_message, &message);
  opj_set_warning_handler(codec.get(), opj_quiet, nullptr);
  opj_set_info_handler(codec.get(), opj_quiet, nullptr);
  opj_dparameters_t params;
  opj_set_default_decoder_parameters(&params);
  auto failed = [&](const char* step) {
    fail(spec, str("OpenJPEG could not ", step, " the frame", message.empty() ? "" : ": ", message));
  };
  if (!opj_setup_decoder(codec.get(), &params)) failed("set up a decoder for");
  opj_image_t* raw = nullptr;
  if (!opj_read_header(stream.get(), codec.get(), &raw)) failed("read the header of");
  std::unique_ptr<opj_image_t, void (*)(opj_image_t*)> image(raw, opj_image_destroy);
  if (image->numcomps != 1) fail(spec, str("the JPEG 2000 frame has ", image->numcomps, " components, expected 1"));
  const std::int64_t w = static_cast<std::int64_t>(image->x1) - image->x0, h = static_cast<std::int64_t>(image->y1) - image->y0;
  if (w != spec.columns || h != spec.rows) {
    fail(spec, str("the compressed frame is ", w, " x ", h, " pixels, but Columns x Rows is ", spec.columns, " x ",
                   spec.rows));
  }
  if (image->comps[0].prec < 1 || image->comps[0].prec > 16) {
    fail(spec, str("the JPEG 2000 frame has ", image->comps[0].prec, "-bit samples"));
  }
  if (!opj_decode(codec.get(), stream.get(), image.get())) failed("decode");
  if (!opj_end_decompress(codec.get(), stream.get())) failed("finish decoding");
  const opj_image_comp_t& c = image->comps[0];
  if (!c.data || c.w != static_cast<OPJ_UINT32>(spec.columns) || c.h != static_cast<OPJ_UINT32>(spec.rows) ||
      c.dx != 1 || c.dy != 1) {
    fail(spec, "the decoded JPEG 2000 component does not cover the frame");
  }
  Samples s;
  s.width = spec.columns;
  s.height = spec.rows;
  s.precision = static_cast<int>(c.prec);
  s.sign_extended = c.sgnd != 0;
  const std::size_t pixels = static_cast<std::size_t>(c.w) * c.h;
  s.values.resize(pixels);
  for (std::size_t i = 0; i < pixels; ++i) s.values[i] = static_cast<std::uint16_t>(c.data[i]);
  return s;
}
#else
Samples decode_jpegls(const FrameSpec& spec, const unsigned char*, std::size_t) { fail(spec, built_without("JPEG-LS (CharLS)")); }
Samples decode_j2k(const FrameSpec& spec, const unsigned char*, std::size_t) { fail(spec, built_without("JPEG 2000 (OpenJPEG)")); }
#endif

}  // namespace

bool decodes(const std::string& syntax) {
  return syntax == kRle || is_jpeg(syntax) || is_jpegls(syntax) || is_j2k(syntax);
}

std::vector<std::vector<Fragment>> split_frames(const std::vector<Fragment>& fragments, int frames,
                                                const FrameSpec& spec) {
  if (fragments.size() < 2) fail(spec, "the encapsulated Pixel Data holds no fragment");
  if (frames < 1) fail(spec, str("Number of Frames is ", frames));
  const std::size_t count = fragments.size() - 1, nf = static_cast<std::size_t>(frames);
  std::vector<std::vector<Fragment>> out(nf);
  if (nf == 1) {
    out[0].assign(fragments.begin() + 1, fragments.end());
    return out;
  }
  if (count == nf) {
    for (std::size_t i = 0; i < nf; ++i) out[i].push_back(fragments[i + 1]);
    return out;
  }
  if (spec.syntax == kRle) {
    fail(spec, str("the RLE Pixel Data holds ", count, " fragments for ", frames, " frames (one each is expected)"));
  }
  std::vector<std::size_t> starts;  // index into fragments of each frame's first fragment
  const Fragment& bot = fragments[0];
  if (bot.second > 0) {
    if (bot.second != 4 * nf) {
      fail(spec, str("the Basic Offset Table has ", bot.second / 4, " entries for ", frames, " frames"));
    }
    std::size_t pos = 0, k = 1;
    for (std::size_t i = 0; i < nf; ++i) {
      const std::size_t offset = le32(bot.first + 4 * i);
      while (k <= count && pos < offset) pos += 8 + fragments[k++].second;
      if (pos != offset || k > count) {
        fail(spec, str("Basic Offset Table entry ", i + 1, " (", offset, ") does not point at a fragment"));
      }
      if (!starts.empty() && k == starts.back()) fail(spec, "the Basic Offset Table lists a fragment twice");
      starts.push_back(k);
    }
  } else {
    for (std::size_t k = 1; k <= count; ++k) {
      const unsigned char* p = fragments[k].first;
      const std::size_t n = fragments[k].second;
      const bool jpeg = n >= 2 && p[0] == 0xff && p[1] == 0xd8;
      const bool j2k = n >= 2 && p[0] == 0xff && p[1] == 0x4f;
      const bool jp2 = n >= 8 && p[0] == 0 && p[1] == 0 && p[2] == 0 && p[3] == 12 && p[4] == 'j';
      if (jpeg || j2k || jp2) starts.push_back(k);
    }
    if (starts.size() != nf || starts[0] != 1) {
      fail(spec, str("the Pixel Data holds ", count, " fragments with ", starts.size(), " frame starts for ", frames,
                     " frames, and no Basic Offset Table"));
    }
  }
  for (std::size_t i = 0; i < nf; ++i) {
    const std::size_t end = i + 1 < nf ? starts[i + 1] : count + 1;
    out[i].assign(fragments.begin() + static_cast<std::ptrdiff_t>(starts[i]),
                  fragments.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

void decode_frame(const FrameSpec& spec, const std::vector<Fragment>& frame, char* out) {
  if (spec.rows <= 0 || spec.columns <= 0) fail(spec, "Rows or Columns is missing");
  if (frame.empty()) fail(spec, "a frame has no fragment");
  // One contiguous stream: the fragment itself, or the fragments joined.
  std::vector<unsigned char> joined;
  const unsigned char* p = frame[0].first;
  std::size_t n = frame[0].second;
  if (frame.size() > 1) {
    for (const Fragment& f : frame) joined.insert(joined.end(), f.first, f.first + f.second);
    p = joined.data();
    n = joined.size();
  }
  if (spec.syntax == kRle) {
    decode_rle(spec, p, n, out);
    return;
  }
  if (spec.bits_allocated != 8 && spec.bits_allocated != 16) {
    fail(spec, str("compressed pixel data with Bits Allocated ", spec.bits_allocated, " is not read (8 or 16 are)"));
  }
  if (is_jpeg(spec.syntax)) {
    store(spec, decode_jpeg(spec, p, n), out);
  } else if (is_jpegls(spec.syntax)) {
    store(spec, decode_jpegls(spec, p, n), out);
  } else if (is_j2k(spec.syntax)) {
    store(spec, decode_j2k(spec, p, n), out);
  } else {
    fail(spec, "this transfer syntax is not decoded");
  }
}

}  // namespace medfast::dicom::codecs
