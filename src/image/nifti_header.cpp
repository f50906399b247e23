#include "medfast/image/nifti_header.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"

namespace medfast::nifti {

namespace {

template <typename T>
T byteswap(T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
  std::memcpy(&v, b, sizeof(T));
  return v;
}

// Reads fixed-offset fields from a header buffer in its byte order.
struct FieldReader {
  const std::uint8_t* p;
  bool swap;
  template <typename T>
  T get(std::size_t offset) const {
    T v;
    std::memcpy(&v, p + offset, sizeof(T));
    return swap ? byteswap(v) : v;
  }
  std::string text(std::size_t offset, std::size_t size) const {
    const char* s = reinterpret_cast<const char*>(p + offset);
    return std::string(s, strnlen(s, size));
  }
};

// Writes fixed-offset fields little-endian (medfast only writes little endian).
struct FieldWriter {
  std::uint8_t* p;
  template <typename T>
  void put(std::size_t offset, T v) {
    std::memcpy(p + offset, &v, sizeof(T));
  }
  void text(std::size_t offset, std::size_t size, const std::string& s) {
    std::memcpy(p + offset, s.data(), std::min(size, s.size()));
  }
};

int valid_xform_code(int code) { return code >= 0 && code <= 5 ? code : 0; }

std::string printable(const std::uint8_t* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = p[i];
    if (c >= 32 && c < 127) s += static_cast<char>(c);
    else s += str("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  return s;
}

}  // namespace

std::string memory_dtype_name(const Header& h) {
  if (h.has_scaling()) return "float64";
  switch (h.datatype) {
    case DT_UINT16: return "int32";
    case DT_UINT32:
    case DT_UINT64: return "int64";
    default: return datatype_name(h.datatype);
  }
}

std::size_t dtype_name_bytes(const std::string& name) {
  if (name == "uint8" || name == "int8" || name == "bool" || name == "binary") return 1;
  if (name == "int16" || name == "uint16" || name == "float16") return 2;
  if (name == "int32" || name == "uint32" || name == "float32") return 4;
  if (name == "int64" || name == "uint64" || name == "float64" || name == "complex64") return 8;
  if (name == "complex128") return 16;
  return 0;
}

const char* datatype_name(int code) {
  switch (code) {
    case DT_BINARY: return "binary";
    case DT_UINT8: return "uint8";
    case DT_INT16: return "int16";
    case DT_INT32: return "int32";
    case DT_FLOAT32: return "float32";
    case DT_COMPLEX64: return "complex64";
    case DT_FLOAT64: return "float64";
    case DT_RGB24: return "rgb24";
    case DT_INT8: return "int8";
    case DT_UINT16: return "uint16";
    case DT_UINT32: return "uint32";
    case DT_INT64: return "int64";
    case DT_UINT64: return "uint64";
    case DT_FLOAT128: return "float128";
    case DT_COMPLEX128: return "complex128";
    case DT_COMPLEX256: return "complex256";
    case DT_RGBA32: return "rgba32";
    default: return "unknown";
  }
}

std::size_t datatype_size(int code) {
  switch (code) {
    case DT_UINT8:
    case DT_INT8: return 1;
    case DT_INT16:
    case DT_UINT16: return 2;
    case DT_INT32:
    case DT_UINT32:
    case DT_FLOAT32: return 4;
    case DT_INT64:
    case DT_UINT64:
    case DT_FLOAT64: return 8;
    default: return 0;
  }
}

bool datatype_supported(int code) { return datatype_size(code) != 0; }

int datatype_from_name(const std::string& name) {
  for (int code : {DT_UINT8, DT_INT8, DT_INT16, DT_UINT16, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64, DT_FLOAT32,
                   DT_FLOAT64}) {
    if (name == datatype_name(code)) return code;
  }
  throw ValueError(str("datatype '", name,
                       "' is not one of uint8, int8, int16, uint16, int32, uint32, int64, uint64, float32, float64"));
}

std::vector<std::int64_t> Header::shape() const {
  return std::vector<std::int64_t>(dim.begin() + 1, dim.begin() + 1 + ndim());
}

std::uint64_t Header::voxel_count() const {
  std::uint64_t n = 1;
  for (int i = 1; i <= ndim(); ++i) n *= static_cast<std::uint64_t>(dim[i]);
  return n;
}

std::uint64_t Header::data_bytes() const { return voxel_count() * datatype_size(datatype); }

bool Header::has_scaling() const {
  const auto [slope, inter] = scaling();
  return !(slope == 1.0 && inter == 0.0);
}

std::pair<double, double> Header::scaling() const {
  if (scl_slope == 0 || !std::isfinite(scl_slope)) return {1.0, 0.0};
  return {scl_slope, scl_inter};
}

Affine Header::sform_affine() const {
  Affine a;
  for (int c = 0; c < 4; ++c) {
    a(0, c) = srow_x[c];
    a(1, c) = srow_y[c];
    a(2, c) = srow_z[c];
  }
  return a;
}

// Mirrors nibabel's Nifti1Header.get_qform: the quaternion is completed and
// turned into a matrix in extended precision (numpy longdouble, x87 80-bit on
// x86-64), then rounded to double, so that affines agree to the last bit.
Affine Header::qform_affine() const {
  using LD = long double;
  const LD x = quatern_b, y = quatern_c, z = quatern_d;
  const LD w2 = 1.0L - (((0.0L + x * x) + y * y) + z * z);
  const LD threshold = version == 1 ? -static_cast<LD>(std::numeric_limits<float>::epsilon()) * 3
                                    : -static_cast<LD>(std::numeric_limits<double>::epsilon()) * 3;
  LD w = 0;
  if (w2 < 0) {
    if (w2 < threshold) {
      throw FormatError(str("fields quatern_b/c/d = (", quatern_b, ", ", quatern_c, ", ", quatern_d,
                            ") are not a unit quaternion's vector part (b^2+c^2+d^2 > 1)"));
    }
  } else {
    w = std::sqrt(w2);
  }
  LD r[3][3];
  const LD nq = w * w + x * x + y * y + z * z;
  if (nq < static_cast<LD>(std::numeric_limits<double>::epsilon())) {
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) r[i][j] = i == j ? 1 : 0;
  } else {
    const LD s = 2.0L / nq;
    const LD X = x * s, Y = y * s, Z = z * s;
    const LD wX = w * X, wY = w * Y, wZ = w * Z;
    const LD xX = x * X, xY = x * Y, xZ = x * Z;
    const LD yY = y * Y, yZ = y * Z, zZ = z * Z;
    r[0][0] = 1.0L - (yY + zZ);
    r[0][1] = xY - wZ;
    r[0][2] = xZ + wY;
    r[1][0] = xY + wZ;
    r[1][1] = 1.0L - (xX + zZ);
    r[1][2] = yZ - wX;
    r[2][0] = xZ - wY;
    r[2][1] = yZ + wX;
    r[2][2] = 1.0L - (xX + yY);
  }
  double vox[3] = {pixdim[1], pixdim[2], pixdim[3]};
  const double qfac = pixdim[0] == -1.0 ? -1.0 : 1.0;
  vox[2] *= qfac;
  Affine a;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) a(i, j) = static_cast<double>(r[i][j] * static_cast<LD>(vox[j]));
  a(0, 3) = qoffset_x;
  a(1, 3) = qoffset_y;
  a(2, 3) = qoffset_z;
  return a;
}

