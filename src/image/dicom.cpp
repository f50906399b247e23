// DICOM series and SEG reading (see include/medfast/image/dicom.hpp). Files are read
// through medfast's OS layer into memory and parsed by medfast (every length checked
// against the file); native pixel data is used where it lies in the file's bytes,
// compressed pixel data is decoded frame by frame (dicom_codecs.cpp).
#include "medfast/image/dicom.hpp"

#include "dicom_codecs.hpp"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom {

namespace {

std::vector<char> read_bytes(const std::string& path, std::size_t limit = std::numeric_limits<std::size_t>::max()) {
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

struct TagName {
  std::uint16_t group, element;
  const char* keyword;
};

std::string tag_text(std::uint16_t g, std::uint16_t e, const char* keyword) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "(%04X,%04X)", g, e);
  return str(keyword, " ", buf);
}

#define MEDFAST_TAG(name, g, e) constexpr TagName name{g, e, #name};
MEDFAST_TAG(TransferSyntaxUID, 0x0002, 0x0010)
MEDFAST_TAG(SOPClassUID, 0x0008, 0x0016)
MEDFAST_TAG(SOPInstanceUID, 0x0008, 0x0018)
MEDFAST_TAG(Modality, 0x0008, 0x0060)
MEDFAST_TAG(SeriesDescription, 0x0008, 0x103e)
MEDFAST_TAG(ReferencedSeriesSequence, 0x0008, 0x1115)
MEDFAST_TAG(ReferencedSOPInstanceUID, 0x0008, 0x1155)
MEDFAST_TAG(SourceImageSequence, 0x0008, 0x2112)
MEDFAST_TAG(DerivationImageSequence, 0x0008, 0x9124)
MEDFAST_TAG(SliceThickness, 0x0018, 0x0050)
MEDFAST_TAG(StudyInstanceUID, 0x0020, 0x000d)
MEDFAST_TAG(SeriesInstanceUID, 0x0020, 0x000e)
MEDFAST_TAG(ImagePositionPatient, 0x0020, 0x0032)
MEDFAST_TAG(ImageOrientationPatient, 0x0020, 0x0037)
MEDFAST_TAG(PlanePositionSequence, 0x0020, 0x9113)
MEDFAST_TAG(PlaneOrientationSequence, 0x0020, 0x9116)
MEDFAST_TAG(SamplesPerPixel, 0x0028, 0x0002)
MEDFAST_TAG(NumberOfFrames, 0x0028, 0x0008)
MEDFAST_TAG(Rows, 0x0028, 0x0010)
MEDFAST_TAG(Columns, 0x0028, 0x0011)
MEDFAST_TAG(PixelSpacing, 0x0028, 0x0030)
MEDFAST_TAG(BitsAllocated, 0x0028, 0x0100)
MEDFAST_TAG(BitsStored, 0x0028, 0x0101)
MEDFAST_TAG(PixelRepresentation, 0x0028, 0x0103)
MEDFAST_TAG(RescaleIntercept, 0x0028, 0x1052)
MEDFAST_TAG(RescaleSlope, 0x0028, 0x1053)
MEDFAST_TAG(PixelMeasuresSequence, 0x0028, 0x9110)
MEDFAST_TAG(PixelValueTransformationSequence, 0x0028, 0x9145)
MEDFAST_TAG(SegmentationType, 0x0062, 0x0001)
MEDFAST_TAG(SegmentSequence, 0x0062, 0x0002)
MEDFAST_TAG(SegmentNumber, 0x0062, 0x0004)
MEDFAST_TAG(SegmentLabel, 0x0062, 0x0005)
MEDFAST_TAG(SegmentDescription, 0x0062, 0x0006)
MEDFAST_TAG(SegmentIdentificationSequence, 0x0062, 0x000a)
MEDFAST_TAG(ReferencedSegmentNumber, 0x0062, 0x000b)
MEDFAST_TAG(MaximumFractionalValue, 0x0062, 0x000e)
MEDFAST_TAG(SharedFunctionalGroupsSequence, 0x5200, 0x9229)
MEDFAST_TAG(PerFrameFunctionalGroupsSequence, 0x5200, 0x9230)
MEDFAST_TAG(PixelData, 0x7fe0, 0x0010)
// Patient identifiers: read only for `info --phi`.
MEDFAST_TAG(PatientName, 0x0010, 0x0010)
MEDFAST_TAG(PatientID, 0x0010, 0x0020)
MEDFAST_TAG(PatientBirthDate, 0x0010, 0x0030)
MEDFAST_TAG(PatientSex, 0x0010, 0x0040)
MEDFAST_TAG(OtherPatientIDs, 0x0010, 0x1000)
MEDFAST_TAG(AccessionNumber, 0x0008, 0x0050)
MEDFAST_TAG(StudyDate, 0x0008, 0x0020)
MEDFAST_TAG(InstitutionName, 0x0008, 0x0080)
MEDFAST_TAG(ReferringPhysicianName, 0x0008, 0x0090)
MEDFAST_TAG(StudyID, 0x0020, 0x0010)
#undef MEDFAST_TAG

