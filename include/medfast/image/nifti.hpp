#pragma once
/// \file
/// Reading and writing NIfTI-1/NIfTI-2 (.nii, .nii.gz) as Volumes.
///
/// Reading follows nibabel: the affine is nibabel's img.affine (sform, then
/// qform, then the pixdim fallback) and scaled data equals
/// np.asanyarray(img.dataobj), in the same dtype. Unsigned 16/32/64-bit data
/// (which libtorch 1.13 cannot hold) is widened losslessly to int32/int64 and
/// the on-disk type is kept in meta.disk_datatype, which the writer restores.

#include <cstdint>
#include <string>
#include <vector>

#include "medfast/core/settings.hpp"
#include "medfast/image/nifti_raw.hpp"
#include "medfast/image/volume.hpp"

namespace medfast {

/// Options for writing NIfTI files.
struct NiftiWriteOptions {
  int gzip_level = kDefaultGzipLevel;  ///< libdeflate level 0..12 for .nii.gz
  int threads = 1;                     ///< threads compressing gzip members
  int version = 0;  ///< 1, 2, or 0: the source's version, NIfTI-1 for new volumes, 2 if a size needs it

  NiftiWriteOptions& set_gzip_level(int v);
  NiftiWriteOptions& set_threads(int v) { threads = v < 1 ? 1 : v; return *this; }
  NiftiWriteOptions& set_version(int v);
  /// From the resolved settings gzip_level and threads.
  static NiftiWriteOptions from(const Settings& settings);
};

/// Reads a .nii or .nii.gz file. Throws FormatError/OsError naming the path and field.
Volume read_nifti(const std::string& path, const NiftiReadOptions& options = {});

/// A NIfTI file's geometry and metadata without its voxels: the shape read_nifti's tensor
/// would have (nibabel's order), the affine and the meta it would carry.
struct VolumeHeader {
  std::vector<std::int64_t> shape;
  Affine affine;
  VolumeMeta meta;
};
/// Reads the header only (cheap, also for .nii.gz); throws as read_nifti does.
VolumeHeader read_nifti_header(const std::string& path, const NiftiReadOptions& options = {});
/// The VolumeHeader of a parsed header; `source` names the file in errors.
VolumeHeader volume_header(const nifti::Header& header, const std::string& source);

/// Turns raw bytes into a Volume (adopts the buffer; widens and scales as above).
Volume volume_from_raw(nifti::RawImage raw, const std::string& source);

/// Writes `volume` to `path` atomically (temporary file, fsync, rename);
/// gzip if the name ends in .gz.
void write_nifti(const std::string& path, const Volume& volume, const NiftiWriteOptions& options = {});

/// The tensor dtype read_nifti gives for a header ("int16", "float32"...):
/// widened for unsigned types, nibabel's float type when scaled.
std::string memory_dtype(const nifti::Header& header);

/// The header write_nifti would write for `volume`.
nifti::Header header_for(const Volume& volume, const NiftiWriteOptions& options = {});

}  // namespace medfast
