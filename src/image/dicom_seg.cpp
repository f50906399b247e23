// DICOM Segmentation objects (see include/medfast/image/dicom.hpp): a SEG's frames placed
// on the slices of the image series it references and painted into one uint8 label volume
// by a label_dict, a SEG's header (scan_seg, is_seg_file), and label_dict parsing. Its
// pixels are decoded by dicom.cpp (read_seg).
#include "medfast/image/dicom.hpp"

#include "dicom_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom {

using namespace detail;

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

}  // namespace

namespace detail {

Image empty_labels(const Series& ref) {
  Image image;
  image.shape = {ref.columns, ref.rows, static_cast<std::int64_t>(ref.slices.size())};
  image.dtype = "uint8";
  image.affine = ref.affine();
  image.storage = os::Buffer::allocate(static_cast<std::size_t>(ref.rows) * static_cast<std::size_t>(ref.columns) *
                                       ref.slices.size());
  std::memset(image.storage.data(), 0, image.storage.size());
  return image;
}

PaintOrder paint_order(const Header& h, const LabelDict& labels, const TagName& number_tag, const std::string& what,
                       const std::string& keys_are) {
  PaintOrder paint;
  if (labels.empty()) {
    std::map<int, bool> numbers;  // ascending, once each
    for (const Segment& seg : h.segments) numbers[seg.number] = true;
    for (const auto& [number, unused] : numbers) {
      if (number > 255) throw FormatError(str(h.file, ": ", name_of(number_tag), " ", number, " does not fit uint8"));
      paint.push_back({{number}, number});
    }
    return paint;
  }
  std::string present;  // the segments' names, for the messages
  for (const Segment& seg : h.segments) present += (present.empty() ? "'" : ", '") + seg.key() + "'";
  std::string unmatched;
  for (const auto& [name, value] : labels) {
    if (value < 0 || value > 255) throw ValueError(str("label_dict: class ", value, " for '", name, "' is outside 0..255"));
    std::vector<int> numbers;
    for (const Segment& seg : h.segments) {
      if (seg.key() == name) numbers.push_back(seg.number);
    }
    if (numbers.empty()) unmatched += (unmatched.empty() ? "'" : ", '") + name + "'";
    paint.push_back({numbers, value});
  }
  const bool any = std::any_of(paint.begin(), paint.end(), [](const auto& p) { return !p.first.empty(); });
  if (!any) {  // an all-background label volume, written or trained on as if it were one
    throw ValueError(str(h.file, ": label_dict matches no ", what, " (", unmatched, "); the ", what, "s present (",
                         keys_are, "): ", present));
  }
  if (!unmatched.empty()) {
    log::warn("dicom: ", h.file, ": label_dict entries ", unmatched, " match no ", what, " (", keys_are, ": ", present, ")");
  }
  return paint;
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

  const PaintOrder paint = paint_order(h, labels, SegmentNumber, "segment", "SegmentDescription, else SegmentLabel");
  Image image = empty_labels(ref);
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

}  // namespace detail

Series scan_seg(const std::string& file) {
  const std::optional<Header> h = read_header_of(file, false);
  if (!h) throw FormatError(str(file, ": not a DICOM file (no DICM marker after the 128-byte preamble)"));
  if (!h->is_seg) {
    throw FormatError(str(file, ": not a DICOM SEG (", name_of(Modality), " is '", h->modality, "', no ",
                          name_of(SegmentSequence), ")"));
  }
  return series_of({&*h}, false);
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

}  // namespace medfast::dicom