constexpr TagName kPhiTags[] = {PatientName,   PatientID, PatientBirthDate, PatientSex,
                                OtherPatientIDs, AccessionNumber, StudyDate, InstitutionName,
                                ReferringPhysicianName, StudyID};

std::string name_of(const TagName& t) { return tag_text(t.group, t.element, t.keyword); }

// ---------------------------------------------------------------------------
// A parsed dataset: elements pointing into the file's bytes (which outlive it).
// ---------------------------------------------------------------------------

struct Node;

struct Element {
  std::uint32_t tag = 0;
  const unsigned char* value = nullptr;
  std::size_t length = 0;
  std::vector<Node> items;  // a sequence's items
  std::vector<std::pair<const unsigned char*, std::size_t>> fragments;  // encapsulated pixel data
  bool encapsulated = false;
};

struct Node {
  std::vector<Element> elements;
  const Element* find(std::uint32_t tag) const {
    for (const Element& e : elements) {
      if (e.tag == tag) return &e;
    }
    return nullptr;
  }
};

std::uint32_t tag_of(const TagName& t) { return (static_cast<std::uint32_t>(t.group) << 16) | t.element; }

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

std::string text(const Node& ds, const TagName& t) {
  const Element* e = find(ds, t);
  if (!e || !e->value) return "";
  return trim(std::string(reinterpret_cast<const char*>(e->value), std::min<std::size_t>(e->length, 1 << 16)));
}

/// A DS/IS value list ("0.7\0.7"); FormatError naming the file and tag when not numbers.
std::vector<double> numbers(const Node& ds, const TagName& t, const std::string& file) {
  const std::string s = text(ds, t);
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
    if (out.size() > 64) break;
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

/// A sequence's items (empty when absent).
struct Items {
  const std::vector<Node>* v = nullptr;
  std::size_t size() const { return v ? v->size() : 0; }
  const Node& operator[](std::size_t i) const { return (*v)[i]; }
};

Items items(const Node& ds, const TagName& t) {
  Items out;
  const Element* e = ds.find(tag_of(t));
  if (e && !e->items.empty()) out.v = &e->items;
  return out;
}

/// The first item of a sequence nested in item `index` of a functional group, or null.
const Node* first_item(const Items& group, std::size_t index, const TagName& t, Items& keep) {
  if (index >= group.size()) return nullptr;
  keep = items(group[index], t);
  return keep.size() ? &keep[0] : nullptr;
}

// ---------------------------------------------------------------------------
// Transfer syntaxes.
// ---------------------------------------------------------------------------

enum class Syntax { native, compressed, unsupported };

Syntax classify(const std::string& uid, std::string* why) {
  static const std::set<std::string> native = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"};
  static const std::set<std::string> compressed = {
      "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70",
      "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91",
      "1.2.840.10008.1.2.5"};
  if (native.count(uid)) return Syntax::native;
  if (compressed.count(uid)) return Syntax::compressed;
  if (why) {
    *why = uid == "1.2.840.10008.1.2.2"     ? "explicit VR big endian (retired) is not read"
           : uid == "1.2.840.10008.1.2.1.99" ? "deflated datasets are not read (image series do not use them)"
                                             : "not one medfast decodes (implicit/explicit VR little endian, JPEG "
                                               "baseline/extended/lossless, JPEG-LS, JPEG 2000, RLE)";
  }
  return Syntax::unsupported;
}

// ---------------------------------------------------------------------------
// Parsing. medfast walks every element, item and sequence itself, within the file's
// bounds (GDCM 3.0.21's parser asserts, and so aborts, on some malformed files, and
// allocates what a damaged length claims); GDCM does not read files at all.
// ---------------------------------------------------------------------------

struct Parsed {
  std::string transfer_syntax;  ///< from the file meta ("" without meta)
  Node dataset;
  bool reached_pixels = false;  ///< the pixel data element was found
};

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
    return out;
  }

 private:
  static constexpr std::size_t kUndefined = 0xffffffffu;

  std::uint16_t u16(std::size_t at) const { return static_cast<std::uint16_t>(p_[at] | (p_[at + 1] << 8)); }
  std::uint32_t u32(std::size_t at) const {
    return static_cast<std::uint32_t>(p_[at]) | (static_cast<std::uint32_t>(p_[at + 1]) << 8) |
           (static_cast<std::uint32_t>(p_[at + 2]) << 16) | (static_cast<std::uint32_t>(p_[at + 3]) << 24);
  }
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
        if (header_only_) return end;
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

  const unsigned char* p_;
  std::size_t size_;
  std::string file_;
  bool header_only_ = false;
  bool explicit_ = true;
  bool reached_pixels_ = false;
  std::size_t elements_ = 0;
};

