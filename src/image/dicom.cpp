// DICOM series and SEG reading (see include/medfast/image/dicom.hpp). Files are read
// through medfast's OS layer into memory and parsed by medfast (every length checked
// against the file); native pixel data is used where it lies in the file's bytes,
// compressed pixel data is decoded frame by frame (dicom_codecs.cpp).
//
// This file holds pixel data decoding and the readers (read_series, read_seg, the fuzz
// entry); the parser and one file's header are in dicom_parse.cpp, folder scans and series
// geometry in dicom_series.cpp, SEG placement in dicom_seg.cpp, what they share in
// dicom_dataset.hpp.
#include "medfast/image/dicom.hpp"

#include "dicom_codecs.hpp"
#include "dicom_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <type_traits>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom {

using namespace detail;

namespace {

// ---------------------------------------------------------------------------
// Pixel data.
// ---------------------------------------------------------------------------

std::size_t bytes_for(std::size_t pixels, int bits_allocated) {
  return bits_allocated == 1 ? (pixels + 7) / 8 : pixels * static_cast<std::size_t>(bits_allocated / 8);
}

/// Compressed pixel data, frame by frame (dicom_codecs.cpp), every frame's pixels back to
/// back in native byte order.
std::vector<char> decode_fragments(const Header& h, const Element& pixels, std::size_t expected,
                                   std::size_t max_decoded) {
  codecs::FrameSpec spec;
  spec.file = h.file;
  spec.syntax = h.transfer_syntax;
  spec.rows = h.rows;
  spec.columns = h.columns;
  spec.bits_allocated = h.bits_allocated;
  spec.bits_stored = h.bits_stored > 0 && h.bits_stored <= h.bits_allocated ? h.bits_stored : h.bits_allocated;
  spec.is_signed = h.pixel_representation == 1;
  const auto frames = codecs::split_frames(pixels.fragments, h.frames, spec);
  // A damaged (or hostile) header can claim frames far larger than the data could hold:
  // more than 256 MiB decoded from under a thousandth of that is refused before allocating.
  std::size_t compressed = 0;
  for (const auto& f : pixels.fragments) compressed += f.second;
  if (expected > max_decoded) {
    throw FormatError(str(h.file, ": compressed ", name_of(PixelData), " of ", expected, " bytes decoded is over the ",
                          max_decoded, "-byte limit of this reader"));
  }
  if (expected > (std::size_t(256) << 20) && expected / 1000 > compressed) {
    throw FormatError(str(h.file, ": ", compressed, " bytes of compressed ", name_of(PixelData), " would decode to ",
                          expected, " bytes (", h.rows, " rows x ", h.columns, " columns x ", h.frames,
                          " frame(s)), over 1000 times their size: refused as damaged"));
  }
  const std::size_t frame_bytes = expected / static_cast<std::size_t>(h.frames);
  std::vector<char> decoded(expected);
  for (std::size_t i = 0; i < frames.size(); ++i) codecs::decode_frame(spec, frames[i], decoded.data() + i * frame_bytes);
  return decoded;
}

/// Parses a whole file in memory and calls fn(header, pixel bytes) with every frame's
/// pixels back to back in native byte order (native data in place, compressed decoded).
template <typename Fn>
void with_pixels_unguarded(const char* bytes, std::size_t size, const std::string& file, bool phi, Fn&& fn,
                           std::size_t max_decoded) {
  const Parsed parsed = parse_bytes(bytes, size, file, /*header_only=*/false);
  const Header h = parse_header(parsed, file, phi);
  std::string why;
  const Syntax syntax = classify(h.transfer_syntax, &why);
  if (syntax == Syntax::unsupported) {
    throw FormatError(str(file, ": ", name_of(TransferSyntaxUID), " ", h.transfer_syntax, ": ", why));
  }
  if (h.samples != 1) {
    throw FormatError(str(file, ": ", name_of(SamplesPerPixel), " is ", h.samples,
                          ": only single-channel (grayscale) images are read"));
  }
  if (h.bits_allocated != 1 && h.bits_allocated != 8 && h.bits_allocated != 16 && h.bits_allocated != 32) {
    throw FormatError(str(file, ": ", name_of(BitsAllocated), " is ", h.bits_allocated, ", expected 1, 8, 16 or 32"));
  }
  if (h.rows <= 0 || h.columns <= 0) {
    throw FormatError(str(file, ": ", name_of(Rows), " or ", name_of(Columns), " is missing"));
  }
  const std::size_t pixels = static_cast<std::size_t>(h.rows) * static_cast<std::size_t>(h.columns) *
                             static_cast<std::size_t>(h.frames);
  const std::size_t expected = bytes_for(pixels, h.bits_allocated);
  const Element* pd = parsed.dataset.find(tag_of(PixelData));
  if (!pd) throw FormatError(str(file, ": ", name_of(PixelData), " is missing"));
  if (syntax == Syntax::native) {
    if (pd->encapsulated) {
      throw FormatError(str(file, ": ", name_of(PixelData), " is encapsulated, but ", name_of(TransferSyntaxUID), " ",
                            h.transfer_syntax, " is not compressed"));
    }
    if (pd->length < expected) {
      throw FormatError(str(file, ": ", name_of(PixelData), " holds ", pd->length, " bytes, expected ", expected,
                            " for ", h.rows, " rows x ", h.columns, " columns x ", h.frames, " frame(s) of ",
                            h.bits_allocated, " bits"));
    }
    fn(h, reinterpret_cast<const char*>(pd->value));
    return;
  }
  if (!pd->encapsulated) {
    throw FormatError(str(file, ": ", name_of(TransferSyntaxUID), " ", h.transfer_syntax, " is compressed, but ",
                          name_of(PixelData), " is not encapsulated"));
  }
  if (h.bits_allocated == 1) {
    throw FormatError(str(file, ": compressed 1-bit ", name_of(PixelData), " is not read"));
  }
  const std::vector<char> decoded = decode_fragments(h, *pd, expected, max_decoded);
  fn(h, decoded.data());
}

template <typename Fn>
void with_pixels(const char* bytes, std::size_t size, const std::string& file, bool phi, Fn&& fn,
                 std::size_t max_decoded = std::numeric_limits<std::size_t>::max()) {
  guarded(file, [&] { with_pixels_unguarded(bytes, size, file, phi, fn, max_decoded); });
}

/// A file's bytes in a per-thread buffer that is reused (not zeroed, not returned to the
/// kernel) from file to file: a series is hundreds of equal-sized files.
struct FileBytes {
  std::unique_ptr<char[]> data;
  std::size_t size = 0, capacity = 0;
  void read(const std::string& path) {
    const os::File f = os::File::open(path, os::File::Mode::read);
    const std::uint64_t n = f.size();
    if (n > (std::uint64_t(1) << 40)) throw FormatError(str(path, ": ", n, " bytes is not a DICOM file"));
    if (n > capacity) {
      data.reset(new char[n]);
      capacity = n;
    }
    size = static_cast<std::size_t>(n);
    if (size) f.read_exact(data.get(), size, 0);
  }
};

struct Range {
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
};

/// Copies one frame of stored values into `out` (same type), masking to BitsStored with
/// sign extension, and returns the range of the stored values.
template <typename T>
Range copy_frame(const char* src, T* out, std::size_t n, int bits_stored, bool is_signed) {
  std::memcpy(out, src, n * sizeof(T));
  Range r;
  const int bits = static_cast<int>(sizeof(T) * 8);
  if (bits_stored > 0 && bits_stored < bits) {
    using U = std::make_unsigned_t<T>;
    const U mask = static_cast<U>((U(1) << bits_stored) - 1), sign = static_cast<U>(U(1) << (bits_stored - 1));
    for (std::size_t i = 0; i < n; ++i) {
      U v = static_cast<U>(static_cast<U>(out[i]) & mask);
      if (is_signed && (v & sign)) v = static_cast<U>(v | static_cast<U>(~mask));
      out[i] = static_cast<T>(v);
    }
  }
  T lo = n ? out[0] : T(0), hi = lo;
  for (std::size_t i = 0; i < n; ++i) {
    lo = out[i] < lo ? out[i] : lo;
    hi = out[i] > hi ? out[i] : hi;
  }
  r.min = static_cast<double>(lo);
  r.max = static_cast<double>(hi);
  return r;
}

/// The common case, fused: int16 stored values, all 16 bits used, whole slope and
/// intercept. The slice's range is found in the source, then (when the rescaled values fit)
/// it is written rescaled in one pass while in cache; returns whether it was.
bool copy_rescaled_int16(const char* src, std::int16_t* out, std::size_t n, double slope, double intercept,
                         Range& range) {
  std::int16_t lo = 0, hi = 0;
  if (n) {
    std::memcpy(&lo, src, 2);
    hi = lo;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::int16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  range.min = lo;
  range.max = hi;
  const double a = lo * slope + intercept, b = hi * slope + intercept;
  if (std::min(a, b) < -32768 || std::max(a, b) > 32767) {
    std::memcpy(out, src, n * 2);
    return false;
  }
  const int s = static_cast<int>(slope), c = static_cast<int>(intercept);
  for (std::size_t i = 0; i < n; ++i) {
    std::int16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    out[i] = static_cast<std::int16_t>(v * s + c);
  }
  return true;
}

template <typename T, typename Out>
void rescale(const T* in, Out* out, std::size_t n, double slope, double intercept) {
  if (slope == 1.0) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Out>(static_cast<double>(in[i]) + intercept);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Out>(static_cast<double>(in[i]) * slope + intercept);
  }
}

bool whole(double v) { return std::floor(v) == v; }

/// Decodes the slices of a checked series into stored values, then applies the rescale.
template <typename T>
Image decode_series(const std::shared_ptr<const Series>& series, const ReadOptions& options) {
  const Series& s = *series;
  const std::size_t frame = static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(s.columns);
  const std::size_t n = frame * s.slices.size();
  if (n * 4 > options.max_volume_bytes) {
    throw FormatError(str(s.files.front(), ": series ", s.series_uid, " is ", s.columns, " x ", s.rows, " x ",
                          s.slices.size(), " voxels, over max_volume_bytes (", options.max_volume_bytes, " bytes)"));
  }
  // Where each (file, frame) goes.
  std::map<std::string, std::vector<std::int64_t>> slot;
  for (std::size_t z = 0; z < s.slices.size(); ++z) {
    auto& v = slot[s.slices[z].file];
    const auto f = static_cast<std::size_t>(s.slices[z].frame);
    if (v.size() <= f) v.resize(f + 1, -1);
    v[f] = static_cast<std::int64_t>(z);
  }
  std::vector<std::string> files;
  for (const auto& [file, z] : slot) files.push_back(file);
  os::Buffer stage = os::Buffer::allocate(n * sizeof(T));
  std::vector<Range> ranges(s.slices.size());
  // Slices already rescaled in place (the int16 fast path): their values are final HU.
  std::vector<char> done(s.slices.size(), 0);
  constexpr bool kInt16 = std::is_same<T, std::int16_t>::value;
  parallel_for(files.size(), options.threads, [&](std::size_t i) {
    const std::string& file = files[i];
    thread_local FileBytes bytes;
    bytes.read(file);
    with_pixels(bytes.data.get(), bytes.size, file, false, [&](const Header& h, const char* pixels) {
      if (h.rows != s.rows || h.columns != s.columns || h.bits_allocated != s.bits_allocated) {
        throw FormatError(str(file, ": ", name_of(Rows), " x ", name_of(Columns), " x ", name_of(BitsAllocated), " is ",
                              h.rows, " x ", h.columns, " x ", h.bits_allocated, ", the series has ", s.rows, " x ",
                              s.columns, " x ", s.bits_allocated));
      }
      const auto& zs = slot.at(file);
      for (std::size_t f = 0; f < zs.size(); ++f) {
        if (zs[f] < 0) continue;
        if (static_cast<int>(f) >= h.frames) {
          throw FormatError(str(file, ": frame ", f + 1, " is past ", name_of(NumberOfFrames), " ", h.frames));
        }
        const auto z = static_cast<std::size_t>(zs[f]);
        const Slice& sl = s.slices[z];
        const char* src = pixels + f * frame * sizeof(T);
        if (kInt16 && (h.bits_stored <= 0 || h.bits_stored == 16) && whole(sl.slope) && whole(sl.intercept) &&
            std::fabs(sl.slope) <= 65536 && std::fabs(sl.intercept) <= 65536) {
          done[z] = copy_rescaled_int16(src, reinterpret_cast<std::int16_t*>(stage.as<T>() + z * frame), frame,
                                        sl.slope, sl.intercept, ranges[z]);
        } else {
          ranges[z] = copy_frame<T>(src, stage.as<T>() + z * frame, frame, h.bits_stored, h.pixel_representation == 1);
        }
      }
    });
  });
  bool integral = true;
  for (std::size_t z = 0; z < s.slices.size() && integral; ++z) {
    const Slice& sl = s.slices[z];
    if (done[z]) continue;
    if (!whole(sl.slope) || !whole(sl.intercept)) integral = false;
    const double a = ranges[z].min * sl.slope + sl.intercept, b = ranges[z].max * sl.slope + sl.intercept;
    if (std::min(a, b) < -32768 || std::max(a, b) > 32767) integral = false;
  }
  Image image;
  image.shape = {s.columns, s.rows, static_cast<std::int64_t>(s.slices.size())};
  image.affine = s.affine();
  image.series = series;
  if (integral) {
    image.dtype = "int16";
    os::Buffer out = sizeof(T) == 2 ? std::move(stage) : os::Buffer::allocate(n * 2);
    const T* in = sizeof(T) == 2 ? out.as<T>() : stage.as<T>();
    parallel_for(s.slices.size(), options.threads, [&](std::size_t z) {
      const Slice& sl = s.slices[z];
      if (done[z]) return;
      if (sizeof(T) == 2 && std::is_signed<T>::value && sl.slope == 1 && sl.intercept == 0) return;
      rescale(in + z * frame, out.as<std::int16_t>() + z * frame, frame, sl.slope, sl.intercept);
    });
    image.storage = std::move(out);
  } else {
    image.dtype = "float32";
    os::Buffer out = os::Buffer::allocate(n * 4);
    parallel_for(s.slices.size(), options.threads, [&](std::size_t z) {
      const Slice& sl = s.slices[z];
      if (done[z]) {  // already HU (exact in int16): only widened
        rescale(stage.as<T>() + z * frame, out.as<float>() + z * frame, frame, 1.0, 0.0);
      } else {
        rescale(stage.as<T>() + z * frame, out.as<float>() + z * frame, frame, sl.slope, sl.intercept);
      }
    });
    image.storage = std::move(out);
  }
  return image;
}

/// Before anything is allocated: every file's pixel data against what its header announces
/// (a header may claim 65535 x 65535 pixels, or 100000 frames, over a few KB of data); the
/// same checks with_pixels makes once a file is read whole.
void check_pixel_data(const Series& s) {
  if (s.bits_allocated != 8 && s.bits_allocated != 16 && s.bits_allocated != 32) return;  // refused by read_series
  std::string why;
  const Syntax syntax = classify(s.transfer_syntax, &why);
  std::map<std::string, std::uint64_t> frames;
  for (const Slice& sl : s.slices) ++frames[sl.file];
  for (std::size_t i = 0; i < s.files.size() && i < s.pixel_bytes.size(); ++i) {
    const std::uint64_t have = s.pixel_bytes[i];
    if (have == kUnknownPixelBytes) continue;
    const std::uint64_t f = frames[s.files[i]];
    // At most 65535 x 65535 x 10^6 frames x 4 bytes: within 64 bits.
    const std::uint64_t expected = static_cast<std::uint64_t>(s.rows) * static_cast<std::uint64_t>(s.columns) * f *
                                   static_cast<std::uint64_t>(s.bits_allocated / 8);
    if (syntax == Syntax::native && have < expected) {
      throw FormatError(str(s.files[i], ": ", name_of(PixelData), " holds ", have, " bytes, expected ", expected, " for ",
                            s.rows, " rows x ", s.columns, " columns x ", f, " frame(s) of ", s.bits_allocated, " bits"));
    }
    if (syntax == Syntax::compressed && expected > (std::uint64_t(256) << 20) && expected / 1000 > have) {
      throw FormatError(str(s.files[i], ": ", have, " bytes of compressed ", name_of(PixelData), " would decode to ",
                            expected, " bytes (", s.rows, " rows x ", s.columns, " columns x ", f,
                            " frame(s)), over 1000 times their size: refused as damaged"));
    }
  }
}

const Series& pick(const Scan& sc, const std::string& path, const std::string& series_uid) {
  std::vector<const Series*> images;
  for (const Series& s : sc.series) {
    if (!s.is_seg) images.push_back(&s);
  }
  if (images.empty()) throw FormatError(str(path, ": holds only DICOM SEG objects, no image series"));
  if (!series_uid.empty()) {
    std::string known;
    for (const Series* s : images) {
      if (s->series_uid == series_uid) return *s;
      known += (known.empty() ? "" : ", ") + s->series_uid;
    }
    throw FormatError(str(path, ": no series with ", name_of(SeriesInstanceUID), " ", series_uid, " (series_uid); it holds ",
                          known));
  }
  if (images.size() > 1) {
    log::info("dicom: ", path, " holds ", images.size(), " series; reading ", images.front()->series_uid, " (",
              images.front()->slices.size(), " slices, the most); set series_uid to read another");
  }
  return *images.front();
}

}  // namespace

