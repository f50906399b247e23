// DICOM writing for synthetic data (see include/medfast/image/dicom_write.hpp): datasets
// built with GDCM, serialised by gdcm::Writer into memory, written through the OS layer.
#include "medfast/image/dicom_write.hpp"

#if MEDFAST_HAVE_GDCM
#include <gdcmDataSet.h>
#include <gdcmFile.h>
#include <gdcmItem.h>
#include <gdcmSequenceOfItems.h>
#include <gdcmTrace.h>
#include <gdcmWriter.h>
#endif
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"

namespace medfast::dicom {

#if MEDFAST_HAVE_GDCM
namespace {

constexpr const char* kCtImageStorage = "1.2.840.10008.5.1.4.1.1.2";
constexpr const char* kSegStorage = "1.2.840.10008.5.1.4.1.1.66.4";
constexpr const char* kRtStructStorage = "1.2.840.10008.5.1.4.1.1.481.3";

void put(gdcm::DataSet& ds, std::uint16_t g, std::uint16_t e, gdcm::VR vr, std::string value) {
  if (value.size() % 2) value += vr == gdcm::VR::UI ? '\0' : ' ';
  gdcm::DataElement de(gdcm::Tag(g, e));
  de.SetVR(vr);
  de.SetByteValue(value.data(), static_cast<std::uint32_t>(value.size()));
  ds.Replace(de);
}

void put_us(gdcm::DataSet& ds, std::uint16_t g, std::uint16_t e, std::uint16_t v) {
  const char bytes[2] = {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  gdcm::DataElement de(gdcm::Tag(g, e));
  de.SetVR(gdcm::VR::US);
  de.SetByteValue(bytes, 2);
  ds.Replace(de);
}

void put_bytes(gdcm::DataSet& ds, std::uint16_t g, std::uint16_t e, gdcm::VR vr, const void* data, std::size_t n) {
  gdcm::DataElement de(gdcm::Tag(g, e));
  de.SetVR(vr);
  de.SetByteValue(static_cast<const char*>(data), static_cast<std::uint32_t>(n));
  ds.Replace(de);
}

void put_sequence(gdcm::DataSet& ds, std::uint16_t g, std::uint16_t e, const std::vector<gdcm::DataSet>& items) {
  gdcm::SmartPointer<gdcm::SequenceOfItems> sq = new gdcm::SequenceOfItems;
  sq->SetLengthToUndefined();
  for (const gdcm::DataSet& nested : items) {
    gdcm::Item item;
    item.SetVLToUndefined();
    item.SetNestedDataSet(nested);
    sq->AddItem(item);
  }
  gdcm::DataElement de(gdcm::Tag(g, e));
  de.SetVR(gdcm::VR::SQ);
  de.SetValue(*sq);
  de.SetVLToUndefined();
  ds.Replace(de);
}

std::string decimal(double v) {
  std::ostringstream o;
  o.precision(10);
  o << v;
  std::string s = o.str();
  return s.size() > 16 ? s.substr(0, 16) : s;  // DS holds at most 16 characters
}

/// The Image Pixel module of one grayscale sample per pixel, all `bits` stored.
void put_pixel_module(gdcm::DataSet& ds, std::int64_t nx, std::int64_t ny, std::uint16_t bits, bool is_signed) {
  put_us(ds, 0x0028, 0x0002, 1);
  put(ds, 0x0028, 0x0004, gdcm::VR::CS, "MONOCHROME2");
  put_us(ds, 0x0028, 0x0010, static_cast<std::uint16_t>(ny));
  put_us(ds, 0x0028, 0x0011, static_cast<std::uint16_t>(nx));
  put_us(ds, 0x0028, 0x0100, bits);
  put_us(ds, 0x0028, 0x0101, bits);
  put_us(ds, 0x0028, 0x0102, static_cast<std::uint16_t>(bits - 1));
  put_us(ds, 0x0028, 0x0103, is_signed ? 1 : 0);
}

std::string ds_list(std::initializer_list<double> values) {
  std::string s;
  for (double v : values) s += (s.empty() ? "" : "\\") + decimal(v);
  return s;
}

/// Serialises `ds` (explicit VR little endian, file meta filled by GDCM) and writes it atomically.
void write_dataset(const std::string& path, const gdcm::DataSet& ds) {
  gdcm::Trace::SetWarning(false);
  gdcm::Writer writer;
  std::ostringstream out;
  writer.SetStream(out);
  gdcm::File& f = writer.GetFile();
  f.SetDataSet(ds);
  f.GetHeader().SetDataSetTransferSyntax(gdcm::TransferSyntax::ExplicitVRLittleEndian);
  if (!writer.Write()) throw FormatError(str(path, ": GDCM could not serialise the dataset"));
  const std::string bytes = out.str();
  os::AtomicWriter w(path);
  w.append(bytes.data(), bytes.size());
  w.commit();
}

/// Geometry of the CT in DICOM terms (LPS): row/column directions, spacings, positions.
struct Geometry {
  std::array<double, 6> orientation{};
  double dx = 1, dy = 1;
  std::vector<std::array<double, 3>> positions;
};

Geometry geometry_of(const CtToWrite& ct) {
  Geometry g;
  std::array<std::array<double, 3>, 3> col{};
  std::array<double, 3> len{};
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 3; ++i) col[j][i] = (i < 2 ? -1.0 : 1.0) * ct.affine(i, j);  // RAS -> LPS
    len[j] = std::sqrt(col[j][0] * col[j][0] + col[j][1] * col[j][1] + col[j][2] * col[j][2]);
    if (!(len[j] > 0)) throw ValueError(str("write_ct_series: affine column ", j, " is zero"));
  }
  g.dx = len[0];
  g.dy = len[1];
  g.orientation = {col[0][0] / len[0], col[0][1] / len[0], col[0][2] / len[0],
                   col[1][0] / len[1], col[1][1] / len[1], col[1][2] / len[1]};
  for (std::int64_t z = 0; z < ct.shape[2]; ++z) {
    std::array<double, 3> p{};
    for (int i = 0; i < 3; ++i) p[i] = (i < 2 ? -1.0 : 1.0) * ct.affine(i, 3) + col[2][i] * static_cast<double>(z);
    g.positions.push_back(p);
  }
  return g;
}

void put_common(gdcm::DataSet& ds, const CtToWrite& ct, const std::string& modality, const std::string& sop_class,
                const std::string& sop_uid, const std::string& series_uid, int series_number) {
  put(ds, 0x0008, 0x0016, gdcm::VR::UI, sop_class);
  put(ds, 0x0008, 0x0018, gdcm::VR::UI, sop_uid);
  put(ds, 0x0008, 0x0060, gdcm::VR::CS, modality);
  put(ds, 0x0008, 0x103e, gdcm::VR::LO, modality == "CT" ? ct.description : "medfast synthetic GTV");
  put(ds, 0x0010, 0x0010, gdcm::VR::PN, "SYNTHETIC^" + ct.patient_id);
  put(ds, 0x0010, 0x0020, gdcm::VR::LO, ct.patient_id);
  put(ds, 0x0020, 0x000d, gdcm::VR::UI, ct.study_uid);
  put(ds, 0x0020, 0x000e, gdcm::VR::UI, series_uid);
  put(ds, 0x0020, 0x0011, gdcm::VR::IS, std::to_string(series_number));
  put(ds, 0x0020, 0x0052, gdcm::VR::UI, ct.frame_of_reference_uid);
}

/// A reference to one CT image (ReferencedSOPClassUID, ReferencedSOPInstanceUID).
gdcm::DataSet image_reference(const std::string& sop_uid) {
  gdcm::DataSet ref;
  put(ref, 0x0008, 0x1150, gdcm::VR::UI, kCtImageStorage);
  put(ref, 0x0008, 0x1155, gdcm::VR::UI, sop_uid);
  return ref;
}

std::vector<gdcm::DataSet> image_references(const std::vector<std::string>& sop_uids) {
  std::vector<gdcm::DataSet> refs;
  for (const std::string& uid : sop_uids) refs.push_back(image_reference(uid));
  return refs;
}

}  // namespace
#endif

