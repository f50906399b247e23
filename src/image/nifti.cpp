#include "medfast/image/nifti.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "medfast/core/error.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/os/file.hpp"
#include "medfast/version.hpp"

namespace medfast {

using namespace nifti;

NiftiWriteOptions& NiftiWriteOptions::set_gzip_level(int v) {
  if (v < 0 || v > 12) throw ValueError(str("NiftiWriteOptions: gzip_level ", v, " is outside 0..12"));
  gzip_level = v;
  return *this;
}

NiftiWriteOptions& NiftiWriteOptions::set_version(int v) {
  if (v != 0 && v != 1 && v != 2) throw ValueError(str("NiftiWriteOptions: version ", v, " is not 0 (auto), 1 or 2"));
  version = v;
  return *this;
}

NiftiWriteOptions NiftiWriteOptions::from(const Settings& s) {
  return NiftiWriteOptions().set_gzip_level(static_cast<int>(s.get_int("gzip_level"))).set_threads(s.threads());
}

namespace {

at::ScalarType stored_type(int datatype) {
  switch (datatype) {
    case DT_UINT8: return at::kByte;
    case DT_INT8: return at::kChar;
    case DT_INT16: return at::kShort;
    case DT_INT32: return at::kInt;
    case DT_INT64: return at::kLong;
    case DT_FLOAT32: return at::kFloat;
    case DT_FLOAT64: return at::kDouble;
    default: return at::kByte;  // unsigned wide types are handled by widen()
  }
}

// Reversed sizes: NIfTI stores x fastest, so the contiguous storage has shape
// (dim_n, ..., dim_1) and the Volume is its permuted view (dim_1, ..., dim_n).
std::vector<std::int64_t> reversed_shape(const Header& h) {
  auto s = h.shape();
  return std::vector<std::int64_t>(s.rbegin(), s.rend());
}

std::vector<std::int64_t> reverse_dims(std::int64_t n) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = n - 1 - i;
  return p;
}

template <typename Src, typename Dst>
void widen_loop(const void* src, void* dst, std::size_t n) {
  const auto* s = static_cast<const Src*>(src);
  auto* d = static_cast<Dst*>(dst);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<Dst>(s[i]);
}

// libtorch 1.13 has no uint16/uint32/uint64: widen into the next signed type.
at::Tensor widen(const RawImage& raw, const std::vector<std::int64_t>& sizes, const std::string& source) {
  const std::size_t n = raw.header.voxel_count();
  switch (raw.header.datatype) {
    case DT_UINT16: {
      at::Tensor t = at::empty(sizes, at::kInt);
      widen_loop<std::uint16_t, std::int32_t>(raw.data(), t.data_ptr(), n);
      return t;
    }
    case DT_UINT32: {
      at::Tensor t = at::empty(sizes, at::kLong);
      widen_loop<std::uint32_t, std::int64_t>(raw.data(), t.data_ptr(), n);
      return t;
    }
    case DT_UINT64: {
      const auto* s = static_cast<const std::uint64_t*>(raw.data());
      for (std::size_t i = 0; i < n; ++i) {
        if (s[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          throw FormatError(str(source, ": uint64 voxel ", i, " = ", s[i],
                                " exceeds the int64 range that libtorch can hold losslessly"));
        }
      }
      at::Tensor t = at::empty(sizes, at::kLong);
      std::memcpy(t.data_ptr(), raw.data(), n * 8);
      return t;
    }
    default:
      return {};
  }
}

bool is_unsigned_wide(int datatype) {
  return datatype == DT_UINT16 || datatype == DT_UINT32 || datatype == DT_UINT64;
}

// nibabel (5.x) scales with a float64 slope, so any scaled image reads as
// float64, whatever the stored type; medfast matches it voxel for voxel.
at::ScalarType scaled_type(const Header&) { return at::kDouble; }

}  // namespace

std::string memory_dtype(const Header& h) { return memory_dtype_name(h); }  // scaled: float64 (scaled_type)

Volume volume_from_raw(RawImage raw, const std::string& source) {
  const Header h = raw.header;
  const auto storage_sizes = reversed_shape(h);
  at::Tensor stored;
  if (is_unsigned_wide(h.datatype)) {
    stored = widen(raw, storage_sizes, source);
  } else {
    const std::size_t capacity = raw.storage.size();
    void* base = raw.storage.release();
    void* data = static_cast<char*>(base) + raw.offset;
    stored = at::from_blob(
        data, storage_sizes, [base, capacity](void*) { os::Buffer::free(base, capacity); },
        at::TensorOptions().dtype(stored_type(h.datatype)));
  }
  if (h.has_scaling()) {
    const auto [slope, inter] = h.scaling();
    stored = stored.to(scaled_type(h));
    if (slope != 1.0) stored.mul_(slope);
    if (inter != 0.0) stored.add_(inter);
  }
  const VolumeHeader g = volume_header(h, source);
  Volume v;
  v.data = stored.permute(reverse_dims(h.ndim()));
  v.affine = g.affine;
  v.meta = g.meta;
  return v;
}

VolumeHeader volume_header(const Header& h, const std::string& source) {
  VolumeHeader v;
  const auto shape = h.shape();
  v.shape.assign(shape.begin(), shape.end());
  try {
    v.affine = h.best_affine();
  } catch (Error& e) {
    e.add_context(source);
    throw;
  }
  v.meta.source = source;
  v.meta.nifti_version = h.version;
  v.meta.disk_datatype = h.datatype;
  v.meta.big_endian = h.big_endian;
  v.meta.scl_slope = h.scl_slope;
  v.meta.scl_inter = h.scl_inter;
  v.meta.qform_code = h.qform_code;
  v.meta.sform_code = h.sform_code;
  v.meta.xyzt_units = h.xyzt_units;
  v.meta.intent_code = h.intent_code;
  v.meta.descrip = h.descrip;
  v.meta.pixdim = h.pixdim;
  return v;
}

VolumeHeader read_nifti_header(const std::string& path, const NiftiReadOptions& options) {
  return volume_header(read_header(path, options), path);
}

Volume read_nifti(const std::string& path, const NiftiReadOptions& options) {
  return volume_from_raw(read_raw(path, options), path);
}

namespace {

int datatype_of(at::ScalarType t) {
  switch (t) {
    case at::kByte:
    case at::kBool: return DT_UINT8;
    case at::kChar: return DT_INT8;
    case at::kShort: return DT_INT16;
    case at::kInt: return DT_INT32;
    case at::kLong: return DT_INT64;
    case at::kFloat: return DT_FLOAT32;
    case at::kDouble: return DT_FLOAT64;
    default: return 0;
  }
}

// True if the 3x3 part is a rotation times positive scales (what a qform can hold).
bool shear_free(const Affine& a) {
  const QForm q = affine_to_qform(a);
  Header h;
  h.version = 2;
  h.quatern_b = q.b;
  h.quatern_c = q.c;
  h.quatern_d = q.d;
  h.pixdim = {q.qfac, q.pixdim[0], q.pixdim[1], q.pixdim[2], 1, 1, 1, 1};
  h.qoffset_x = q.offset[0];
  h.qoffset_y = q.offset[1];
  h.qoffset_z = q.offset[2];
  const Affine back = h.qform_affine();
  double scale = 1e-300;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) scale = std::max(scale, std::abs(a(i, j)));
  return back.max_abs_diff(a) <= 1e-6 * scale;
}

// The datatype to store `t` as: the on-disk type it was read from when that
// is an unsigned type it was widened from and every value still fits.
int target_datatype(const Volume& v, const at::Tensor& t) {
  const int natural = datatype_of(t.scalar_type());
  const int disk = v.meta.disk_datatype;
  if (!is_unsigned_wide(disk) || t.numel() == 0) return natural;
  const bool widened = (disk == DT_UINT16 && t.scalar_type() == at::kInt) ||
                       ((disk == DT_UINT32 || disk == DT_UINT64) && t.scalar_type() == at::kLong);
  if (!widened) return natural;
  const auto lo = t.min().item<std::int64_t>();
  const auto hi = t.max().item<std::int64_t>();
  const std::int64_t limit = disk == DT_UINT16 ? 65535 : disk == DT_UINT32 ? 4294967295LL
                                                                          : std::numeric_limits<std::int64_t>::max();
  return lo >= 0 && hi <= limit ? disk : natural;
}

}  // namespace

