#pragma once
/// \file
/// NIfTI-1 and NIfTI-2 headers: parsing (either byte order), validation with
/// messages that name the file and the field, serialisation (little endian,
/// single file), and the header-to-affine rules of nibabel.
///
/// NIfTI-1 stores its real fields as float32; they are kept here as the
/// doubles those floats convert to exactly, and `version` says which
/// precision the file had (the qform maths depends on it, as in nibabel).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/image/affine.hpp"

namespace medfast::nifti {

inline constexpr std::size_t kNifti1HeaderSize = 348;
inline constexpr std::size_t kNifti2HeaderSize = 540;
/// Smallest vox_offset of a single-file image: header + 4-byte extension flag.
inline constexpr std::int64_t kNifti1MinVoxOffset = 352;
inline constexpr std::int64_t kNifti2MinVoxOffset = 544;

/// NIfTI datatype codes.
enum DataType : int {
  DT_BINARY = 1,
  DT_UINT8 = 2,
  DT_INT16 = 4,
  DT_INT32 = 8,
  DT_FLOAT32 = 16,
  DT_COMPLEX64 = 32,
  DT_FLOAT64 = 64,
  DT_RGB24 = 128,
  DT_INT8 = 256,
  DT_UINT16 = 512,
  DT_UINT32 = 768,
  DT_INT64 = 1024,
  DT_UINT64 = 1280,
  DT_FLOAT128 = 1536,
  DT_COMPLEX128 = 1792,
  DT_COMPLEX256 = 2048,
  DT_RGBA32 = 2304,
};

/// "int16", "rgb24", ... ("unknown" for codes outside the standard).
const char* datatype_name(int code);
/// The dtype medfast gives the voxels in memory (read_nifti's): float64 when the header
/// scales them, int32/int64 for unsigned 16/32/64-bit, else the on-disk type's name.
std::string memory_dtype_name(const struct Header& header);
/// Bytes per element of a dtype name ("float32" -> 4); 0 for names it does not know.
std::size_t dtype_name_bytes(const std::string& name);
/// Bytes per voxel of a supported datatype, 0 for unsupported ones.
std::size_t datatype_size(int code);
bool datatype_supported(int code);
/// Parses "int16", "uint16", "float32", ... into a code; throws ValueError.
int datatype_from_name(const std::string& name);

/// The fields of a NIfTI-1 or NIfTI-2 header.
struct Header {
  int version = 1;          ///< 1 or 2
  bool big_endian = false;  ///< byte order of the file it came from
  std::array<std::int64_t, 8> dim{};
  std::array<double, 8> pixdim{};
  int datatype = DT_UINT8;
  int bitpix = 8;
  std::int64_t vox_offset = kNifti1MinVoxOffset;
  double scl_slope = 0, scl_inter = 0;
  double cal_min = 0, cal_max = 0;
  double slice_duration = 0, toffset = 0;
  std::int64_t slice_start = 0, slice_end = 0;
  int slice_code = 0, xyzt_units = 0, dim_info = 0;
  int intent_code = 0;
  double intent_p1 = 0, intent_p2 = 0, intent_p3 = 0;
  std::string intent_name, descrip, aux_file;
  int qform_code = 0, sform_code = 0;
  double quatern_b = 0, quatern_c = 0, quatern_d = 0;
  double qoffset_x = 0, qoffset_y = 0, qoffset_z = 0;
  std::array<double, 4> srow_x{}, srow_y{}, srow_z{};

  int ndim() const { return static_cast<int>(dim[0]); }
  /// dim[1..dim[0]].
  std::vector<std::int64_t> shape() const;
  std::uint64_t voxel_count() const;
  /// voxel_count() * datatype_size(datatype).
  std::uint64_t data_bytes() const;

  /// The affine nibabel's img.affine gives: sform if sform_code > 0, else
  /// qform if qform_code > 0, else the shape/pixdim fallback (x flipped).
  Affine best_affine() const;
  Affine qform_affine() const;
  Affine sform_affine() const;
  Affine base_affine() const;
  /// (slope, inter) to apply, or (1, 0) when scl_slope is 0 or not finite.
  std::pair<double, double> scaling() const;
  bool has_scaling() const;

  /// Sets sform (and qform, from the same affine) and pixdim[1..3].
  void set_affine(const Affine& affine, int sform_code, int qform_code);
};

/// Parses and validates a header from the first `size` bytes of a file
/// (at least kNifti1HeaderSize; kNifti2HeaderSize for NIfTI-2). `name` is
/// used in messages. Throws FormatError naming the file and the field.
Header parse_header(const void* data, std::size_t size, const std::string& name);

/// Serialises `header` as a little-endian single-file header followed by the
/// 4-byte "no extensions" flag and zero padding up to header.vox_offset.
std::vector<std::uint8_t> serialize_header(const Header& header);

/// Checks the size the header announces against a limit and, where known, the
/// bytes the file holds after vox_offset. Throws FormatError.
void check_data_size(const Header& header, const std::string& name, std::uint64_t max_volume_bytes);

}  // namespace medfast::nifti