std::string make_uid(const std::string& parts) {
  const XXH128_hash_t h = XXH3_128bits(parts.data(), parts.size());
  // 2.25.<a 128-bit integer in decimal>: the digits of the two 64-bit halves, 39 at most.
  unsigned __int128 v = (static_cast<unsigned __int128>(h.high64) << 64) | h.low64;
  std::string digits;
  do {
    digits += static_cast<char>('0' + static_cast<int>(v % 10));
    v /= 10;
  } while (v != 0);
  std::reverse(digits.begin(), digits.end());
  return "2.25." + digits;
}

#if MEDFAST_HAVE_GDCM
std::vector<std::string> write_ct_series(const std::string& dir, const CtToWrite& ct) {
  if (!ct.hu) throw ValueError("write_ct_series: no voxels");
  const Geometry g = geometry_of(ct);
  os::make_directories(dir);
  const auto nx = ct.shape[0], ny = ct.shape[1], nz = ct.shape[2];
  if (nx < 1 || ny < 1 || nz < 1 || nx > 65535 || ny > 65535) throw ValueError("write_ct_series: bad shape");
  std::vector<std::string> uids;
  for (std::int64_t z = 0; z < nz; ++z) uids.push_back(make_uid(str(ct.series_uid, "/slice/", z)));
  // File names in an order unrelated to position (as PACS exports name them).
  std::vector<std::int64_t> order(static_cast<std::size_t>(nz));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return uids[a] < uids[b]; });
  std::vector<std::int16_t> stored(static_cast<std::size_t>(nx * ny));
  for (std::size_t n = 0; n < order.size(); ++n) {
    const std::int64_t z = order[n];
    gdcm::DataSet ds;
    put_common(ds, ct, "CT", kCtImageStorage, uids[z], ct.series_uid, 1);
    put(ds, 0x0020, 0x0013, gdcm::VR::IS, std::to_string(n + 1));  // InstanceNumber: file order, not position
    const auto& p = g.positions[static_cast<std::size_t>(z)];
    put(ds, 0x0020, 0x0032, gdcm::VR::DS, ds_list({p[0], p[1], p[2]}));
    const auto& o = g.orientation;
    put(ds, 0x0020, 0x0037, gdcm::VR::DS, ds_list({o[0], o[1], o[2], o[3], o[4], o[5]}));
    put(ds, 0x0018, 0x0050, gdcm::VR::DS, decimal(std::sqrt(ct.affine(0, 2) * ct.affine(0, 2) +
                                                             ct.affine(1, 2) * ct.affine(1, 2) +
                                                             ct.affine(2, 2) * ct.affine(2, 2))));
    put(ds, 0x0028, 0x0030, gdcm::VR::DS, ds_list({g.dy, g.dx}));  // between rows, between columns
    put_pixel_module(ds, nx, ny, 16, /*is_signed=*/true);
    put(ds, 0x0028, 0x1052, gdcm::VR::DS, std::to_string(ct.intercept));
    put(ds, 0x0028, 0x1053, gdcm::VR::DS, "1");
    const std::int16_t* slice = ct.hu + z * nx * ny;
    for (std::size_t i = 0; i < stored.size(); ++i) {
      const int v = slice[i] - ct.intercept;
      stored[i] = static_cast<std::int16_t>(std::clamp(v, -32768, 32767));
    }
    put_bytes(ds, 0x7fe0, 0x0010, gdcm::VR::OW, stored.data(), stored.size() * 2);
    write_dataset(str(dir, "/", uids[z].substr(uids[z].size() - 12), ".dcm"), ds);
  }
  return uids;
}

