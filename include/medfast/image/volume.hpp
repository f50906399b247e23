#pragma once
/// \file
/// Volume: a tensor with its voxel-to-world affine and header metadata.
///
/// The tensor is indexed [x][y][z](...) like nibabel's arrays, so the affine
/// maps (i, j, k) indices straight to RAS+ millimetres. Read from NIfTI, its
/// memory is in file order (x fastest): the tensor is a permuted view of
/// contiguous storage, which costs nothing to read or write back.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "medfast/image/affine.hpp"

namespace medfast {

namespace dicom {
struct Series;
}

/// What a user needs from the header besides the tensor and affine.
struct VolumeMeta {
  std::string source;              ///< path it was read from, if any
  int nifti_version = 0;           ///< 1 or 2 when read from NIfTI
  int disk_datatype = 0;           ///< NIfTI datatype code on disk (0: unknown)
  bool big_endian = false;         ///< byte order on disk
  double scl_slope = 0, scl_inter = 0;  ///< scaling as stored (already applied to the tensor)
  int qform_code = 0, sform_code = 0;
  int xyzt_units = 0;
  int intent_code = 0;
  std::string descrip;
  std::array<double, 8> pixdim{};  ///< as stored (pixdim[4] is the time step)
  /// Read from DICOM: the series (slices, UIDs, geometry; never patient identifiers),
  /// which a SEG loaded with it is placed on.
  std::shared_ptr<const dicom::Series> dicom;
};

/// A tensor with geometry.
struct Volume {
  at::Tensor data;
  Affine affine;
  VolumeMeta meta;

  std::vector<std::int64_t> shape() const;
  /// Voxel spacing in mm along the first three axes (affine column norms).
  std::array<double, 3> spacing() const { return affine.spacing(); }
  /// Orientation codes, e.g. "RAS" or "LPS".
  std::string axcodes() const { return medfast::axcodes(affine); }
  /// "int16", "float32", ...
  std::string dtype_name() const;
  std::uint64_t bytes_in_memory() const;
};

/// The medfast name of a tensor dtype ("uint8", "int16", "float32", ...).
std::string dtype_name(const at::Tensor& t);
std::string dtype_name(at::ScalarType t);
/// "uint8" -> at::kByte, ...; throws ValueError naming `what` and the choices.
at::ScalarType parse_dtype(const std::string& name, const std::string& what);

/// An uninitialised CPU tensor in medfast's pooled host memory (os::Buffer): a loader
/// that makes batch after batch of one size reuses mapped pages instead of having the
/// kernel zero fresh ones each time.
at::Tensor pooled_empty(at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace medfast