Parsed parse_bytes(const char* data, std::size_t size, const std::string& file, bool header_only) {
  return Parser(data, size, file, header_only).run();
}

// ---------------------------------------------------------------------------
// One file's header.
// ---------------------------------------------------------------------------

/// What a file's header says; one Slice per frame (positions may be missing: checked later).
struct Header {
  std::string file, transfer_syntax, sop_class, sop_instance, modality, series_uid, study_uid, description;
  int rows = -1, columns = -1, frames = 1;
  int bits_allocated = -1, bits_stored = -1, pixel_representation = 0, samples = 1;
  double slice_thickness = 0;
  bool multi_frame = false, is_seg = false;
  std::vector<Slice> slices;
  // SEG: per frame, the segment and the source image (SOP instance) it was derived from.
  std::vector<int> frame_segment;
  std::vector<std::string> frame_source;
  std::string segmentation_type;
  double max_fractional = 0;
  std::vector<Segment> segments;
  std::vector<std::string> referenced_series;
  std::map<std::string, std::string> phi;
};

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
    fill(s.pixel_spacing, sp);
    const auto sl = group_numbers(fr, PixelValueTransformationSequence, RescaleSlope, slope);
    const auto in = group_numbers(fr, PixelValueTransformationSequence, RescaleIntercept, intercept);
    s.slope = sl.empty() ? 1.0 : sl[0];
    s.intercept = in.empty() ? 0.0 : in[0];
    if (s.slope == 0) throw FormatError(str(file, ": ", name_of(RescaleSlope), " is 0"));
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

/// Parses a file's header from its first bytes (the whole file when the header runs
/// longer); nullopt when it is not DICOM at all.
std::optional<Header> read_header_unguarded(const std::string& file, bool phi) {
  constexpr std::size_t kPrefix = 16 << 10;  // CT headers are a few KiB; longer ones are read whole
  std::vector<char> bytes = read_bytes(file, kPrefix);
  const std::uint64_t size = os::stat(file).size;
  try {
    if (bytes.size() < size) {
      try {
        const Parsed p = parse_bytes(bytes.data(), bytes.size(), file, /*header_only=*/true);
        if (p.reached_pixels) return parse_header(p, file, phi);
      } catch (const FormatError&) {
        // the header runs past the prefix: parse the whole file
      }
      bytes = read_bytes(file);
    }
    return parse_header(parse_bytes(bytes.data(), bytes.size(), file, /*header_only=*/true), file, phi);
  } catch (const FormatError&) {
    const bool dicm = bytes.size() >= 132 && std::memcmp(bytes.data() + 128, "DICM", 4) == 0;
    if (!dicm) return std::nullopt;  // not DICOM at all (a README, a NIfTI...)
    throw;
  }
}

std::string base_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// Exceptions other than medfast's (a decoder library's, an allocation a damaged length
/// asks for) become FormatErrors naming the file, like every other bad input.
template <typename Fn>
auto guarded(const std::string& file, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw FormatError(str(file, ": not a readable DICOM file (its lengths ask for more memory than there is)"));
  } catch (const std::exception& e) {
    throw FormatError(str(file, ": not a readable DICOM file: ", e.what()));
  }
}

std::optional<Header> read_header_of(const std::string& file, bool phi) {
  return guarded(file, [&] { return read_header_unguarded(file, phi); });
}

bool skipped_name(const std::string& name) { return name.empty() || name[0] == '.' || name == "DICOMDIR"; }

