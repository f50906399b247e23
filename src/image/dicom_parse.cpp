// DICOM parsing (see include/medfast/image/dicom.hpp): the element walker that checks
// every element, item and sequence length against the file, tag lookups and typed values,
// transfer syntaxes, and one file's header (geometry, rescale, SEG segments and frames,
// patient identifiers on request) read from its first bytes. Shared declarations are in
// dicom_dataset.hpp.
#include "medfast/image/dicom.hpp"

#include "dicom_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "medfast/core/endian.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom::detail {

std::vector<char> read_bytes(const std::string& path, std::size_t limit) {
  const os::File f = os::File::open(path, os::File::Mode::read);
  const std::uint64_t size = f.size();
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size, limit));
  std::vector<char> bytes(n);
  if (n) f.read_exact(bytes.data(), n, 0);
  return bytes;
}


// ---------------------------------------------------------------------------
// Tags: names for messages, and typed access.
// ---------------------------------------------------------------------------

namespace {

std::string tag_text(std::uint16_t g, std::uint16_t e, const char* keyword) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "(%04X,%04X)", g, e);
  return str(keyword, " ", buf);
}

constexpr TagName kPhiTags[] = {PatientName,   PatientID, PatientBirthDate, PatientSex,
                                OtherPatientIDs, AccessionNumber, StudyDate, InstitutionName,
                                ReferringPhysicianName, StudyID};

}  // namespace

std::string name_of(const TagName& t) { return tag_text(t.group, t.element, t.keyword); }

// ---------------------------------------------------------------------------
// A parsed dataset: elements pointing into the file's bytes (which outlive it).
// ---------------------------------------------------------------------------

namespace {

const Element* find(const Node& ds, const TagName& t) {
  const Element* e = ds.find(tag_of(t));
  return e && (e->length > 0 || !e->items.empty() || e->encapsulated) ? e : nullptr;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && s[b] == ' ') ++b;
  return s.substr(b);
}

}  // namespace

/// A text value, at most `limit` characters of it.
std::string text(const Node& ds, const TagName& t, std::size_t limit) {
  const Element* e = find(ds, t);
  if (!e || !e->value) return "";
  return trim(std::string(reinterpret_cast<const char*>(e->value), std::min<std::size_t>(e->length, limit)));
}

