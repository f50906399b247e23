#pragma once
/// \file
/// What the DICOM reader's sources share (private to src/image/, not installed): the
/// tags it reads, a parsed dataset (elements pointing into a file's bytes), transfer
/// syntaxes, one file's header, the slice geometry helpers and the error guard. The
/// parser and header reading live in dicom_parse.cpp, series assembly and geometry in
/// dicom_series.cpp, pixel decoding and read_series/read_seg in dicom.cpp, SEG placement
/// in dicom_seg.cpp.

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/image/dicom.hpp"

namespace medfast::dicom::detail {

/// A file's bytes: all of them, or its first `limit` bytes (dicom_parse.cpp).
std::vector<char> read_bytes(const std::string& path, std::size_t limit = std::numeric_limits<std::size_t>::max());

// ---------------------------------------------------------------------------
// Tags: names for messages, and typed access.
// ---------------------------------------------------------------------------

struct TagName {
  std::uint16_t group, element;
  const char* keyword;
};

#define MEDFAST_TAG(name, g, e) inline constexpr TagName name{g, e, #name};
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
// RT Structure Set: closed planar contours per ROI, on a referenced series.
MEDFAST_TAG(ReferencedFrameOfReferenceSequence, 0x3006, 0x0010)
MEDFAST_TAG(RTReferencedStudySequence, 0x3006, 0x0012)
MEDFAST_TAG(RTReferencedSeriesSequence, 0x3006, 0x0014)
MEDFAST_TAG(StructureSetROISequence, 0x3006, 0x0020)
MEDFAST_TAG(ROINumber, 0x3006, 0x0022)
MEDFAST_TAG(ROIName, 0x3006, 0x0026)
MEDFAST_TAG(ROIContourSequence, 0x3006, 0x0039)
MEDFAST_TAG(ContourSequence, 0x3006, 0x0040)
MEDFAST_TAG(ContourGeometricType, 0x3006, 0x0042)
MEDFAST_TAG(NumberOfContourPoints, 0x3006, 0x0046)
MEDFAST_TAG(ContourData, 0x3006, 0x0050)
MEDFAST_TAG(ReferencedROINumber, 0x3006, 0x0084)
// RT Dose: frames placed by offsets along the normal, stored values scaled to the dose unit.
MEDFAST_TAG(DoseUnits, 0x3004, 0x0002)
MEDFAST_TAG(GridFrameOffsetVector, 0x3004, 0x000c)
MEDFAST_TAG(DoseGridScaling, 0x3004, 0x000e)
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

/// "Keyword (GGGG,EEEE)", for messages (dicom_parse.cpp).
std::string name_of(const TagName& t);

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

inline std::uint32_t tag_of(const TagName& t) { return (static_cast<std::uint32_t>(t.group) << 16) | t.element; }

// Typed values of a dataset's elements (dicom_parse.cpp).

/// A text value (trimmed), at most `limit` characters of it; "" when absent.
std::string text(const Node& ds, const TagName& t, std::size_t limit = 1 << 16);
/// A DS/IS value list ("0.7\\0.7") of at most `max_count` values (the rest are not read);
/// FormatError naming the file and tag when not numbers.
std::vector<double> numbers(const Node& ds, const TagName& t, const std::string& file, std::size_t max_count = 64);
/// An unsigned short (US), little endian; -1 when absent.
int ushort_value(const Node& ds, const TagName& t);

/// A sequence's items (empty when absent).
struct Items {
  const std::vector<Node>* v = nullptr;
  std::size_t size() const { return v ? v->size() : 0; }
  const Node& operator[](std::size_t i) const { return (*v)[i]; }
};
Items items(const Node& ds, const TagName& t);

// ---------------------------------------------------------------------------
// Transfer syntaxes.
// ---------------------------------------------------------------------------

enum class Syntax { native, compressed, unsupported };

/// Whether medfast reads `uid` natively, decodes it, or refuses it (then `why` says why).
Syntax classify(const std::string& uid, std::string* why);

// ---------------------------------------------------------------------------
// Parsing. medfast walks every element, item and sequence itself, within the file's
// bounds (GDCM 3.0.21's parser asserts, and so aborts, on some malformed files, and
// allocates what a damaged length claims); GDCM does not read files at all.
// ---------------------------------------------------------------------------

struct Parsed {
  std::string transfer_syntax;  ///< from the file meta ("" without meta)
  Node dataset;
  bool reached_pixels = false;  ///< the pixel data element was found
  /// header_only: where the pixel data's value starts (0: not reached, or its element
  /// header is cut off) and the length it declares (0xffffffff: encapsulated).
  std::size_t pixel_value = 0, pixel_length = 0;
};

/// Walks a whole file's elements (to the pixel data when `header_only`); FormatError
/// naming the file and the byte where it is not sound (dicom_parse.cpp).
Parsed parse_bytes(const char* data, std::size_t size, const std::string& file, bool header_only);

// ---------------------------------------------------------------------------
// One file's header.
// ---------------------------------------------------------------------------

/// What a file's header says; one Slice per frame (positions may be missing: checked later).
struct Header {
  std::string file, transfer_syntax, sop_class, sop_instance, modality, series_uid, study_uid, description;
  int rows = -1, columns = -1, frames = 1;
  int bits_allocated = -1, bits_stored = -1, pixel_representation = 0, samples = 1;
  double slice_thickness = 0;
  std::string dose_units;  ///< RTDOSE only
  bool multi_frame = false, is_seg = false;
  bool is_rtstruct = false;  ///< an RT Structure Set (is_seg too: a label object); segments are its ROIs
  std::vector<Slice> slices;
  /// Bytes the pixel data holds (read_header_of: its declared length within the file);
  /// kUnknownPixelBytes where it was not read.
  std::uint64_t pixel_bytes = kUnknownPixelBytes;
  // SEG: per frame, the segment and the source image (SOP instance) it was derived from.
  std::vector<int> frame_segment;
  std::vector<std::string> frame_source;
  std::string segmentation_type;
  double max_fractional = 0;
  std::vector<Segment> segments;
  std::vector<std::string> referenced_series;
  std::map<std::string, std::string> phi;
};

/// Parses the header dataset (everything before the pixel data).
Header parse_header(const Parsed& parsed, const std::string& file, bool phi);

/// A file's header, reading as little of it as the header needs; nullopt when the file is
/// not DICOM at all. Errors of any kind become FormatErrors naming the file.
std::optional<Header> read_header_of(const std::string& file, bool phi);

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

// ---------------------------------------------------------------------------
// Slice geometry.
// ---------------------------------------------------------------------------

inline double dot(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}
inline std::array<double, 3> row_of(const std::array<double, 6>& o) { return {o[0], o[1], o[2]}; }
inline std::array<double, 3> column_of(const std::array<double, 6>& o) { return {o[3], o[4], o[5]}; }
inline std::array<double, 3> normal_of(const std::array<double, 6>& o) {
  return {o[1] * o[5] - o[2] * o[4], o[2] * o[3] - o[0] * o[5], o[0] * o[4] - o[1] * o[3]};
}
inline std::array<double, 3> minus(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return {a[0] - b[0], a[1] - b[1], a[2] - b[2]};
}

template <typename A>
std::string dicom_values(const A& values) {
  std::ostringstream o;
  for (std::size_t i = 0; i < values.size(); ++i) o << (i ? "\\" : "") << values[i];
  return o.str();
}

/// One series from its files' headers, slices sorted along the first slice's normal
/// (dicom_series.cpp).
Series series_of(const std::vector<const Header*>& members, bool phi);

/// A uint8 label volume of zeros on `ref`'s grid, with its affine (dicom_seg.cpp).
Image empty_labels(const Series& ref);

/// Which segments paint which class, in painting order (a later entry wins where they
/// overlap): label_dict's entries as listed, each matching the segments whose key() is its
/// name (a SEG's SegmentDescription, else SegmentLabel; an RTSTRUCT's ROIName), else every
/// segment number as its own class, ascending. An entry that matches nothing is a warning
/// naming the keys there are (`what`: "segment", "ROI"; `keys_are`: what the keys are
/// read from); a class outside 0..255 is a ValueError, a number over 255 (no label_dict)
/// a FormatError naming `number_tag` (dicom_seg.cpp).
using PaintOrder = std::vector<std::pair<std::vector<int>, int>>;
PaintOrder paint_order(const Header& h, const LabelDict& labels, const TagName& number_tag, const std::string& what,
                       const std::string& keys_are);

/// Places a parsed SEG's frames (pixels back to back) on `ref`'s grid (dicom_seg.cpp).
Image place_seg(const Header& h, const char* pixels, const Series& ref, const LabelDict& labels);

/// Rasterises a parsed RT Structure Set's closed planar contours onto `ref`'s grid
/// (dicom_rtstruct.cpp).
Image place_rtstruct(const Parsed& parsed, const Header& h, const Series& ref, const LabelDict& labels);

}  // namespace medfast::dicom::detail