Image read_series(const std::string& path, const ReadOptions& options) {
  const Scan sc = scan(path, ReadOptions(options).set_phi(false));
  auto series = std::make_shared<Series>(pick(sc, path, options.series_uid));
  if (series->multi_frame && series->files.size() > 1) {
    log::info("dicom: ", path, ": series ", series->series_uid, " has ", series->files.size(),
              " multi-frame files; their frames are stacked as one volume");
  }
  check_pixel_data(*series);  // before the geometry: 100000 frames over one frame's data are no geometry problem
  check_geometry(*series, path);
  std::string why;
  if (classify(series->transfer_syntax, &why) == Syntax::unsupported) {
    throw FormatError(str(series->files.front(), ": ", name_of(TransferSyntaxUID), " ", series->transfer_syntax, ": ",
                          why));
  }
  const bool is_signed = series->pixel_representation == 1;
  switch (series->bits_allocated) {
    case 8: return is_signed ? decode_series<std::int8_t>(series, options) : decode_series<std::uint8_t>(series, options);
    case 16:
      return is_signed ? decode_series<std::int16_t>(series, options) : decode_series<std::uint16_t>(series, options);
    case 32:
      return is_signed ? decode_series<std::int32_t>(series, options) : decode_series<std::uint32_t>(series, options);
    default:
      throw FormatError(str(series->files.front(), ": ", name_of(BitsAllocated), " is ", series->bits_allocated,
                            ", expected 8, 16 or 32 for an image"));
  }
}

