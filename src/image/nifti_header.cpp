#include "medfast/image/nifti_header.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

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

/// How a version stores a field: its byte offset and type (text: `size` bytes). Arrays
/// (dim, pixdim, srow_*) are consecutive elements from `offset`.
enum class Store : std::uint8_t { u8, i16, i32, i64, f32, f64, text };
struct Slot {
  std::uint16_t offset;
  Store store;
  std::uint16_t size = 0;
};
constexpr std::size_t store_bytes(Store s) {
  switch (s) {
    case Store::u8: return 1;
    case Store::i16: return 2;
    case Store::i32:
    case Store::f32: return 4;
    default: return 8;
  }
}

/// The header fields both versions hold, each once: the member, then where NIfTI-1 (348
/// bytes) and NIfTI-2 (540 bytes) keep it. Read and written from this one table; the
/// magic, sizeof_hdr, vox_offset (checked as it is read) and bitpix (from the datatype)
/// are done beside it.
using Member = std::variant<int Header::*, std::int64_t Header::*, double Header::*, std::string Header::*,
                            std::array<std::int64_t, 8> Header::*, std::array<double, 8> Header::*,
                            std::array<double, 4> Header::*>;
struct Field {
  Member member;
  Slot v1, v2;
};
const Field kFields[] = {
    {&Header::dim_info, {39, Store::u8}, {524, Store::u8}},
    {&Header::dim, {40, Store::i16}, {16, Store::i64}},
    {&Header::intent_p1, {56, Store::f32}, {80, Store::f64}},
    {&Header::intent_p2, {60, Store::f32}, {88, Store::f64}},
    {&Header::intent_p3, {64, Store::f32}, {96, Store::f64}},
    {&Header::intent_code, {68, Store::i16}, {504, Store::i32}},
    {&Header::datatype, {70, Store::i16}, {12, Store::i16}},
    {&Header::slice_start, {74, Store::i16}, {224, Store::i64}},
    {&Header::pixdim, {76, Store::f32}, {104, Store::f64}},
    {&Header::scl_slope, {112, Store::f32}, {176, Store::f64}},
    {&Header::scl_inter, {116, Store::f32}, {184, Store::f64}},
    {&Header::slice_end, {120, Store::i16}, {232, Store::i64}},
    {&Header::slice_code, {122, Store::u8}, {496, Store::i32}},
    {&Header::xyzt_units, {123, Store::u8}, {500, Store::i32}},
    {&Header::cal_max, {124, Store::f32}, {192, Store::f64}},
    {&Header::cal_min, {128, Store::f32}, {200, Store::f64}},
    {&Header::slice_duration, {132, Store::f32}, {208, Store::f64}},
    {&Header::toffset, {136, Store::f32}, {216, Store::f64}},
    {&Header::descrip, {148, Store::text, 80}, {240, Store::text, 80}},
    {&Header::aux_file, {228, Store::text, 24}, {320, Store::text, 24}},
    {&Header::qform_code, {252, Store::i16}, {344, Store::i32}},
    {&Header::sform_code, {254, Store::i16}, {348, Store::i32}},
    {&Header::quatern_b, {256, Store::f32}, {352, Store::f64}},
    {&Header::quatern_c, {260, Store::f32}, {360, Store::f64}},
    {&Header::quatern_d, {264, Store::f32}, {368, Store::f64}},
    {&Header::qoffset_x, {268, Store::f32}, {376, Store::f64}},
    {&Header::qoffset_y, {272, Store::f32}, {384, Store::f64}},
    {&Header::qoffset_z, {276, Store::f32}, {392, Store::f64}},
    {&Header::srow_x, {280, Store::f32}, {400, Store::f64}},
    {&Header::srow_y, {296, Store::f32}, {432, Store::f64}},
    {&Header::srow_z, {312, Store::f32}, {464, Store::f64}},
    {&Header::intent_name, {328, Store::text, 16}, {508, Store::text, 16}},
};

/// Element `i` of a numeric slot, converted to T.
template <typename T>
T read_slot(const FieldReader& f, Slot s, std::size_t i) {
  const std::size_t at = s.offset + i * store_bytes(s.store);
  switch (s.store) {
    case Store::u8: return static_cast<T>(f.p[at]);
    case Store::i16: return static_cast<T>(f.get<std::int16_t>(at));
    case Store::i32: return static_cast<T>(f.get<std::int32_t>(at));
    case Store::i64: return static_cast<T>(f.get<std::int64_t>(at));
    case Store::f32: return static_cast<T>(f.get<float>(at));
    case Store::f64: return static_cast<T>(f.get<double>(at));
    case Store::text: break;
  }
  throw Error("nifti: internal error: a text field read as a number");
}