void write_seg(const std::string& file, const CtToWrite& ct, const std::vector<std::string>& ct_sop_uids,
               const std::uint8_t* label, const std::string& segment_label) {
  const Geometry g = geometry_of(ct);
  const auto nx = ct.shape[0], ny = ct.shape[1], nz = ct.shape[2];
  const std::size_t frame = static_cast<std::size_t>(nx * ny);
  std::vector<std::int64_t> frames;
  for (std::int64_t z = 0; z < nz; ++z) {
    const std::uint8_t* s = label + static_cast<std::size_t>(z) * frame;
    if (std::any_of(s, s + frame, [](std::uint8_t v) { return v != 0; })) frames.push_back(z);
  }
  if (frames.empty()) frames.push_back(0);  // a SEG holds at least one frame
  const std::string seg_series = make_uid(ct.series_uid + "/seg-series");
  gdcm::DataSet ds;
  put_common(ds, ct, "SEG", kSegStorage, make_uid(ct.series_uid + "/seg"), seg_series, 100);
  put(ds, 0x0020, 0x0013, gdcm::VR::IS, "1");
  put(ds, 0x0028, 0x0008, gdcm::VR::IS, std::to_string(frames.size()));
  put_pixel_module(ds, nx, ny, 1, /*is_signed=*/false);
  put(ds, 0x0062, 0x0001, gdcm::VR::CS, "BINARY");
  {
    gdcm::DataSet seg;
    put_us(seg, 0x0062, 0x0004, 1);
    put(seg, 0x0062, 0x0005, gdcm::VR::LO, segment_label);
    put(seg, 0x0062, 0x0008, gdcm::VR::CS, "MANUAL");
    put_sequence(ds, 0x0062, 0x0002, {seg});
  }
  {
    gdcm::DataSet series;
    put_sequence(series, 0x0008, 0x114a, image_references(ct_sop_uids));
    put(series, 0x0020, 0x000e, gdcm::VR::UI, ct.series_uid);
    put_sequence(ds, 0x0008, 0x1115, {series});
  }
  {
    gdcm::DataSet orient, measures, shared;
    const auto& o = g.orientation;
    put(orient, 0x0020, 0x0037, gdcm::VR::DS, ds_list({o[0], o[1], o[2], o[3], o[4], o[5]}));
    put(measures, 0x0028, 0x0030, gdcm::VR::DS, ds_list({g.dy, g.dx}));
    put_sequence(shared, 0x0020, 0x9116, {orient});
    put_sequence(shared, 0x0028, 0x9110, {measures});
    put_sequence(ds, 0x5200, 0x9229, {shared});
  }
  std::vector<gdcm::DataSet> per_frame;
  for (const std::int64_t z : frames) {
    gdcm::DataSet fg, position, derivation, seg_id;
    const auto& p = g.positions[static_cast<std::size_t>(z)];
    put(position, 0x0020, 0x0032, gdcm::VR::DS, ds_list({p[0], p[1], p[2]}));
    put_sequence(fg, 0x0020, 0x9113, {position});
    put_sequence(derivation, 0x0008, 0x2112, {image_reference(ct_sop_uids.at(static_cast<std::size_t>(z)))});
    put_sequence(fg, 0x0008, 0x9124, {derivation});
    put_us(seg_id, 0x0062, 0x000b, 1);
    put_sequence(fg, 0x0062, 0x000a, {seg_id});
    per_frame.push_back(fg);
  }
  put_sequence(ds, 0x5200, 0x9230, per_frame);
  // Bits packed across frames, least significant bit first, padded to an even length.
  std::vector<std::uint8_t> bits((frames.size() * frame + 7) / 8 + 1, 0);
  bits.resize(bits.size() - (bits.size() % 2));
  if (bits.size() * 8 < frames.size() * frame) bits.resize(bits.size() + 2, 0);
  for (std::size_t f = 0; f < frames.size(); ++f) {
    const std::uint8_t* s = label + static_cast<std::size_t>(frames[f]) * frame;
    for (std::size_t i = 0; i < frame; ++i) {
      if (s[i]) {
        const std::size_t bit = f * frame + i;
        bits[bit >> 3] = static_cast<std::uint8_t>(bits[bit >> 3] | (1u << (bit & 7)));
      }
    }
  }
  put_bytes(ds, 0x7fe0, 0x0010, gdcm::VR::OB, bits.data(), bits.size());
  write_dataset(file, ds);
}