void walk(const std::string& dir, std::vector<std::string>& out, int depth) {
  if (depth > 16) throw FormatError(str(dir, ": folders nested more than 16 deep"));
  for (const std::string& name : os::list_directory(dir)) {
    if (skipped_name(name)) continue;
    const std::string path = dir + "/" + name;
    const os::FileInfo fi = os::stat(path);
    if (fi.is_directory) {
      walk(path, out, depth + 1);
    } else if (fi.is_regular) {
      out.push_back(path);
    }
  }
}

double dot(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}
std::array<double, 3> row_of(const std::array<double, 6>& o) { return {o[0], o[1], o[2]}; }
std::array<double, 3> column_of(const std::array<double, 6>& o) { return {o[3], o[4], o[5]}; }
std::array<double, 3> normal_of(const std::array<double, 6>& o) {
  return {o[1] * o[5] - o[2] * o[4], o[2] * o[3] - o[0] * o[5], o[0] * o[4] - o[1] * o[3]};
}
std::array<double, 3> minus(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return {a[0] - b[0], a[1] - b[1], a[2] - b[2]};
}

std::string slice_name(const Slice& s) { return s.frame > 0 || s.file.empty() ? str(s.file, " frame ", s.frame + 1) : s.file; }

template <typename A>
std::string dicom_values(const A& values) {
  std::ostringstream o;
  for (std::size_t i = 0; i < values.size(); ++i) o << (i ? "\\" : "") << values[i];
  return o.str();
}

/// One series from its files' headers, slices sorted along the first slice's normal.
Series series_of(const std::vector<const Header*>& members, bool phi) {
  Series s;
  const Header& first = *members.front();
  s.series_uid = first.series_uid;
  s.study_uid = first.study_uid;
  s.modality = first.modality;
  s.description = first.description;
  s.sop_class_uid = first.sop_class;
  s.transfer_syntax = first.transfer_syntax;
  s.rows = first.rows;
  s.columns = first.columns;
  s.bits_allocated = first.bits_allocated;
  s.bits_stored = first.bits_stored;
  s.pixel_representation = first.pixel_representation;
  s.multi_frame = first.multi_frame;
  s.is_seg = first.is_seg;
  s.segments = first.segments;
  s.referenced_series = first.referenced_series;
  s.slice_thickness = first.slice_thickness;
  if (phi) s.phi = first.phi;
  for (const Header* h : members) {
    s.files.push_back(h->file);
    s.slices.insert(s.slices.end(), h->slices.begin(), h->slices.end());
  }
  const Slice& any = s.slices.front();
  s.orientation = any.orientation;
  s.pixel_spacing = any.pixel_spacing;
  const auto n = normal_of(s.orientation);
  for (auto& sl : s.slices) sl.along_normal = dot(sl.position, n);
  std::stable_sort(s.slices.begin(), s.slices.end(),
                   [](const Slice& a, const Slice& b) { return a.along_normal < b.along_normal; });
  return s;
}

/// Groups headers into series (each SEG file its own), image series largest first.
Scan group(const std::string& path, const std::vector<Header>& headers, std::vector<std::string> skipped, bool phi) {
  Scan scan;
  scan.path = path;
  scan.skipped = std::move(skipped);
  std::map<std::string, std::vector<const Header*>> by_uid;
  for (const Header& h : headers) {
    if (h.is_seg) {
      scan.series.push_back(series_of({&h}, phi));
    } else {
      by_uid[h.series_uid].push_back(&h);
    }
  }
  for (const auto& [uid, members] : by_uid) scan.series.push_back(series_of(members, phi));
  std::stable_sort(scan.series.begin(), scan.series.end(), [](const Series& x, const Series& y) {
    if (x.is_seg != y.is_seg) return !x.is_seg;
    return x.slices.size() > y.slices.size();
  });
  return scan;
}

}  // namespace