Header header_for(const Volume& volume, const NiftiWriteOptions& options) {
  const at::Tensor& t = volume.data;
  MEDFAST_CHECK_T(ValueError, t.defined(), "write_nifti: the volume has no data");
  MEDFAST_CHECK_T(ValueError, t.dim() >= 1 && t.dim() <= 7, "write_nifti: a tensor of ", t.dim(),
                  " dimensions cannot be NIfTI (1..7)");
  Header h;
  int datatype = datatype_of(t.scalar_type());
  if (datatype == 0) datatype = DT_FLOAT32;  // float16/bfloat16 widen losslessly to float32
  if (datatype == DT_INT32 || datatype == DT_INT64) datatype = target_datatype(volume, t);
  h.datatype = datatype;
  h.dim[0] = t.dim();
  bool needs_v2 = false;
  for (int i = 0; i < 7; ++i) {
    h.dim[i + 1] = i < t.dim() ? t.size(i) : 1;
    if (h.dim[i + 1] > 32767) needs_v2 = true;
  }
  // Auto: keep a NIfTI-2 source's format (float64 geometry), else NIfTI-1 unless a size needs 2.
  h.version = options.version != 0 ? options.version : (needs_v2 || volume.meta.nifti_version == 2 ? 2 : 1);
  h.vox_offset = h.version == 1 ? kNifti1MinVoxOffset : kNifti2MinVoxOffset;
  h.pixdim = {1, 1, 1, 1, 1, 1, 1, 1};
  for (int i = 4; i < 8; ++i) {
    if (volume.meta.pixdim[i] != 0) h.pixdim[i] = volume.meta.pixdim[i];
  }
  const int sform = volume.meta.sform_code > 0 ? volume.meta.sform_code : 2;  // 2: aligned
  int qform = volume.meta.qform_code;
  if (qform == 0) qform = shear_free(volume.affine) ? sform : 0;
  h.set_affine(volume.affine, sform, qform);
  h.scl_slope = 1.0;
  h.scl_inter = 0.0;
  h.xyzt_units = volume.meta.xyzt_units != 0 ? volume.meta.xyzt_units : 2 + 8;  // mm, s
  h.intent_code = volume.meta.intent_code;
  h.descrip = volume.meta.descrip.empty() ? std::string("medfast ") + kVersion : volume.meta.descrip;
  return h;
}