void write_rtstruct(const std::string& file, const CtToWrite& ct, const std::vector<std::string>& ct_sop_uids,
                    const std::uint8_t* label, const std::string& roi_name) {
  const Geometry g = geometry_of(ct);
  const auto nx = ct.shape[0], ny = ct.shape[1], nz = ct.shape[2];
  const std::size_t frame = static_cast<std::size_t>(nx * ny);
  gdcm::DataSet ds;
  put_common(ds, ct, "RTSTRUCT", kRtStructStorage, make_uid(ct.series_uid + "/rtstruct"),
             make_uid(ct.series_uid + "/rtstruct-series"), 200);
  put(ds, 0x0020, 0x0013, gdcm::VR::IS, "1");
  put(ds, 0x3006, 0x0002, gdcm::VR::SH, "GTV");       // StructureSetLabel
  put(ds, 0x3006, 0x0008, gdcm::VR::DA, "20240101");  // StructureSetDate
  {
    gdcm::DataSet series, study, frame_of_reference;
    put(series, 0x0020, 0x000e, gdcm::VR::UI, ct.series_uid);
    put_sequence(series, 0x3006, 0x0016, image_references(ct_sop_uids));  // ContourImageSequence
    put(study, 0x0008, 0x1150, gdcm::VR::UI, "1.2.840.10008.3.1.2.3.1");  // Detached Study Management
    put(study, 0x0008, 0x1155, gdcm::VR::UI, ct.study_uid);
    put_sequence(study, 0x3006, 0x0014, {series});  // RTReferencedSeriesSequence
    put(frame_of_reference, 0x0020, 0x0052, gdcm::VR::UI, ct.frame_of_reference_uid);
    put_sequence(frame_of_reference, 0x3006, 0x0012, {study});  // RTReferencedStudySequence
    put_sequence(ds, 0x3006, 0x0010, {frame_of_reference});    // ReferencedFrameOfReferenceSequence
  }
  {
    gdcm::DataSet roi;
    put(roi, 0x3006, 0x0022, gdcm::VR::IS, "1");  // ROINumber
    put(roi, 0x3006, 0x0024, gdcm::VR::UI, ct.frame_of_reference_uid);
    put(roi, 0x3006, 0x0026, gdcm::VR::LO, roi_name);
    put(roi, 0x3006, 0x0036, gdcm::VR::CS, "MANUAL");  // ROIGenerationAlgorithm
    put_sequence(ds, 0x3006, 0x0020, {roi});          // StructureSetROISequence
  }
  // One closed contour per run of label voxels along a row: the rectangle of the run's
  // voxel squares (corners half a voxel from the centres), so that the contours fill back
  // to the label exactly by the even-odd rule (no centre lies on an edge; runs share
  // edges at most).
  std::vector<gdcm::DataSet> contours;
  const auto& o = g.orientation;
  for (std::int64_t z = 0; z < nz; ++z) {
    const std::uint8_t* s = label + static_cast<std::size_t>(z) * frame;
    const auto& p = g.positions[static_cast<std::size_t>(z)];
    auto corner = [&](double x, double y) {
      std::string out;
      for (int i = 0; i < 3; ++i) {
        const double v = p[i] + x * g.dx * o[i] + y * g.dy * o[3 + i];
        out += (i ? "\\" : "") + decimal(v);
      }
      return out;
    };
    for (std::int64_t y = 0; y < ny; ++y) {
      for (std::int64_t x = 0; x < nx;) {
        if (!s[y * nx + x]) {
          ++x;
          continue;
        }
        std::int64_t end = x;
        while (end < nx && s[y * nx + end]) ++end;
        const double x0 = static_cast<double>(x) - 0.5, x1 = static_cast<double>(end) - 0.5;
        const double y0 = static_cast<double>(y) - 0.5, y1 = static_cast<double>(y) + 0.5;
        gdcm::DataSet c;
        put_sequence(c, 0x3006, 0x0016, {image_reference(ct_sop_uids.at(static_cast<std::size_t>(z)))});
        put(c, 0x3006, 0x0042, gdcm::VR::CS, "CLOSED_PLANAR");
        put(c, 0x3006, 0x0046, gdcm::VR::IS, "4");
        put(c, 0x3006, 0x0050, gdcm::VR::DS,
            corner(x0, y0) + "\\" + corner(x1, y0) + "\\" + corner(x1, y1) + "\\" + corner(x0, y1));
        contours.push_back(c);
        x = end;
      }
    }
  }
  {
    gdcm::DataSet roi_contour;
    put(roi_contour, 0x3006, 0x002a, gdcm::VR::IS, "255\\0\\0");  // ROIDisplayColor
    put_sequence(roi_contour, 0x3006, 0x0040, contours);            // ContourSequence
    put(roi_contour, 0x3006, 0x0084, gdcm::VR::IS, "1");             // ReferencedROINumber
    put_sequence(ds, 0x3006, 0x0039, {roi_contour});                 // ROIContourSequence
  }
  write_dataset(file, ds);
}

#else
namespace {
[[noreturn]] void no_gdcm(const std::string& path) {
  throw Error(str(path, ": writing DICOM needs GDCM, and this medfast was built without it (cmake "
                  "-DMEDFAST_WITH_GDCM=ON, with libgdcm-dev installed); --format nifti needs nothing more"));
}
}  // namespace

std::vector<std::string> write_ct_series(const std::string& dir, const CtToWrite&) { no_gdcm(dir); }
void write_seg(const std::string& file, const CtToWrite&, const std::vector<std::string>&, const std::uint8_t*,
               const std::string&) {
  no_gdcm(file);
}
void write_rtstruct(const std::string& file, const CtToWrite&, const std::vector<std::string>&, const std::uint8_t*,
                    const std::string&) {
  no_gdcm(file);
}
#endif

}  // namespace medfast::dicom
