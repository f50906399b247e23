// RT Structure Sets (see include/medfast/image/dicom.hpp): each ROI's closed planar contours
// rasterised onto the grid of the series they were drawn on, combined into one uint8 label
// volume by a label_dict as SEG segments are.
//
// A voxel of a slice is inside an ROI when its centre is inside the ROI's contours on that
// slice by the even-odd rule over all of them (so an inner contour is a hole, a contour
// within a hole an island): a ray from the centre along +x crosses an odd number of the
// contours' edges, an edge from (x1, y1) to (x2, y2) counting when (y1 > y) != (y2 > y) and
// x < x1 + (y - y1) (x2 - x1) / (y2 - y1) (W. R. Franklin's point-in-polygon test; a centre
// exactly on a left or bottom edge is inside, on a right or top edge outside). Coordinates
// are the series' voxel indices: a contour point p (LPS mm) is at x = (p - o).row / column
// spacing, y = (p - o).column / row spacing, and on the slice whose position along the
// normal is within half a slice spacing of p's.
#include "medfast/image/dicom.hpp"

#include "dicom_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"

namespace medfast::dicom::detail {

namespace {

struct Contour {
  std::size_t z = 0;
  std::vector<double> x, y;  // voxel coordinates of the vertices
};

/// The slice a contour lies on; FormatError when its points leave one slice plane or it
/// lies off every slice.
std::size_t slice_of(const std::vector<double>& along, const Series& ref, const std::string& what) {
  const auto [lo, hi] = std::minmax_element(along.begin(), along.end());
  const double spacing = ref.slice_spacing > 0 ? ref.slice_spacing : std::max(ref.slice_thickness, 1.0);
  if (*hi - *lo > 0.5 * spacing) {
    throw FormatError(str(what, " is not in one slice plane: its points lie from ", *lo, " to ", *hi,
                          " mm along the slice normal (slices ", spacing, " mm apart)"));
  }
  double mid = 0;  // the points' mean position along the normal
  for (double a : along) mid += a;
  mid /= static_cast<double>(along.size());
  const auto it = std::lower_bound(ref.slices.begin(), ref.slices.end(), mid,
                                   [](const Slice& s, double v) { return s.along_normal < v; });
  std::size_t best = static_cast<std::size_t>(it - ref.slices.begin());
  if (best == ref.slices.size() ||
      (best > 0 && mid - ref.slices[best - 1].along_normal <= ref.slices[best].along_normal - mid)) {  // ties: the lower
    best = best == 0 ? 0 : best - 1;
  }
  if (std::fabs(ref.slices[best].along_normal - mid) > 0.5 * spacing) {
    throw FormatError(str(what, " lies at ", mid, " mm along the slice normal, off every slice of series ",
                          ref.series_uid, " (its slices run from ", ref.slices.front().along_normal, " to ",
                          ref.slices.back().along_normal, " mm, ", spacing, " mm apart)"));
  }
  return best;
}

/// Sets `value` where the contours (all on one slice) hold a voxel centre, by the even-odd rule.
void fill(const std::vector<const Contour*>& contours, std::int64_t columns, std::int64_t rows, std::uint8_t value,
          std::uint8_t* slice) {
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const Contour* c : contours) {
    for (double y : c->y) y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
  }
  const auto first = std::max<std::int64_t>(0, static_cast<std::int64_t>(std::ceil(y_lo)));
  const auto last = std::min<std::int64_t>(rows - 1, static_cast<std::int64_t>(std::floor(y_hi)));
  std::vector<double> xs;
  for (std::int64_t row = first; row <= last; ++row) {
    const double y = static_cast<double>(row);
    xs.clear();
    for (const Contour* c : contours) {
      const std::size_t n = c->x.size();
      for (std::size_t i = 0, j = n - 1; i < n; j = i++) {
        const double xi = c->x[i], yi = c->y[i], xj = c->x[j], yj = c->y[j];
        if ((yi > y) != (yj > y)) xs.push_back((xj - xi) * (y - yi) / (yj - yi) + xi);
      }
    }
    std::sort(xs.begin(), xs.end());
    // Inside: an odd number of crossings at or left of x, i.e. xs[2k] <= x < xs[2k+1].
    for (std::size_t k = 0; k + 1 < xs.size(); k += 2) {
      const auto from = std::max<std::int64_t>(0, static_cast<std::int64_t>(std::ceil(xs[k])));
      const auto to = std::min<std::int64_t>(columns, static_cast<std::int64_t>(std::ceil(xs[k + 1])));
      for (std::int64_t x = from; x < to; ++x) slice[row * columns + x] = value;
    }
  }
}

}  // namespace