/// A DS/IS value list ("0.7\0.7") of at most `max_count` values (the rest are not read);
/// FormatError naming the file and tag when not numbers.
std::vector<double> numbers(const Node& ds, const TagName& t, const std::string& file, std::size_t max_count) {
  const std::string s = text(ds, t, std::max<std::size_t>(1 << 16, max_count * 17));
  std::vector<double> out;
  if (s.empty()) return out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = s.find('\\', start);
    const std::string item = trim(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    char* stop = nullptr;
    const double v = std::strtod(item.c_str(), &stop);
    if (item.empty() || stop == item.c_str() || *stop != '\0' || !std::isfinite(v)) {
      throw FormatError(str(file, ": ", name_of(t), ": '", s.substr(0, 80), "' is not a list of finite numbers"));
    }
    out.push_back(v);
    if (out.size() >= max_count) break;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

/// An unsigned short (US), little endian; -1 when absent.
int ushort_value(const Node& ds, const TagName& t) {
  const Element* e = find(ds, t);
  if (!e || !e->value || e->length < 2) return -1;
  return e->value[0] | (e->value[1] << 8);
}

Items items(const Node& ds, const TagName& t) {
  Items out;
  const Element* e = ds.find(tag_of(t));
  if (e && !e->items.empty()) out.v = &e->items;
  return out;
}

namespace {

/// The first item of a sequence nested in item `index` of a functional group, or null.
const Node* first_item(const Items& group, std::size_t index, const TagName& t, Items& keep) {
  if (index >= group.size()) return nullptr;
  keep = items(group[index], t);
  return keep.size() ? &keep[0] : nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------
// Transfer syntaxes.
// ---------------------------------------------------------------------------

Syntax classify(const std::string& uid, std::string* why) {
  static const std::set<std::string> native = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"};
  static const std::set<std::string> compressed = {
      "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70",
      "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91",
      "1.2.840.10008.1.2.5"};
  if (native.count(uid)) return Syntax::native;
  if (compressed.count(uid)) return Syntax::compressed;
  if (why) {
    if (uid == "1.2.840.10008.1.2.2") {
      *why = "explicit VR big endian (retired in 2004) is not read: convert the file to little endian first "
             "(dcmtk: dcmconv +te IN OUT)";
    } else if (uid == "1.2.840.10008.1.2.1.99") {
      *why = "deflated datasets are not read (image series do not use them)";
    } else {
      *why = "not one medfast decodes (implicit/explicit VR little endian, JPEG baseline/extended/lossless, JPEG-LS, "
             "JPEG 2000, RLE)";
    }
  }
  return Syntax::unsupported;
}

// ---------------------------------------------------------------------------
// Parsing. medfast walks every element, item and sequence itself, within the file's
// bounds (GDCM 3.0.21's parser asserts, and so aborts, on some malformed files, and
// allocates what a damaged length claims); GDCM does not read files at all.
// ---------------------------------------------------------------------------

namespace {

class Parser {
 public:
  /// `header_only`: stop at the pixel data element (what a header scan needs).
  Parser(const char* data, std::size_t size, std::string file, bool header_only)
      : p_(reinterpret_cast<const unsigned char*>(data)), size_(size), file_(std::move(file)),
        header_only_(header_only) {}

  Parsed run() {
    Parsed out;
    std::size_t at = 0;
    if (size_ >= 132 && std::memcmp(p_ + 128, "DICM", 4) == 0) {
      at = 132;
      // File meta: group 0002, explicit VR little endian.
      while (at + 8 <= size_ && u16(at) == 0x0002) {
        const std::uint16_t element = u16(at + 2);
        std::size_t value = 0, length = 0;
        explicit_header(at, value, length);
        if (length == kUndefined) fail(at, "an undefined length in the file meta");
        if (element == 0x0010) {
          out.transfer_syntax = trim(std::string(reinterpret_cast<const char*>(p_ + value), std::min<std::size_t>(length, 64)));
        }
        at = value + length;
      }
    } else if (size_ < 8 || !((p_[0] == 0x02 || p_[0] == 0x08) && p_[1] == 0 && p_[3] == 0)) {
      fail(0, "no DICM preamble and no dataset at the start");
    }
    const std::string& ts = out.transfer_syntax;
    if (ts == "1.2.840.10008.1.2.1.99" || ts == "1.2.840.10008.1.2.2") return out;  // refused by syntax later
    explicit_ = ts.empty() ? (at + 6 <= size_ && is_vr(p_[at + 4], p_[at + 5])) : ts != "1.2.840.10008.1.2";
    walk(at, size_, 0, false, out.dataset);
    out.reached_pixels = reached_pixels_;
    out.pixel_value = pixel_value_;
    out.pixel_length = pixel_length_;
    return out;
  }

 private:
  static constexpr std::size_t kUndefined = 0xffffffffu;

  std::uint16_t u16(std::size_t at) const { return le16(p_ + at); }
  std::uint32_t u32(std::size_t at) const { return le32(p_ + at); }
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw FormatError(str(file_, ": not a sound DICOM file: ", what, " at byte ", at));
  }
  static bool is_vr(unsigned char a, unsigned char b) {
    static const char* const known[] = {"AE", "AS", "AT", "CS", "DA", "DS", "DT", "FL", "FD", "IS", "LO", "LT", "OB",
                                        "OD", "OF", "OL", "OV", "OW", "PN", "SH", "SL", "SQ", "SS", "ST", "SV", "TM",
                                        "UC", "UI", "UL", "UN", "UR", "US", "UT", "UV"};
    for (const char* vr : known) {
      if (vr[0] == a && vr[1] == b) return true;
    }
    return false;
  }
  static bool long_form(unsigned char a, unsigned char b) {
    static const char* const vrs[] = {"OB", "OD", "OF", "OL", "OV", "OW", "SQ", "UC", "UN", "UR", "UT", "SV", "UV"};
    for (const char* vr : vrs) {
      if (vr[0] == a && vr[1] == b) return true;
    }
    return false;
  }
  static char printable(unsigned char c) { return c >= 32 && c < 127 ? static_cast<char>(c) : '?'; }

  /// An explicit-VR element header at `at`: where its value starts and its length; returns
  /// the VR's two characters packed.
  int explicit_header(std::size_t at, std::size_t& value, std::size_t& length) const {
    if (at + 8 > size_) fail(at, "a truncated element header");
    const unsigned char a = p_[at + 4], b = p_[at + 5];
    if (!is_vr(a, b)) fail(at, str("an unknown VR '", printable(a), printable(b), "'"));
    if (long_form(a, b)) {
      if (at + 12 > size_) fail(at, "a truncated element header");
      length = u32(at + 8);
      value = at + 12;
    } else {
      length = u16(at + 6);
      value = at + 8;
    }
    if (length != kUndefined && value + length > size_) {
      fail(at, str("an element claiming ", length, " bytes with ", size_ - value, " left"));
    }
    return (a << 8) | b;
  }

  /// Elements from `at` to `end` (or to a delimiter when `delimited`) into `out`; returns
  /// where it stopped.
  std::size_t walk(std::size_t at, std::size_t end, int depth, bool delimited, Node& out) {
    if (depth > 12) fail(at, "sequences nested more than 12 deep");
    while (at < end) {
      if (at + 8 > end) {
        if (depth == 0 && !delimited) return end;  // trailing padding shorter than an element
        fail(at, "a truncated element");
      }
      if (++elements_ > 2000000) fail(at, "more than two million elements");
      const std::uint16_t group = u16(at), element = u16(at + 2);
      const std::uint32_t tag = (static_cast<std::uint32_t>(group) << 16) | element;
      if (group == 0xfffe) {
        if (element == 0xe00d || element == 0xe0dd) {
          if (!delimited) fail(at, "a delimiter outside a sequence or item");
          return at + 8;
        }
        fail(at, "an item outside a sequence");
      }
      if (depth == 0 && tag == 0x7fe00010) {
        reached_pixels_ = true;
        if (header_only_) {
          pixel_element(at);
          return end;
        }
      }
      std::size_t value = 0, length = 0;
      bool sequence = false;
      Element e;
      e.tag = tag;
      if (explicit_) {
        const int vr = explicit_header(at, value, length);
        sequence = vr == (('S' << 8) | 'Q') || (vr == (('U' << 8) | 'N') && length == kUndefined);
        if (length == kUndefined && !sequence) {
          if (tag == 0x7fe00010) {
            e.encapsulated = true;
            at = fragments(value, end, e);
            out.elements.push_back(std::move(e));
            continue;
          }
          fail(at, "an undefined length on a non-sequence element");
        }
      } else {
        length = u32(at + 4);
        value = at + 8;
        if (length == kUndefined && tag == 0x7fe00010) fail(at, "encapsulated pixel data in implicit VR");
        // Implicit VR carries no VR: a value that starts with an item is a sequence.
        sequence = length == kUndefined || (tag != 0x7fe00010 && length >= 8 && value + 8 <= end &&
                                            u16(value) == 0xfffe && u16(value + 2) == 0xe000);
      }
      if (length != kUndefined && value + length > end) {
        fail(at, str("an element claiming ", length, " bytes with ", end - std::min(end, value), " left"));
      }
      if (sequence) {
        at = items(value, length == kUndefined ? end : value + length, length == kUndefined, depth + 1, e);
      } else {
        e.value = p_ + value;
        e.length = length;
        at = value + length;
      }
      out.elements.push_back(std::move(e));
    }
    if (delimited) fail(at, "a sequence or item without its delimiter");
    return at;
  }

  /// The items of a sequence into `e`; returns where the sequence ends.
  std::size_t items(std::size_t at, std::size_t end, bool delimited, int depth, Element& e) {
    while (at < end) {
      if (at + 8 > end) fail(at, "a truncated item");
      const std::uint16_t group = u16(at), element = u16(at + 2);
      if (group != 0xfffe) fail(at, "a sequence holding something other than items");
      if (element == 0xe0dd) {
        if (!delimited) fail(at, "a sequence delimiter in a defined-length sequence");
        return at + 8;
      }
      if (element != 0xe000) fail(at, "a sequence holding something other than items");
      if (e.items.size() > 1000000) fail(at, "more than a million items in a sequence");
      const std::size_t length = u32(at + 4);
      e.items.emplace_back();
      if (length == kUndefined) {
        at = walk(at + 8, end, depth, true, e.items.back());
      } else {
        if (at + 8 + length > end) fail(at, str("an item claiming ", length, " bytes with ", end - at - 8, " left"));
        const std::size_t stop = walk(at + 8, at + 8 + length, depth, false, e.items.back());
        if (stop != at + 8 + length) fail(at, "an item whose elements do not fill it");
        at = stop;
      }
    }
    if (delimited) fail(at, "a sequence without its delimiter");
    return at;
  }

  /// Encapsulated pixel data: the offset table and fragments up to the sequence delimiter.
  std::size_t fragments(std::size_t at, std::size_t end, Element& e) {
    for (int n = 0; at + 8 <= end; ++n) {
      if (n > 1000000) fail(at, "more than a million pixel data fragments");
      const std::uint16_t group = u16(at), element = u16(at + 2);
      const std::size_t length = u32(at + 4);
      if (group == 0xfffe && element == 0xe0dd) return at + 8;
      if (group != 0xfffe || element != 0xe000 || length == kUndefined || at + 8 + length > end) {
        fail(at, "a damaged pixel data fragment");
      }
      e.fragments.emplace_back(p_ + at + 8, length);
      at += 8 + length;
    }
    fail(at, "encapsulated pixel data without its delimiter");
  }

  // Where the pixel data's value starts and the length its element header declares (read
  // without the bounds check: a header scan holds only the file's first bytes).
  void pixel_element(std::size_t at) {
    if (explicit_) {
      if (at + 6 > size_) return;
      if (long_form(p_[at + 4], p_[at + 5])) {
        if (at + 12 > size_) return;
        pixel_value_ = at + 12;
        pixel_length_ = u32(at + 8);
      } else {
        if (at + 8 > size_) return;
        pixel_value_ = at + 8;
        pixel_length_ = u16(at + 6);
      }
    } else {
      if (at + 8 > size_) return;
      pixel_value_ = at + 8;
      pixel_length_ = u32(at + 4);
    }
  }

  const unsigned char* p_;
  std::size_t size_;
  std::string file_;
  std::size_t pixel_value_ = 0, pixel_length_ = 0;
  bool header_only_ = false;
  bool explicit_ = true;
  bool reached_pixels_ = false;
  std::size_t elements_ = 0;
};

}  // namespace

Parsed parse_bytes(const char* data, std::size_t size, const std::string& file, bool header_only) {
  return Parser(data, size, file, header_only).run();
}

// ---------------------------------------------------------------------------
// One file's header.
// ---------------------------------------------------------------------------

namespace {

template <std::size_t N>
bool fill(std::array<double, N>& out, const std::vector<double>& v) {
  if (v.size() < N) return false;
  for (std::size_t i = 0; i < N; ++i) out[i] = v[i];
  return true;
}

void require_count(const std::vector<double>& v, std::size_t n, const TagName& t, const std::string& file) {
  if (!v.empty() && v.size() != n) {
    throw FormatError(str(file, ": ", name_of(t), " has ", v.size(), " values, expected ", n));
  }
}

}  // namespace

/// Parses the header dataset (everything before the pixel data).
Header parse_header(const Parsed& parsed, const std::string& file, bool phi) {
  const Node& ds = parsed.dataset;
  Header h;
  h.file = file;
  // Without file meta the dataset's own encoding decides (implicit VR little endian is
  // the DICOM default).
  h.transfer_syntax = parsed.transfer_syntax.empty() ? "1.2.840.10008.1.2" : parsed.transfer_syntax;
  h.sop_class = text(ds, SOPClassUID);
  h.sop_instance = text(ds, SOPInstanceUID);
  h.modality = text(ds, Modality);
  h.series_uid = text(ds, SeriesInstanceUID);
  h.study_uid = text(ds, StudyInstanceUID);
  h.description = text(ds, SeriesDescription);
  h.rows = ushort_value(ds, Rows);
  h.columns = ushort_value(ds, Columns);
  h.bits_allocated = ushort_value(ds, BitsAllocated);
  h.bits_stored = ushort_value(ds, BitsStored);
  h.pixel_representation = std::max(0, ushort_value(ds, PixelRepresentation));
  if (h.pixel_representation > 1) {
    throw FormatError(str(file, ": ", name_of(PixelRepresentation), " is ", h.pixel_representation,
                          ", expected 0 (unsigned) or 1 (signed)"));
  }
  if (h.bits_stored > h.bits_allocated && h.bits_allocated > 0) {
    throw FormatError(str(file, ": ", name_of(BitsStored), " ", h.bits_stored, " exceeds ", name_of(BitsAllocated), " ",
                          h.bits_allocated));
  }
  const int samples = ushort_value(ds, SamplesPerPixel);
  h.samples = samples < 0 ? 1 : samples;
  const auto frames = numbers(ds, NumberOfFrames, file);
  if (!frames.empty()) {
    if (frames[0] < 1 || frames[0] > 1e6 || frames[0] != std::floor(frames[0])) {
      throw FormatError(str(file, ": ", name_of(NumberOfFrames), " is ", frames[0], ", expected a whole number >= 1"));
    }
    h.frames = static_cast<int>(frames[0]);
    h.multi_frame = true;
  }
  const auto thickness = numbers(ds, SliceThickness, file);
  if (!thickness.empty()) h.slice_thickness = thickness[0];

  // Plain (single-frame) geometry and rescale: the fallback for functional groups.
  const auto ipp = numbers(ds, ImagePositionPatient, file);
  const auto iop = numbers(ds, ImageOrientationPatient, file);
  const auto ps = numbers(ds, PixelSpacing, file);
  const auto slope = numbers(ds, RescaleSlope, file);
  const auto intercept = numbers(ds, RescaleIntercept, file);

  const Items shared = items(ds, SharedFunctionalGroupsSequence);
  const Items per_frame = items(ds, PerFrameFunctionalGroupsSequence);
  if (per_frame.size() && static_cast<int>(per_frame.size()) != h.frames) {
    throw FormatError(str(file, ": ", name_of(PerFrameFunctionalGroupsSequence), " has ", per_frame.size(),
                          " items for ", h.frames, " frames (", name_of(NumberOfFrames), ")"));
  }
  // A functional-group value: this frame's, else the shared one, else the plain tag.
  auto group_numbers = [&](std::size_t frame, const TagName& seq, const TagName& t, const std::vector<double>& plain) {
    Items keep;
    if (const Node* d = first_item(per_frame, frame, seq, keep)) {
      auto v = numbers(*d, t, file);
      if (!v.empty()) return v;
    }
    if (const Node* d = first_item(shared, 0, seq, keep)) {
      auto v = numbers(*d, t, file);
      if (!v.empty()) return v;
    }
    return plain;
  };

  // RT Dose (PS3.3 C.8.8.3): a multi-frame grid placed by GridFrameOffsetVector from the
  // one ImagePositionPatient, its stored values scaled by DoseGridScaling.
  auto offsets = numbers(ds, GridFrameOffsetVector, file, static_cast<std::size_t>(h.frames) + 1);
  const auto dose_scaling = numbers(ds, DoseGridScaling, file);
  const bool per_frame_positions = per_frame.size() > 0 || shared.size() > 0;
  if (!offsets.empty() && !per_frame_positions) {
    if (offsets.size() > static_cast<std::size_t>(h.frames)) {
      // More offsets than frames (pydicom's rtdose_1frame.dcm: 15 offsets, one frame): the
      // frames present take the first offsets, as pydicom and dcmtk read such a file.
      log::warn_once(str(file, "|", name_of(GridFrameOffsetVector)), "dicom: ", file, ": ", name_of(GridFrameOffsetVector), " has more than ", h.frames,
                " values for ", h.frames, " frame(s) (", name_of(NumberOfFrames), "): the frames present take the first ",
                h.frames);
      offsets.resize(static_cast<std::size_t>(h.frames));
    }
    if (offsets.size() != static_cast<std::size_t>(h.frames)) {
      throw FormatError(str(file, ": ", name_of(GridFrameOffsetVector), " has ",
                            offsets.size() > static_cast<std::size_t>(h.frames) ? "more than " : "",
                            std::min<std::size_t>(offsets.size(), static_cast<std::size_t>(h.frames)), " values for ", h.frames,
                            " frame(s) (", name_of(NumberOfFrames), ")"));
    }
    if (ipp.size() != 3 || iop.size() != 6) {
      throw FormatError(str(file, ": ", name_of(GridFrameOffsetVector), " places frames from ", name_of(ImagePositionPatient),
                            " along the normal of ", name_of(ImageOrientationPatient), ", and one of them is missing"));
    }
    // Relative (first offset 0) or absolute (first offset = the position's z, transverse
    // slices only): either way frame k lies offsets[k] - offsets[0] along the normal.
    if (offsets[0] != 0) {
      const bool transverse = std::fabs(iop[0] - 1) < 1e-4 && std::fabs(iop[4] - 1) < 1e-4 && std::fabs(iop[1]) < 1e-4 &&
                              std::fabs(iop[2]) < 1e-4 && std::fabs(iop[3]) < 1e-4 && std::fabs(iop[5]) < 1e-4;
      if (!transverse || std::fabs(offsets[0] - ipp[2]) > 1e-3) {
        throw FormatError(str(file, ": ", name_of(GridFrameOffsetVector), " starts at ", offsets[0],
                              ": expected 0 (offsets relative to the first frame) or, for transverse slices (",
                              name_of(ImageOrientationPatient), " 1\\0\\0\\0\\1\\0), ", name_of(ImagePositionPatient),
                              "'s z ", ipp[2], " (absolute offsets)"));
      }
    }
  }
  double dose_scale = 1.0;
  if (h.modality == "RTDOSE" || !dose_scaling.empty()) {
    if (dose_scaling.empty() && h.rows > 0) {  // an RTDOSE without a grid (DVHs only) needs none
      throw FormatError(str(file, ": an RTDOSE without ", name_of(DoseGridScaling),
                            ": its stored values cannot be turned into dose"));
    }
    dose_scale = dose_scaling.empty() ? 1.0 : dose_scaling[0];
    if (!(dose_scale > 0)) {
      throw FormatError(str(file, ": ", name_of(DoseGridScaling), " is ", dose_scale, ", expected a positive factor"));
    }
    h.dose_units = text(ds, DoseUnits);
  }

  h.slices.resize(static_cast<std::size_t>(h.frames));
  for (std::size_t fr = 0; fr < h.slices.size(); ++fr) {
    Slice& s = h.slices[fr];
    s.file = file;
    s.frame = static_cast<int>(fr);
    s.sop_instance_uid = h.sop_instance;
    s.rows = h.rows;
    s.columns = h.columns;
    const auto p = group_numbers(fr, PlanePositionSequence, ImagePositionPatient, ipp);
    const auto o = group_numbers(fr, PlaneOrientationSequence, ImageOrientationPatient, iop);
    const auto sp = group_numbers(fr, PixelMeasuresSequence, PixelSpacing, ps);
    require_count(p, 3, ImagePositionPatient, file);
    require_count(o, 6, ImageOrientationPatient, file);
    require_count(sp, 2, PixelSpacing, file);
    s.has_position = fill(s.position, p);
    s.has_orientation = fill(s.orientation, o);
    if (!offsets.empty() && !per_frame_positions) {
      const auto n = normal_of(s.orientation);
      const double along = offsets[fr] - offsets[0];
      for (int i = 0; i < 3; ++i) s.position[static_cast<std::size_t>(i)] += along * n[static_cast<std::size_t>(i)];
    }
    fill(s.pixel_spacing, sp);
    const auto sl = group_numbers(fr, PixelValueTransformationSequence, RescaleSlope, slope);
    const auto in = group_numbers(fr, PixelValueTransformationSequence, RescaleIntercept, intercept);
    s.slope = (sl.empty() ? 1.0 : sl[0]) * dose_scale;
    s.intercept = in.empty() ? 0.0 : in[0];
    if (s.slope == 0) throw FormatError(str(file, ": ", name_of(RescaleSlope), " is 0"));
  }

  // RT Structure Set: its ROIs stand for segments (ROINumber, ROIName), the series its
  // contours lie on; the contours themselves are read when it is placed (dicom_rtstruct.cpp).
  const Items rois = items(ds, StructureSetROISequence);
  h.is_rtstruct = h.modality == "RTSTRUCT" || rois.size() > 0;
  if (h.is_rtstruct) {
    h.is_seg = true;
    for (std::size_t i = 0; i < rois.size(); ++i) {
      const auto number = numbers(rois[i], ROINumber, file);
      if (number.empty() || number[0] != std::floor(number[0]) || number[0] < 0 || number[0] > 1e9) {
        throw FormatError(str(file, ": ", name_of(StructureSetROISequence), " item ", i + 1, ": ", name_of(ROINumber),
                              " is missing or not a whole number"));
      }
      Segment seg;
      seg.number = static_cast<int>(number[0]);
      seg.label = text(rois[i], ROIName);
      h.segments.push_back(std::move(seg));
    }
    const Items frames_of_reference = items(ds, ReferencedFrameOfReferenceSequence);
    for (std::size_t f = 0; f < frames_of_reference.size(); ++f) {
      const Items studies = items(frames_of_reference[f], RTReferencedStudySequence);
      for (std::size_t st = 0; st < studies.size(); ++st) {
        const Items series = items(studies[st], RTReferencedSeriesSequence);
        for (std::size_t se = 0; se < series.size(); ++se) {
          const std::string uid = text(series[se], SeriesInstanceUID);
          if (!uid.empty()) h.referenced_series.push_back(uid);
        }
      }
    }
    return h;
  }

  // SEG: segments, the series it references, and per frame its segment and source image.
  const Items segs = items(ds, SegmentSequence);
  h.is_seg = h.modality == "SEG" || segs.size() > 0;
  if (!h.is_seg) {
    if (phi) {
      for (const TagName& t : kPhiTags) {
        const std::string v = text(ds, t);
        if (!v.empty()) h.phi[t.keyword] = v;
      }
    }
    return h;
  }
  for (std::size_t i = 0; i < segs.size(); ++i) {
    Segment seg;
    seg.number = ushort_value(segs[i], SegmentNumber);
    if (seg.number < 0) {
      throw FormatError(str(file, ": ", name_of(SegmentSequence), " item ", i + 1, " has no ", name_of(SegmentNumber)));
    }
    seg.label = text(segs[i], SegmentLabel);
    seg.description = text(segs[i], SegmentDescription);
    h.segments.push_back(std::move(seg));
  }
  const Items refs = items(ds, ReferencedSeriesSequence);
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const std::string uid = text(refs[i], SeriesInstanceUID);
    if (!uid.empty()) h.referenced_series.push_back(uid);
  }
  h.segmentation_type = text(ds, SegmentationType);
  const int max_fractional = ushort_value(ds, MaximumFractionalValue);
  h.max_fractional = max_fractional > 0 ? max_fractional : 255;
  h.frame_segment.assign(h.slices.size(), -1);
  h.frame_source.assign(h.slices.size(), "");
  for (std::size_t fr = 0; fr < per_frame.size() && fr < h.slices.size(); ++fr) {
    Items seg_id;
    if (const Node* d = first_item(per_frame, fr, SegmentIdentificationSequence, seg_id)) {
      h.frame_segment[fr] = ushort_value(*d, ReferencedSegmentNumber);
    }
    Items derivation, source;
    if (const Node* d = first_item(per_frame, fr, DerivationImageSequence, derivation)) {
      source = items(*d, SourceImageSequence);
      if (source.size()) h.frame_source[fr] = text(source[0], ReferencedSOPInstanceUID);
    }
  }
  return h;
}

namespace {

/// Parses a file's header from its first bytes (the whole file when the header runs
/// longer); nullopt when it is not DICOM at all.
std::optional<Header> read_header_unguarded(const std::string& file, bool phi) {
  constexpr std::size_t kPrefix = 16 << 10;  // CT headers are a few KiB; longer ones are read whole
  std::vector<char> bytes = read_bytes(file, kPrefix);
  const std::uint64_t size = os::stat(file).size;
  // The header, with what its pixel data can hold: the length its element declares, within
  // the file (an encapsulated one, of undefined length: the rest of the file).
  const auto header_of = [&](const Parsed& p) {
    Header h = parse_header(p, file, phi);
    if (p.pixel_value > 0 && p.pixel_value <= size) {
      const std::uint64_t rest = size - p.pixel_value;
      h.pixel_bytes = p.pixel_length == 0xffffffffu ? rest : std::min<std::uint64_t>(p.pixel_length, rest);
    }
    return h;
  };
  try {
    if (bytes.size() < size) {
      try {
        const Parsed p = parse_bytes(bytes.data(), bytes.size(), file, /*header_only=*/true);
        if (p.reached_pixels && p.pixel_value > 0) return header_of(p);
      } catch (const FormatError&) {
        // the header runs past the prefix: parse the whole file
      }
      bytes = read_bytes(file);
    }
    return header_of(parse_bytes(bytes.data(), bytes.size(), file, /*header_only=*/true));
  } catch (const FormatError&) {
    const bool dicm = bytes.size() >= 132 && std::memcmp(bytes.data() + 128, "DICM", 4) == 0;
    if (!dicm) return std::nullopt;  // not DICOM at all (a README, a NIfTI...)
    throw;
  }
}

}  // namespace

std::optional<Header> read_header_of(const std::string& file, bool phi) {
  return guarded(file, [&] { return read_header_unguarded(file, phi); });
}

}  // namespace medfast::dicom::detail