// ---------------------------------------------------------------------------
// SEG pixels (placed on the reference grid by dicom_seg.cpp), and the fuzz target.
// ---------------------------------------------------------------------------

Image read_seg(const std::string& file, const Series& reference, const LabelDict& labels, const ReadOptions&) {
  const std::vector<char> bytes = read_bytes(file);
  Image image;
  // An RT Structure Set has no pixels: its contours are rasterised.
  const bool rtstruct = guarded(file, [&] {
    const Parsed parsed = parse_bytes(bytes.data(), bytes.size(), file, /*header_only=*/false);
    const Header h = parse_header(parsed, file, false);
    if (h.is_rtstruct) image = place_rtstruct(parsed, h, reference, labels);
    return h.is_rtstruct;
  });
  if (!rtstruct) {
    with_pixels(bytes.data(), bytes.size(), file, false, [&](const Header& h, const char* pixels) {
      image = place_seg(h, pixels, reference, labels);
    });
  }
  image.series = std::make_shared<Series>(reference);
  return image;
}

void parse_for_fuzzing(const void* data, std::size_t size) {
  try {
    const Parsed parsed = parse_bytes(static_cast<const char*>(data), size, "fuzz.dcm", false);
    const Header h = parse_header(parsed, "fuzz.dcm", true);
    if (h.is_rtstruct) {  // contours onto a small made-up axial grid
      Series grid;
      grid.series_uid = h.referenced_series.empty() ? "" : h.referenced_series.front();
      grid.rows = grid.columns = 64;
      grid.orientation = {1, 0, 0, 0, 1, 0};
      grid.pixel_spacing = {1, 1};
      grid.slice_spacing = 2;
      for (int z = 0; z < 16; ++z) {
        Slice sl;
        sl.position = {0, 0, 2.0 * z};
        sl.along_normal = 2.0 * z;
        grid.slices.push_back(sl);
      }
      (void)place_rtstruct(parsed, h, grid, {{"GTV-1", 1}, {"Lung", 2}});
      return;
    }
  } catch (const Error&) {
    return;
  } catch (const std::exception&) {
    return;  // what guarded() turns into a FormatError elsewhere
  }
  try {
    with_pixels(static_cast<const char*>(data), size, "fuzz.dcm", true, [&](const Header& h, const char* pixels) {
      if (static_cast<std::size_t>(h.rows) * static_cast<std::size_t>(h.columns) * static_cast<std::size_t>(h.frames) >
          (64u << 20)) {
        return;
      }
      Series s = series_of({&h}, true);
      s.is_seg = false;
      try {
        check_geometry(s, "fuzz.dcm");
      } catch (const Error&) {
        return;
      }
      (void)s.affine();
      if (h.is_seg) {
        (void)place_seg(h, pixels, s, {{"GTV-1", 1}, {"Lung", 2}});
      } else if (h.bits_allocated == 16) {
        const std::size_t frame = static_cast<std::size_t>(h.rows) * static_cast<std::size_t>(h.columns);
        std::vector<std::int16_t> out(frame);
        for (int f = 0; f < h.frames; ++f) {
          (void)copy_frame<std::int16_t>(pixels + static_cast<std::size_t>(f) * frame * 2, out.data(), frame,
                                         h.bits_stored, h.pixel_representation == 1);
        }
      }
    }, /*max_decoded=*/std::size_t(16) << 20);  // every decoder runs; no input takes seconds
  } catch (const Error&) {
    // Clear errors are the expected outcome for most inputs; crashes are not.
  }
}

}  // namespace medfast::dicom