std::vector<std::string> files_of(const std::string& path) {
  const os::FileInfo fi = os::stat(path);
  std::vector<std::string> files;
  if (fi.is_directory) {
    walk(path, files, 0);
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  return files;
}

Scan scan(const std::string& path, const ReadOptions& options) {
  const std::vector<std::string> files = files_of(path);
  std::vector<std::optional<Header>> headers(files.size());
  std::vector<std::string> why(files.size());
  parallel_for(files.size(), options.threads, [&](std::size_t i) {
    headers[i] = read_header_of(files[i], options.phi);
    if (!headers[i]) {
      why[i] = "not DICOM";
    } else if (!headers[i]->is_seg && (headers[i]->rows <= 0 || headers[i]->columns <= 0)) {
      why[i] = "not an image (no Rows/Columns)";
      headers[i].reset();
    }
  });
  std::vector<Header> found;
  std::vector<std::string> skipped;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (headers[i]) {
      found.push_back(std::move(*headers[i]));
    } else {
      skipped.push_back(str(files[i], ": ", why[i]));
    }
  }
  if (found.empty()) {
    throw FormatError(str(path, ": no DICOM image or SEG among its ", files.size(), " file(s)",
                          skipped.empty() ? "" : str(" (", skipped.front(), ")")));
  }
  if (!skipped.empty()) {
    log::info("dicom: ", path, ": skipped ", skipped.size(), " file(s) that are not DICOM images (", skipped.front(),
              skipped.size() > 1 ? ", ..." : "", ")");
  }
  return group(path, found, std::move(skipped), options.phi);
}

Affine Series::affine() const {
  const auto r = row_of(orientation), c = column_of(orientation), n = normal_of(orientation);
  const double spacing = slice_spacing > 0 ? slice_spacing : (slice_thickness > 0 ? slice_thickness : 1.0);
  const std::array<double, 3> origin = slices.empty() ? std::array<double, 3>{} : slices.front().position;
  Affine a;
  for (int i = 0; i < 3; ++i) {
    const double sign = i < 2 ? -1.0 : 1.0;  // LPS -> RAS
    a(i, 0) = sign * r[i] * pixel_spacing[1];
    a(i, 1) = sign * c[i] * pixel_spacing[0];
    a(i, 2) = sign * n[i] * spacing;
    a(i, 3) = sign * origin[i];
  }
  return a;
}

std::string Series::axcodes() const { return medfast::axcodes(affine()); }