template <typename T>
void write_slot(FieldWriter& w, Slot s, std::size_t i, T v) {
  const std::size_t at = s.offset + i * store_bytes(s.store);
  switch (s.store) {
    case Store::u8: return w.put<std::uint8_t>(at, static_cast<std::uint8_t>(v));
    case Store::i16: return w.put<std::int16_t>(at, static_cast<std::int16_t>(v));
    case Store::i32: return w.put<std::int32_t>(at, static_cast<std::int32_t>(v));
    case Store::i64: return w.put<std::int64_t>(at, static_cast<std::int64_t>(v));
    case Store::f32: return w.put<float>(at, static_cast<float>(v));
    case Store::f64: return w.put<double>(at, static_cast<double>(v));
    case Store::text: break;
  }
  throw Error("nifti: internal error: a text field written as a number");
}

template <typename T>
struct IsArray : std::false_type {};
template <typename T, std::size_t N>
struct IsArray<std::array<T, N>> : std::true_type {};

/// Every field of the table into `h`, as `version` stores them.
void read_fields(const FieldReader& f, int version, Header& h) {
  for (const Field& field : kFields) {
    const Slot s = version == 1 ? field.v1 : field.v2;
    std::visit(
        [&](auto member) {
          auto& value = h.*member;
          using V = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<V, std::string>) {
            value = f.text(s.offset, s.size);
          } else if constexpr (IsArray<V>::value) {
            for (std::size_t i = 0; i < value.size(); ++i) value[i] = read_slot<typename V::value_type>(f, s, i);
          } else {
            value = read_slot<V>(f, s, 0);
          }
        },
        field.member);
  }
}

/// Every field of the table from `h`, as `version` stores them.
void write_fields(FieldWriter& w, int version, const Header& h) {
  for (const Field& field : kFields) {
    const Slot s = version == 1 ? field.v1 : field.v2;
    std::visit(
        [&](auto member) {
          const auto& value = h.*member;
          using V = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<V, std::string>) {
            w.text(s.offset, s.size, value);
          } else if constexpr (IsArray<V>::value) {
            for (std::size_t i = 0; i < value.size(); ++i) write_slot(w, s, i, value[i]);
          } else {
            write_slot(w, s, 0, value);
          }
        },
        field.member);
  }
}

/// The magic of each version, named when it is not there.
void check_magic(const std::uint8_t* p, int version, const std::string& name) {
  if (version == 1) {
    if (std::memcmp(p + 344, "ni1\0", 4) == 0) {
      throw FormatError(str(name, ": field magic is 'ni1': two-file NIfTI (.hdr/.img) is not supported; "
                                  "convert it to a single .nii or .nii.gz"));
    }
    if (std::memcmp(p + 344, "n+1\0", 4) != 0) {
      throw FormatError(str(name, ": field magic is '", printable(p + 344, 4),
                            "'; expected 'n+1' (single-file NIfTI-1; ANALYZE 7.5 is not supported)"));
    }
    return;
  }
  if (std::memcmp(p + 4, "n+2\0", 4) != 0) {
    throw FormatError(str(name, ": field magic is '", printable(p + 4, 4),
                          "'; expected 'n+2' (single-file NIfTI-2; two-file 'ni2' is not supported)"));
  }
  if (std::memcmp(p + 8, "\r\n\032\n", 4) != 0) {
    throw FormatError(str(name, ": field magic bytes 4..7 are '", printable(p + 8, 4),
                          "'; expected \\r\\n\\x1a\\n (was the file transferred in text mode?)"));
  }
}

/// vox_offset: a float in NIfTI-1 (a whole number), an int64 in NIfTI-2.
std::int64_t read_vox_offset(const FieldReader& f, int version, const std::string& name) {
  if (version == 2) {
    const std::int64_t v = f.get<std::int64_t>(168);
    if (v < 0) throw FormatError(str(name, ": field vox_offset is ", v, "; expected a non-negative byte offset"));
    return v;
  }
  const double vox = f.get<float>(108);
  if (!std::isfinite(vox) || vox < 0 || vox != std::floor(vox) || vox > 9.0e15) {
    throw FormatError(str(name, ": field vox_offset is ", vox, "; expected a whole, non-negative byte offset"));
  }
  return static_cast<std::int64_t>(vox);
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

  check_magic(p, h.version, name);
  read_fields(f, h.version, h);
  h.vox_offset = read_vox_offset(f, h.version, name);
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
  }
  Header out_h = h;
  for (int i = static_cast<int>(h.dim[0]) + 1; i < 8; ++i) out_h.dim[static_cast<std::size_t>(i)] = 1;  // unused dims
  write_fields(w, h.version, out_h);
  const Slot bitpix = h.version == 1 ? Slot{72, Store::i16} : Slot{14, Store::i16};
  write_slot(w, bitpix, 0, datatype_size(h.datatype) * 8);
  if (h.version == 1) {
    w.put<std::int32_t>(0, 348);
    w.put<std::uint8_t>(38, 'r');
    w.put<float>(108, static_cast<float>(vox_offset));
    std::memcpy(out.data() + 344, "n+1\0", 4);
  } else {
    w.put<std::int32_t>(0, 540);
    std::memcpy(out.data() + 4, "n+2\0\r\n\032\n", 8);
    w.put<std::int64_t>(168, vox_offset);
  }
  // Bytes [header size, header size + 4) are the extension flag: all zero, no extensions.
  return out;
}

}  // namespace medfast::nifti