Affine Header::base_affine() const {
  // nibabel's shape_zoom_affine(shape, zooms, x_flip=True) on the first three axes.
  Affine a;
  for (int i = 0; i < 3; ++i) {
    const double n = i < ndim() ? static_cast<double>(dim[i + 1]) : 1.0;
    double zoom = i < ndim() ? pixdim[i + 1] : 1.0;
    if (i == 0) zoom = -zoom;
    a(i, i) = zoom;
    a(i, 3) = -((n - 1) / 2.0) * zoom;
  }
  return a;
}

Affine Header::best_affine() const {
  if (sform_code != 0) return sform_affine();
  if (qform_code != 0) return qform_affine();
  return base_affine();
}

void Header::set_affine(const Affine& affine, int sform, int qform) {
  for (int c = 0; c < 4; ++c) {
    srow_x[c] = affine(0, c);
    srow_y[c] = affine(1, c);
    srow_z[c] = affine(2, c);
  }
  const QForm q = affine_to_qform(affine);
  quatern_b = q.b;
  quatern_c = q.c;
  quatern_d = q.d;
  qoffset_x = q.offset[0];
  qoffset_y = q.offset[1];
  qoffset_z = q.offset[2];
  pixdim[0] = q.qfac;
  for (int i = 0; i < 3; ++i) pixdim[i + 1] = q.pixdim[i];
  sform_code = sform;
  qform_code = qform;
}

