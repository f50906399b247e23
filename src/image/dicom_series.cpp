// DICOM series (see include/medfast/image/dicom.hpp): the files of a folder, their headers
// grouped into series with slices sorted along the normal (scan, files_of), a series'
// affine, the geometry checks a series must pass before it is read (check_geometry), and
// whether a path looks like DICOM at all.
#include "medfast/image/dicom.hpp"

#include "dicom_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/parallel.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom {

using namespace detail;

namespace {

std::string base_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
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

std::string slice_name(const Slice& s) { return s.frame > 0 || s.file.empty() ? str(s.file, " frame ", s.frame + 1) : s.file; }

}  // namespace

namespace detail {

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
  s.is_rtstruct = first.is_rtstruct;
  s.segments = first.segments;
  s.referenced_series = first.referenced_series;
  s.slice_thickness = first.slice_thickness;
  s.dose_units = first.dose_units;
  if (phi) s.phi = first.phi;
  for (const Header* h : members) {
    s.files.push_back(h->file);
    s.pixel_bytes.push_back(h->pixel_bytes);
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

}  // namespace detail

namespace {

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
  std::vector<char> unreadable(files.size(), 0);  // DICOM in a transfer syntax medfast does not read
  parallel_for(files.size(), options.threads, [&](std::size_t i) {
    headers[i] = read_header_of(files[i], options.phi);
    std::string unsupported;
    if (!headers[i]) {
      why[i] = "not DICOM";
    } else if (classify(headers[i]->transfer_syntax, &unsupported) == Syntax::unsupported && headers[i]->rows <= 0) {
      // A dataset medfast does not parse at all (big endian, deflated): say so, rather
      // than call it "not an image".
      why[i] = str(name_of(TransferSyntaxUID), " ", headers[i]->transfer_syntax, ": ", unsupported);
      unreadable[i] = 1;
      headers[i].reset();
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
    const auto first_unreadable = std::find(unreadable.begin(), unreadable.end(), 1);
    if (first_unreadable != unreadable.end()) {
      const auto i = static_cast<std::size_t>(first_unreadable - unreadable.begin());
      throw FormatError(str(files[i], ": ", why[i], files.size() > 1 ? str(" (and no other file of ", path,
                                                                              " is a DICOM image or SEG)") : ""));
    }
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

}  // namespace medfast::dicom
