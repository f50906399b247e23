#pragma once
/// \file
/// Reading an image whatever its format: NIfTI (.nii, .nii.gz), a DICOM series (a folder,
/// or a single multi-frame file) or a DICOM SEG placed on the series it labels.

#include <string>

#include "medfast/image/dicom.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/image/volume.hpp"

namespace medfast {

/// Options for read_image.
struct ImageReadOptions {
  NiftiReadOptions nifti;
  std::string series_uid;        ///< DICOM: the series to read from a folder ("": the largest)
  dicom::LabelDict label_dict;   ///< DICOM SEG: class numbers by segment (empty: SegmentNumber)

  dicom::ReadOptions dicom_options() const;
};

/// True when `path` is a DICOM folder or file rather than NIfTI.
bool is_dicom(const std::string& path);

/// Reads NIfTI or a DICOM image series into a Volume (DICOM: int16 or float32 HU, the
/// series kept in meta.dicom). A SEG file here is an error that says to load it with its
/// series (read_seg_volume).
Volume read_image(const std::string& path, const ImageReadOptions& options = {});

/// A DICOM SEG as a uint8 label volume on the grid of `reference` (a Volume read from the
/// DICOM series the SEG references).
Volume read_seg_volume(const std::string& file, const Volume& reference, const ImageReadOptions& options = {});

/// The meta of a volume read from DICOM with this affine (NIfTI's scanner-anatomical qform and
/// sform, millimetres, pixdim from the affine), read from `source`; meta.dicom left empty.
VolumeMeta dicom_volume_meta(const Affine& affine, const std::string& source);

/// A decoded DICOM image as a Volume (adopts the buffer).
Volume volume_from_dicom(dicom::Image image, const std::string& source);

}  // namespace medfast