namespace {

/// The NIfTI-1 fields (348-byte header) into `h`.
void read_nifti1_fields(const std::uint8_t* p, const FieldReader& f, Header& h, const std::string& name) {
  if (std::memcmp(p + 344, "ni1\0", 4) == 0) {
    throw FormatError(str(name, ": field magic is 'ni1': two-file NIfTI (.hdr/.img) is not supported; "
                                "convert it to a single .nii or .nii.gz"));
  }
  if (std::memcmp(p + 344, "n+1\0", 4) != 0) {
    throw FormatError(str(name, ": field magic is '", printable(p + 344, 4),
                          "'; expected 'n+1' (single-file NIfTI-1; ANALYZE 7.5 is not supported)"));
  }
  h.dim_info = p[39];
  for (int i = 0; i < 8; ++i) h.dim[i] = f.get<std::int16_t>(40 + 2 * i);
  h.intent_p1 = f.get<float>(56);
  h.intent_p2 = f.get<float>(60);
  h.intent_p3 = f.get<float>(64);
  h.intent_code = f.get<std::int16_t>(68);
  h.datatype = f.get<std::int16_t>(70);
  h.bitpix = f.get<std::int16_t>(72);
  h.slice_start = f.get<std::int16_t>(74);
  for (int i = 0; i < 8; ++i) h.pixdim[i] = f.get<float>(76 + 4 * i);
  const double vox = f.get<float>(108);
  if (!std::isfinite(vox) || vox < 0 || vox != std::floor(vox) || vox > 9.0e15) {
    throw FormatError(str(name, ": field vox_offset is ", vox, "; expected a whole, non-negative byte offset"));
  }
  h.vox_offset = static_cast<std::int64_t>(vox);
  h.scl_slope = f.get<float>(112);
  h.scl_inter = f.get<float>(116);
  h.slice_end = f.get<std::int16_t>(120);
  h.slice_code = p[122];
  h.xyzt_units = p[123];
  h.cal_max = f.get<float>(124);
  h.cal_min = f.get<float>(128);
  h.slice_duration = f.get<float>(132);
  h.toffset = f.get<float>(136);
  h.descrip = f.text(148, 80);
  h.aux_file = f.text(228, 24);
  h.qform_code = f.get<std::int16_t>(252);
  h.sform_code = f.get<std::int16_t>(254);
  h.quatern_b = f.get<float>(256);
  h.quatern_c = f.get<float>(260);
  h.quatern_d = f.get<float>(264);
  h.qoffset_x = f.get<float>(268);
  h.qoffset_y = f.get<float>(272);
  h.qoffset_z = f.get<float>(276);
  for (int i = 0; i < 4; ++i) {
    h.srow_x[i] = f.get<float>(280 + 4 * i);
    h.srow_y[i] = f.get<float>(296 + 4 * i);
    h.srow_z[i] = f.get<float>(312 + 4 * i);
  }
  h.intent_name = f.text(328, 16);
}

/// The NIfTI-2 fields (540-byte header) into `h`.
void read_nifti2_fields(const std::uint8_t* p, const FieldReader& f, Header& h, const std::string& name) {
  if (std::memcmp(p + 4, "n+2\0", 4) != 0) {
    throw FormatError(str(name, ": field magic is '", printable(p + 4, 4),
                          "'; expected 'n+2' (single-file NIfTI-2; two-file 'ni2' is not supported)"));
  }
  if (std::memcmp(p + 8, "\r\n\032\n", 4) != 0) {
    throw FormatError(str(name, ": field magic bytes 4..7 are '", printable(p + 8, 4),
                          "'; expected \\r\\n\\x1a\\n (was the file transferred in text mode?)"));
  }
  h.datatype = f.get<std::int16_t>(12);
  h.bitpix = f.get<std::int16_t>(14);
  for (int i = 0; i < 8; ++i) h.dim[i] = f.get<std::int64_t>(16 + 8 * i);
  h.intent_p1 = f.get<double>(80);
  h.intent_p2 = f.get<double>(88);
  h.intent_p3 = f.get<double>(96);
  for (int i = 0; i < 8; ++i) h.pixdim[i] = f.get<double>(104 + 8 * i);
  h.vox_offset = f.get<std::int64_t>(168);
  if (h.vox_offset < 0) {
    throw FormatError(str(name, ": field vox_offset is ", h.vox_offset, "; expected a non-negative byte offset"));
  }
  h.scl_slope = f.get<double>(176);
  h.scl_inter = f.get<double>(184);
  h.cal_max = f.get<double>(192);
  h.cal_min = f.get<double>(200);
  h.slice_duration = f.get<double>(208);
  h.toffset = f.get<double>(216);
  h.slice_start = f.get<std::int64_t>(224);
  h.slice_end = f.get<std::int64_t>(232);
  h.descrip = f.text(240, 80);
  h.aux_file = f.text(320, 24);
  h.qform_code = f.get<std::int32_t>(344);
  h.sform_code = f.get<std::int32_t>(348);
  h.quatern_b = f.get<double>(352);
  h.quatern_c = f.get<double>(360);
  h.quatern_d = f.get<double>(368);
  h.qoffset_x = f.get<double>(376);
  h.qoffset_y = f.get<double>(384);
  h.qoffset_z = f.get<double>(392);
  for (int i = 0; i < 4; ++i) {
    h.srow_x[i] = f.get<double>(400 + 8 * i);
    h.srow_y[i] = f.get<double>(432 + 8 * i);
    h.srow_z[i] = f.get<double>(464 + 8 * i);
  }
  h.slice_code = f.get<std::int32_t>(496);
  h.xyzt_units = f.get<std::int32_t>(500);
  h.intent_code = f.get<std::int32_t>(504);
  h.intent_name = f.text(508, 16);
  h.dim_info = p[524];
}

/// Sizes, type and data offset, each naming the field.
void check_layout(Header& h, const std::string& name) {
  if (h.dim[0] < 1 || h.dim[0] > 7) {
    throw FormatError(str(name, ": field dim[0] is ", h.dim[0], "; expected the number of dimensions, 1..7"));
  }
  std::uint64_t voxels = 1;
  for (int i = 1; i <= h.dim[0]; ++i) {
    if (h.dim[i] < 1) {
      throw FormatError(str(name, ": field dim[", i, "] is ", h.dim[i], "; expected a positive size"));
    }
    if (__builtin_mul_overflow(voxels, static_cast<std::uint64_t>(h.dim[i]), &voxels)) {
      throw FormatError(str(name, ": field dim: the sizes multiply past 2^64 voxels"));
    }
  }
  if (!datatype_supported(h.datatype)) {
    throw FormatError(str(name, ": field datatype is ", h.datatype, " (", datatype_name(h.datatype),
                          "): unsupported datatype; medfast reads uint8, int8, int16, uint16, int32, uint32, "
                          "int64, uint64, float32 and float64"));
  }
  std::uint64_t bytes;
  if (__builtin_mul_overflow(voxels, static_cast<std::uint64_t>(datatype_size(h.datatype)), &bytes) ||
      bytes > (1ull << 62)) {
    throw FormatError(str(name, ": field dim: ", voxels, " voxels of ", datatype_name(h.datatype),
                          " overflow any addressable size"));
  }
  const std::int64_t min_offset = h.version == 1 ? kNifti1MinVoxOffset : kNifti2MinVoxOffset;
  if (h.vox_offset == 0) {
    h.vox_offset = min_offset;  // unset: the data follows the header and extension flag
  } else if (h.vox_offset < min_offset) {
    throw FormatError(str(name, ": field vox_offset is ", h.vox_offset, "; a single-file NIfTI-", h.version,
                          " image needs at least ", min_offset));
  }
  if (h.scl_slope != 0 && std::isfinite(h.scl_slope) && !std::isfinite(h.scl_inter)) {
    throw FormatError(str(name, ": field scl_inter is ", h.scl_inter, " while scl_slope is ", h.scl_slope,
                          "; expected a finite intercept"));
  }
}

/// nibabel's repairs, then the geometry fields the affine is made of.
void repair_and_check_geometry(Header& h, const std::string& name) {
  // The repairs nibabel applies when it loads a header (check_fix), so that
  // both compute the same affine: pixdim[1..3] zero -> 1 and negative -> abs,
  // qfac other than +-1 -> 1, unknown xform codes -> 0.
  for (int i = 1; i <= 3; ++i) {
    if (h.pixdim[i] == 0) h.pixdim[i] = 1;
    else if (h.pixdim[i] < 0) h.pixdim[i] = -h.pixdim[i];
  }
  if (h.pixdim[0] != 1 && h.pixdim[0] != -1) h.pixdim[0] = 1;
  h.qform_code = valid_xform_code(h.qform_code);
  h.sform_code = valid_xform_code(h.sform_code);
  // Geometry fields that feed the affine must be numbers: a NaN or infinity there
  // would otherwise surface later as a NaN spacing or a "zero column" far from its cause.
  auto finite = [&](double v, const std::string& field, const char* role) {
    if (!std::isfinite(v)) {
      throw FormatError(str(name, ": field ", field, " is ", v, "; expected a finite ", role));
    }
  };
  for (int i = 1; i <= 3; ++i) finite(h.pixdim[i], str("pixdim[", i, "]"), "voxel size");
  if (h.sform_code > 0) {
    const char* rows[3] = {"srow_x", "srow_y", "srow_z"};
    const std::array<double, 4>* values[3] = {&h.srow_x, &h.srow_y, &h.srow_z};
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 4; ++c) finite((*values[r])[static_cast<std::size_t>(c)], str(rows[r], "[", c, "]"), "affine entry (sform_code > 0)");
    }
  }
  if (h.qform_code > 0) {
    finite(h.quatern_b, "quatern_b", "quaternion component (qform_code > 0)");
    finite(h.quatern_c, "quatern_c", "quaternion component (qform_code > 0)");
    finite(h.quatern_d, "quatern_d", "quaternion component (qform_code > 0)");
    finite(h.qoffset_x, "qoffset_x", "offset (qform_code > 0)");
    finite(h.qoffset_y, "qoffset_y", "offset (qform_code > 0)");
    finite(h.qoffset_z, "qoffset_z", "offset (qform_code > 0)");
  }
}

}  // namespace