void write_nifti(const std::string& path, const Volume& volume, const NiftiWriteOptions& options) {
  try {
    const Header h = header_for(volume, options);
    const std::vector<std::uint8_t> header_bytes = serialize_header(h);
    at::Tensor t = volume.data;
    if (t.scalar_type() == at::kBool) t = t.to(at::kByte);
    if (datatype_of(t.scalar_type()) == 0) t = t.to(at::kFloat);
    // File order: x fastest, i.e. the C-contiguous layout of the reversed dims.
    t = t.permute(reverse_dims(t.dim())).contiguous();
    at::Tensor out = t;
    if (h.datatype == DT_UINT16) {
      out = at::empty(t.sizes(), at::kShort);
      widen_loop<std::int32_t, std::uint16_t>(t.data_ptr(), out.data_ptr(), static_cast<std::size_t>(t.numel()));
    } else if (h.datatype == DT_UINT32) {
      out = at::empty(t.sizes(), at::kInt);
      widen_loop<std::int64_t, std::uint32_t>(t.data_ptr(), out.data_ptr(), static_cast<std::size_t>(t.numel()));
    }
    const std::size_t data_bytes = static_cast<std::size_t>(out.numel()) * out.element_size();
    os::make_directories(os::parent_directory(path));
    os::AtomicWriter writer(path);
    if (ends_with(path, ".gz")) {
      gzip_write(writer, {{header_bytes.data(), header_bytes.size()}, {out.data_ptr(), data_bytes}},
                     options.gzip_level, options.threads);
    } else {
      writer.append(header_bytes.data(), header_bytes.size());
      writer.append(out.data_ptr(), data_bytes);
    }
    writer.commit();
  } catch (...) {
    rethrow_with_context(str("writing ", path));
  }
}

}  // namespace medfast