void check_geometry(Series& s, const std::string& where) {
  if (s.slices.empty()) throw FormatError(str(where, ": series ", s.series_uid, " has no slices"));
  const Slice& first = s.slices.front();
  for (const Slice& sl : s.slices) {
    if (!sl.has_position) {
      throw FormatError(str(slice_name(sl), ": ", name_of(ImagePositionPatient),
                            " is missing (required to place the slice in the volume)"));
    }
    if (!sl.has_orientation) {
      throw FormatError(str(slice_name(sl), ": ", name_of(ImageOrientationPatient), " is missing"));
    }
    if (sl.rows != first.rows || sl.columns != first.columns) {
      throw FormatError(str(slice_name(sl), ": ", name_of(Rows), " x ", name_of(Columns), " is ", sl.rows, " x ",
                            sl.columns, ", but ", slice_name(first), " in the same series is ", first.rows, " x ",
                            first.columns));
    }
    for (int i = 0; i < 6; ++i) {
      if (std::fabs(sl.orientation[i] - first.orientation[i]) > 1e-4) {
        throw FormatError(str(slice_name(sl), ": ", name_of(ImageOrientationPatient), " is ", dicom_values(sl.orientation),
                              ", but ", slice_name(first), " in the same series has ", dicom_values(first.orientation),
                              " (mixed orientations in one series)"));
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (std::fabs(sl.pixel_spacing[i] - first.pixel_spacing[i]) > 1e-4 * std::max(1.0, first.pixel_spacing[i])) {
        throw FormatError(str(slice_name(sl), ": ", name_of(PixelSpacing), " is ", dicom_values(sl.pixel_spacing), ", but ",
                              slice_name(first), " in the same series has ", dicom_values(first.pixel_spacing)));
      }
    }
  }
  if (first.rows <= 0 || first.columns <= 0) {
    throw FormatError(str(slice_name(first), ": ", name_of(Rows), " or ", name_of(Columns), " is missing"));
  }
  if (!(first.pixel_spacing[0] > 0 && first.pixel_spacing[1] > 0)) {
    throw FormatError(str(slice_name(first), ": ", name_of(PixelSpacing), " is missing or not positive (",
                          dicom_values(first.pixel_spacing), ")"));
  }
  const auto r = row_of(first.orientation), c = column_of(first.orientation);
  if (std::fabs(dot(r, r) - 1) > 1e-3 || std::fabs(dot(c, c) - 1) > 1e-3 || std::fabs(dot(r, c)) > 1e-3) {
    throw FormatError(str(slice_name(first), ": ", name_of(ImageOrientationPatient), " is ", dicom_values(first.orientation),
                          ", not two orthogonal unit vectors"));
  }
  s.rows = first.rows;
  s.columns = first.columns;
  s.orientation = first.orientation;
  s.pixel_spacing = first.pixel_spacing;
  const auto n = normal_of(s.orientation);
  for (auto& sl : s.slices) sl.along_normal = dot(sl.position, n);
  std::stable_sort(s.slices.begin(), s.slices.end(), [](const Slice& a, const Slice& b) {
    return a.along_normal < b.along_normal;
  });
  s.slice_spacing = 0;
  s.largest_deviation = 0;
  if (s.slices.size() < 2) return;
  std::vector<double> gaps;
  for (std::size_t i = 1; i < s.slices.size(); ++i) gaps.push_back(s.slices[i].along_normal - s.slices[i - 1].along_normal);
  for (std::size_t i = 0; i < gaps.size(); ++i) {
    if (gaps[i] < 1e-3) {
      throw FormatError(str(where, ": ", slice_name(s.slices[i]), " and ", slice_name(s.slices[i + 1]),
                            " are at the same position along the slice normal (", name_of(ImagePositionPatient),
                            "): two acquisitions in one series?"));
    }
  }
  std::vector<double> sorted = gaps;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  double median = sorted[sorted.size() / 2];
  if (sorted.size() % 2 == 0) {
    const double lower = *std::max_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2));
    median = 0.5 * (median + lower);
  }
  std::size_t worst = 0;
  for (std::size_t i = 0; i < gaps.size(); ++i) {
    if (gaps[i] > 1.5 * median) {
      throw FormatError(str(where, ": ", name_of(ImagePositionPatient), ": slice(s) missing between ",
                            slice_name(s.slices[i]), " and ", slice_name(s.slices[i + 1]), ": they are ", gaps[i],
                            " mm apart, the median spacing is ", median, " mm"));
    }
    if (std::fabs(gaps[i] - median) > std::fabs(gaps[worst] - median)) worst = i;
  }
  s.slice_spacing = median;
  s.largest_deviation = std::fabs(gaps[worst] - median);
  if (s.largest_deviation > std::max(0.01, 1e-3 * median)) {
    log::warn("dicom: ", where, ": uneven slice spacing: median ", median, " mm, largest deviation ",
              s.largest_deviation, " mm (between ", base_name_of(s.slices[worst].file), " and ",
              base_name_of(s.slices[worst + 1].file), "); the volume assumes the median");
  }
}

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
// SEG.
// ---------------------------------------------------------------------------