Header parse_header(const void* data, std::size_t size, const std::string& name) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  if (size < kNifti1HeaderSize) {
    throw FormatError(str(name, ": file is truncated: ", size, " bytes cannot hold a NIfTI header (",
                          kNifti1HeaderSize, " bytes or more)"));
  }
  std::int32_t sizeof_hdr;
  std::memcpy(&sizeof_hdr, p, 4);
  bool swap = false;
  if (sizeof_hdr != 348 && sizeof_hdr != 540) {
    const std::int32_t swapped = byteswap(sizeof_hdr);
    if (swapped != 348 && swapped != 540) {
      throw FormatError(str(name, ": field sizeof_hdr is ", sizeof_hdr, " (", swapped,
                            " byte-swapped); expected 348 (NIfTI-1) or 540 (NIfTI-2): not a NIfTI file"));
    }
    swap = true;
    sizeof_hdr = swapped;
  }
  Header h;
  h.version = sizeof_hdr == 348 ? 1 : 2;
  h.big_endian = swap;  // medfast only runs on little-endian hosts
  if (h.version == 2 && size < kNifti2HeaderSize) {
    throw FormatError(str(name, ": file is truncated: ", size, " bytes cannot hold a NIfTI-2 header (",
                          kNifti2HeaderSize, " bytes)"));
  }
  const FieldReader f{p, swap};

  if (h.version == 1) {
    read_nifti1_fields(p, f, h, name);
  } else {
    read_nifti2_fields(p, f, h, name);
  }
  check_layout(h, name);
  repair_and_check_geometry(h, name);
  h.bitpix = static_cast<int>(datatype_size(h.datatype) * 8);
  return h;
}