Image place_rtstruct(const Parsed& parsed, const Header& h, const Series& ref, const LabelDict& labels) {
  const Node& ds = parsed.dataset;
  if (!h.referenced_series.empty() &&
      std::find(h.referenced_series.begin(), h.referenced_series.end(), ref.series_uid) == h.referenced_series.end()) {
    throw FormatError(str(h.file, ": ", name_of(RTReferencedSeriesSequence), " names series ",
                          dicom_values(h.referenced_series), ", but the reference image is series ", ref.series_uid));
  }
  if (ref.slices.empty() || ref.rows <= 0 || ref.columns <= 0) {
    throw FormatError(str(h.file, ": the reference series ", ref.series_uid, " has no geometry to place contours on"));
  }
  std::map<int, std::string> name_of_roi;
  for (const Segment& s : h.segments) name_of_roi[s.number] = s.label;
  const auto r = row_of(ref.orientation), c = column_of(ref.orientation), n = normal_of(ref.orientation);
  const std::array<double, 3> origin = ref.slices.front().position;

  // Only the ROIs that paint are read.
  const PaintOrder paint = paint_order(h, labels, ROINumber, "ROI", name_of(ROIName));
  std::set<int> painted;
  for (const auto& [rois, value] : paint) painted.insert(rois.begin(), rois.end());

  // Every closed planar contour, by ROI number.
  std::map<int, std::vector<Contour>> contours;
  const Items roi_contours = items(ds, ROIContourSequence);
  for (std::size_t i = 0; i < roi_contours.size(); ++i) {
    const auto number = numbers(roi_contours[i], ReferencedROINumber, h.file);
    if (number.empty() || number[0] != std::floor(number[0]) || number[0] < 0 || number[0] > 1e9) {
      throw FormatError(str(h.file, ": ", name_of(ROIContourSequence), " item ", i + 1, ": ", name_of(ReferencedROINumber),
                            " is missing or not a whole number in 0..1e9"));
    }
    const int roi = static_cast<int>(number[0]);
    if (!name_of_roi.count(roi)) {
      throw FormatError(str(h.file, ": ", name_of(ROIContourSequence), " item ", i + 1, " has contours for ROI ", roi,
                            ", which ", name_of(StructureSetROISequence), " does not list"));
    }
    if (!painted.count(roi)) continue;  // an ROI the label_dict does not ask for (a body, a couch) is not read
    const Items list = items(roi_contours[i], ContourSequence);
    std::size_t skipped = 0;
    for (std::size_t k = 0; k < list.size(); ++k) {
      const std::string what = str(h.file, ": ROI ", roi, " ('", name_of_roi[roi], "') contour ", k + 1);
      const std::string type = text(list[k], ContourGeometricType);
      if (type != "CLOSED_PLANAR") {  // POINT, OPEN_PLANAR, OPEN_NONPLANAR: no area to fill
        ++skipped;
        continue;
      }
      const auto count = numbers(list[k], NumberOfContourPoints, h.file);
      if (count.empty() || count[0] < 0 || count[0] != std::floor(count[0])) {
        throw FormatError(str(what, ": ", name_of(NumberOfContourPoints), " is missing or not a whole number"));
      }
      if (count[0] > 1e7) {
        throw FormatError(str(what, ": ", name_of(NumberOfContourPoints), " is ", count[0], ", over the 1e7 this reader takes"));
      }
      const auto points = static_cast<std::size_t>(count[0]);
      const auto data = numbers(list[k], ContourData, h.file, 3 * points + 1);
      if (data.size() != 3 * points) {
        throw FormatError(str(what, ": ", name_of(ContourData), " holds ", data.size() > 3 * points ? "more than " : "",
                              std::min(data.size(), 3 * points), " numbers, expected 3 x ", name_of(NumberOfContourPoints),
                              " ", points));
      }
      if (points < 3) {
        log::warn("dicom: ", what, " has ", points, " point(s): no area, skipped");
        continue;
      }
      Contour ct;
      std::vector<double> along(points);
      for (std::size_t p = 0; p < points; ++p) {
        const std::array<double, 3> q{data[3 * p], data[3 * p + 1], data[3 * p + 2]};
        const auto d = minus(q, origin);
        ct.x.push_back(dot(d, r) / ref.pixel_spacing[1]);
        ct.y.push_back(dot(d, c) / ref.pixel_spacing[0]);
        along[p] = dot(q, n);
        // Finite and within a billion voxels: the fill's integer conversions stay defined.
        if (!(std::fabs(ct.x.back()) < 1e9 && std::fabs(ct.y.back()) < 1e9 && std::fabs(along[p]) < 1e12)) {
          throw FormatError(str(what, ": point ", p + 1, " (", dicom_values(q), " mm) lies absurdly far from series ",
                                ref.series_uid));
        }
      }
      ct.z = slice_of(along, ref, what);
      contours[roi].push_back(std::move(ct));
    }
    if (skipped) log::info("dicom: ", h.file, ": ROI ", roi, " ('", name_of_roi[roi], "'): ", skipped,
                           " contour(s) that are not CLOSED_PLANAR (points, open lines) are not filled");
  }

  const std::size_t frame = static_cast<std::size_t>(ref.rows) * static_cast<std::size_t>(ref.columns);
  Image image = empty_labels(ref);
  auto* out = image.storage.as<std::uint8_t>();
  for (const auto& [rois, value] : paint) {
    for (int roi : rois) {
      std::map<std::size_t, std::vector<const Contour*>> by_slice;
      for (const Contour& ct : contours[roi]) by_slice[ct.z].push_back(&ct);
      for (const auto& [z, on_slice] : by_slice) {
        fill(on_slice, ref.columns, ref.rows, static_cast<std::uint8_t>(value), out + z * frame);
      }
    }
  }
  return image;
}

}  // namespace medfast::dicom::detail