namespace {

/// The reference slice a SEG frame lies on: by its source image, else by its position.
std::size_t slice_for_frame(const Header& h, std::size_t fr, const Series& ref,
                            const std::map<std::string, std::size_t>& by_uid) {
  const std::string& source = h.frame_source[fr];
  if (!source.empty() && !ref.multi_frame) {
    const auto it = by_uid.find(source);
    if (it != by_uid.end()) return it->second;
  }
  const Slice& sl = h.slices[fr];
  if (!sl.has_position) {
    throw FormatError(str(h.file, ": frame ", fr + 1, ": neither ", name_of(DerivationImageSequence),
                          " (a ReferencedSOPInstanceUID of series ", ref.series_uid, ") nor ",
                          name_of(ImagePositionPatient), " places it on a slice"));
  }
  const auto n = normal_of(ref.orientation), r = row_of(ref.orientation), c = column_of(ref.orientation);
  const double along = dot(sl.position, n);
  const auto it = std::lower_bound(ref.slices.begin(), ref.slices.end(), along,
                                   [](const Slice& a, double v) { return a.along_normal < v; });
  std::size_t best = static_cast<std::size_t>(it - ref.slices.begin());
  if (best == ref.slices.size() ||
      (best > 0 && std::fabs(ref.slices[best - 1].along_normal - along) < std::fabs(ref.slices[best].along_normal - along))) {
    best = best == 0 ? 0 : best - 1;
  }
  const double spacing = ref.slice_spacing > 0 ? ref.slice_spacing : std::max(ref.slice_thickness, 1.0);
  const auto d = minus(sl.position, ref.slices[best].position);
  if (std::fabs(dot(d, n)) > 0.25 * spacing || std::fabs(dot(d, r)) > 0.5 * ref.pixel_spacing[1] ||
      std::fabs(dot(d, c)) > 0.5 * ref.pixel_spacing[0]) {
    throw FormatError(str(h.file, ": frame ", fr + 1, ": ", name_of(ImagePositionPatient), " ", dicom_values(sl.position),
                          " matches no slice of series ", ref.series_uid, " (nearest: ", dicom_values(ref.slices[best].position),
                          ")"));
  }
  return best;
}

/// Places a parsed SEG's frames (pixels back to back) on `ref`'s grid.
Image place_seg(const Header& h, const char* pixels, const Series& ref, const LabelDict& labels) {
  if (!h.is_seg) {
    throw FormatError(str(h.file, ": not a DICOM SEG (", name_of(Modality), " is '", h.modality, "', no ",
                          name_of(SegmentSequence), ")"));
  }
  if (h.segments.empty()) throw FormatError(str(h.file, ": ", name_of(SegmentSequence), " is empty"));
  if (!h.referenced_series.empty() &&
      std::find(h.referenced_series.begin(), h.referenced_series.end(), ref.series_uid) == h.referenced_series.end()) {
    throw FormatError(str(h.file, ": ", name_of(ReferencedSeriesSequence), " names series ", dicom_values(h.referenced_series),
                          ", not ", ref.series_uid, ", the image series it is loaded with"));
  }
  if (h.rows != ref.rows || h.columns != ref.columns) {
    throw FormatError(str(h.file, ": ", name_of(Rows), " x ", name_of(Columns), " is ", h.rows, " x ", h.columns,
                          ", the referenced series ", ref.series_uid, " is ", ref.rows, " x ", ref.columns));
  }
  if (h.bits_allocated != 1 && h.bits_allocated != 8) {
    throw FormatError(str(h.file, ": ", name_of(BitsAllocated), " is ", h.bits_allocated,
                          ", expected 1 (BINARY) or 8 (FRACTIONAL)"));
  }
  for (std::size_t fr = 0; fr < h.slices.size(); ++fr) {
    const Slice& sl = h.slices[fr];
    if (!sl.has_orientation) continue;
    for (int i = 0; i < 6; ++i) {
      if (std::fabs(sl.orientation[i] - ref.orientation[i]) > 1e-3) {
        throw FormatError(str(h.file, ": frame ", fr + 1, ": ", name_of(ImageOrientationPatient), " ",
                              dicom_values(sl.orientation), " differs from series ", ref.series_uid, "'s ",
                              dicom_values(ref.orientation)));
      }
    }
  }
  std::map<int, const Segment*> segment_by_number;
  for (const Segment& seg : h.segments) segment_by_number[seg.number] = &seg;
  std::map<std::string, std::size_t> by_uid;
  for (std::size_t z = 0; z < ref.slices.size(); ++z) by_uid[ref.slices[z].sop_instance_uid] = z;

  const std::size_t frame = static_cast<std::size_t>(h.rows) * static_cast<std::size_t>(h.columns);
  std::vector<std::size_t> z_of(h.slices.size());
  for (std::size_t fr = 0; fr < h.slices.size(); ++fr) {
    if (!segment_by_number.count(h.frame_segment[fr])) {
      throw FormatError(str(h.file, ": frame ", fr + 1, ": ", name_of(SegmentIdentificationSequence), " > ",
                            name_of(ReferencedSegmentNumber), " is ", h.frame_segment[fr],
                            ", which is not a segment of ", name_of(SegmentSequence)));
    }
    z_of[fr] = slice_for_frame(h, fr, ref, by_uid);
  }
  const bool fractional = h.segmentation_type == "FRACTIONAL";
  const double threshold = 0.5 * h.max_fractional;
  auto on = [&](std::size_t fr, std::size_t p) {
    const std::size_t bit = fr * frame + p;
    if (h.bits_allocated == 1) return ((static_cast<unsigned char>(pixels[bit >> 3]) >> (bit & 7)) & 1) != 0;
    const unsigned v = static_cast<unsigned char>(pixels[bit]);
    return fractional ? v >= threshold : v != 0;
  };

  // The order in which segments paint: label_dict's entries as listed, else by number.
  std::vector<std::pair<std::vector<int>, int>> paint;
  if (labels.empty()) {
    for (const auto& [number, seg] : segment_by_number) {
      if (number > 255) throw FormatError(str(h.file, ": ", name_of(SegmentNumber), " ", number, " does not fit uint8"));
      paint.push_back({{number}, number});
    }
  } else {
    for (const auto& [name, value] : labels) {
      if (value < 0 || value > 255) {
        throw ValueError(str("label_dict: class ", value, " for '", name, "' is outside 0..255"));
      }
      std::vector<int> numbers;
      for (const Segment& seg : h.segments) {
        if (seg.key() == name) numbers.push_back(seg.number);
      }
      if (numbers.empty()) {
        std::string keys;
        for (const Segment& seg : h.segments) keys += (keys.empty() ? "'" : ", '") + seg.key() + "'";
        log::warn("dicom: ", h.file, ": label_dict entry '", name, "' matches no segment (SegmentDescription, else ",
                  "SegmentLabel: ", keys, ")");
      }
      paint.push_back({numbers, value});
    }
  }
  Image image;
  image.shape = {ref.columns, ref.rows, static_cast<std::int64_t>(ref.slices.size())};
  image.dtype = "uint8";
  image.affine = ref.affine();
  image.storage = os::Buffer::allocate(frame * ref.slices.size());
  std::memset(image.storage.data(), 0, image.storage.size());
  auto* out = image.storage.as<std::uint8_t>();
  for (const auto& [numbers, value] : paint) {
    for (std::size_t fr = 0; fr < h.slices.size(); ++fr) {
      if (std::find(numbers.begin(), numbers.end(), h.frame_segment[fr]) == numbers.end()) continue;
      std::uint8_t* dst = out + z_of[fr] * frame;
      for (std::size_t p = 0; p < frame; ++p) {
        if (on(fr, p)) dst[p] = static_cast<std::uint8_t>(value);
      }
    }
  }
  return image;
}

}  // namespace