void check_data_size(const Header& h, const std::string& name, std::uint64_t max_volume_bytes) {
  const std::uint64_t bytes = h.data_bytes();
  if (bytes > max_volume_bytes) {
    std::string dims;
    for (auto d : h.shape()) dims += (dims.empty() ? "" : "x") + std::to_string(d);
    throw FormatError(str(name, ": field dim: the header announces ", dims, " ", datatype_name(h.datatype), " = ",
                          bytes, " bytes, more than max_volume_bytes (", max_volume_bytes,
                          "); raise MEDFAST_MAX_VOLUME_BYTES if the volume is real"));
  }
}

std::vector<std::uint8_t> serialize_header(const Header& h) {
  const std::int64_t min_offset = h.version == 1 ? kNifti1MinVoxOffset : kNifti2MinVoxOffset;
  const std::int64_t vox_offset = std::max(h.vox_offset, min_offset);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(vox_offset), 0);
  FieldWriter w{out.data()};
  if (h.version == 1) {
    for (int i = 0; i <= h.dim[0]; ++i) {
      if (h.dim[i] > 32767) {
        throw ValueError(str("dim[", i, "] = ", h.dim[i], " does not fit NIfTI-1 (at most 32767); write NIfTI-2"));
      }
    }
    w.put<std::int32_t>(0, 348);
    w.put<std::uint8_t>(38, 'r');
    w.put<std::uint8_t>(39, static_cast<std::uint8_t>(h.dim_info));
    for (int i = 0; i < 8; ++i) w.put<std::int16_t>(40 + 2 * i, static_cast<std::int16_t>(i <= h.dim[0] ? h.dim[i] : 1));
    w.put<float>(56, static_cast<float>(h.intent_p1));
    w.put<float>(60, static_cast<float>(h.intent_p2));
    w.put<float>(64, static_cast<float>(h.intent_p3));
    w.put<std::int16_t>(68, static_cast<std::int16_t>(h.intent_code));
    w.put<std::int16_t>(70, static_cast<std::int16_t>(h.datatype));
    w.put<std::int16_t>(72, static_cast<std::int16_t>(datatype_size(h.datatype) * 8));
    w.put<std::int16_t>(74, static_cast<std::int16_t>(h.slice_start));
    for (int i = 0; i < 8; ++i) w.put<float>(76 + 4 * i, static_cast<float>(h.pixdim[i]));
    w.put<float>(108, static_cast<float>(vox_offset));
    w.put<float>(112, static_cast<float>(h.scl_slope));
    w.put<float>(116, static_cast<float>(h.scl_inter));
    w.put<std::int16_t>(120, static_cast<std::int16_t>(h.slice_end));
    w.put<std::uint8_t>(122, static_cast<std::uint8_t>(h.slice_code));
    w.put<std::uint8_t>(123, static_cast<std::uint8_t>(h.xyzt_units));
    w.put<float>(124, static_cast<float>(h.cal_max));
    w.put<float>(128, static_cast<float>(h.cal_min));
    w.put<float>(132, static_cast<float>(h.slice_duration));
    w.put<float>(136, static_cast<float>(h.toffset));
    w.text(148, 80, h.descrip);
    w.text(228, 24, h.aux_file);
    w.put<std::int16_t>(252, static_cast<std::int16_t>(h.qform_code));
    w.put<std::int16_t>(254, static_cast<std::int16_t>(h.sform_code));
    w.put<float>(256, static_cast<float>(h.quatern_b));
    w.put<float>(260, static_cast<float>(h.quatern_c));
    w.put<float>(264, static_cast<float>(h.quatern_d));
    w.put<float>(268, static_cast<float>(h.qoffset_x));
    w.put<float>(272, static_cast<float>(h.qoffset_y));
    w.put<float>(276, static_cast<float>(h.qoffset_z));
    for (int i = 0; i < 4; ++i) {
      w.put<float>(280 + 4 * i, static_cast<float>(h.srow_x[i]));
      w.put<float>(296 + 4 * i, static_cast<float>(h.srow_y[i]));
      w.put<float>(312 + 4 * i, static_cast<float>(h.srow_z[i]));
    }
    w.text(328, 16, h.intent_name);
    std::memcpy(out.data() + 344, "n+1\0", 4);
  } else {
    w.put<std::int32_t>(0, 540);
    std::memcpy(out.data() + 4, "n+2\0\r\n\032\n", 8);
    w.put<std::int16_t>(12, static_cast<std::int16_t>(h.datatype));
    w.put<std::int16_t>(14, static_cast<std::int16_t>(datatype_size(h.datatype) * 8));
    for (int i = 0; i < 8; ++i) w.put<std::int64_t>(16 + 8 * i, i <= h.dim[0] ? h.dim[i] : 1);
    w.put<double>(80, h.intent_p1);
    w.put<double>(88, h.intent_p2);
    w.put<double>(96, h.intent_p3);
    for (int i = 0; i < 8; ++i) w.put<double>(104 + 8 * i, h.pixdim[i]);
    w.put<std::int64_t>(168, vox_offset);
    w.put<double>(176, h.scl_slope);
    w.put<double>(184, h.scl_inter);
    w.put<double>(192, h.cal_max);
    w.put<double>(200, h.cal_min);
    w.put<double>(208, h.slice_duration);
    w.put<double>(216, h.toffset);
    w.put<std::int64_t>(224, h.slice_start);
    w.put<std::int64_t>(232, h.slice_end);
    w.text(240, 80, h.descrip);
    w.text(320, 24, h.aux_file);
    w.put<std::int32_t>(344, h.qform_code);
    w.put<std::int32_t>(348, h.sform_code);
    w.put<double>(352, h.quatern_b);
    w.put<double>(360, h.quatern_c);
    w.put<double>(368, h.quatern_d);
    w.put<double>(376, h.qoffset_x);
    w.put<double>(384, h.qoffset_y);
    w.put<double>(392, h.qoffset_z);
    for (int i = 0; i < 4; ++i) {
      w.put<double>(400 + 8 * i, h.srow_x[i]);
      w.put<double>(432 + 8 * i, h.srow_y[i]);
      w.put<double>(464 + 8 * i, h.srow_z[i]);
    }
    w.put<std::int32_t>(496, h.slice_code);
    w.put<std::int32_t>(500, h.xyzt_units);
    w.put<std::int32_t>(504, h.intent_code);
    w.text(508, 16, h.intent_name);
    w.put<std::uint8_t>(524, static_cast<std::uint8_t>(h.dim_info));
  }
  // Bytes [header size, header size + 4) are the extension flag: all zero, no extensions.
  return out;
}

}  // namespace medfast::nifti