Series scan_seg(const std::string& file) {
  const std::optional<Header> h = read_header_of(file, false);
  if (!h) throw FormatError(str(file, ": not a DICOM file (no DICM marker after the 128-byte preamble)"));
  if (!h->is_seg) {
    throw FormatError(str(file, ": not a DICOM SEG (", name_of(Modality), " is '", h->modality, "', no ",
                          name_of(SegmentSequence), ")"));
  }
  return series_of({&*h}, false);
}

Image read_seg(const std::string& file, const Series& reference, const LabelDict& labels, const ReadOptions&) {
  const std::vector<char> bytes = read_bytes(file);
  Image image;
  with_pixels(bytes.data(), bytes.size(), file, false, [&](const Header& h, const char* pixels) {
    image = place_seg(h, pixels, reference, labels);
  });
  image.series = std::make_shared<Series>(reference);
  return image;
}

bool looks_like_dicom(const std::string& path) {
  const os::FileInfo fi = os::stat(path);
  if (fi.is_directory) return true;
  if (!fi.is_regular) return false;
  unsigned char head[132] = {0};
  const os::File f = os::File::open(path, os::File::Mode::read);
  const std::size_t n = f.read_at(head, sizeof head, 0);
  if (n >= 132 && std::memcmp(head + 128, "DICM", 4) == 0) return true;
  // A dataset without the preamble starts with a group 0x0002 or 0x0008 element.
  return n >= 8 && (head[0] == 0x02 || head[0] == 0x08) && head[1] == 0 && head[3] == 0;
}

bool is_seg_file(const std::string& path) {
  if (!os::stat(path).is_regular) return false;
  const std::optional<Header> h = read_header_of(path, false);
  return h && h->is_seg;
}

LabelDict parse_label_dict(const nlohmann::json& j) {
  LabelDict out;
  auto add = [&](const nlohmann::json& name, const nlohmann::json& value) {
    if (!name.is_string() || !value.is_number_integer() || value.get<std::int64_t>() < 0 ||
        value.get<std::int64_t>() > 255) {
      throw ValueError(str("expected segment name: class (0..255) pairs, got ", name.dump(), ": ", value.dump()));
    }
    out.emplace_back(name.get<std::string>(), value.get<int>());
  };
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) add(k, v);
    std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  } else if (j.is_array()) {
    for (const auto& pair : j) {
      if (!pair.is_array() || pair.size() != 2) throw ValueError(str("expected [name, class] pairs, got ", pair.dump()));
      add(pair[0], pair[1]);
    }
  } else if (!j.is_null()) {
    throw ValueError(str("expected a mapping such as {\"GTV-1\": 1} or a list of [name, class] pairs, got ", j.dump()));
  }
  return out;
}

void parse_for_fuzzing(const void* data, std::size_t size) {
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
