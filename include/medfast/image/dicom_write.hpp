#pragma once
/// \file
/// Writing DICOM (explicit VR little endian) without libtorch: a CT series, one file per
/// slice, a binary DICOM SEG and an RT Structure Set on it. `medfast data synth --format dicom` uses these to
/// write an NSCLC-like set; files are written atomically (temporary name, fsync, rename).
/// Nothing identifies a person: patient fields hold "SYNTHETIC" values.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/image/affine.hpp"

namespace medfast::dicom {

/// A deterministic UID under the 2.25 (UUID-derived) root from `parts`.
std::string make_uid(const std::string& parts);

/// A CT volume to write: `hu` holds shape[0]*shape[1]*shape[2] Hounsfield units with x
/// fastest; the affine maps [x][y][z] to RAS+ mm and must have orthogonal columns.
struct CtToWrite {
  std::array<std::int64_t, 3> shape{};
  const std::int16_t* hu = nullptr;
  Affine affine;
  std::string study_uid, series_uid, frame_of_reference_uid;
  std::string patient_id = "SYNTHETIC";  ///< not a person: synthetic data only
  std::string description = "medfast synthetic CT";
  int intercept = -1024;                 ///< stored = HU - intercept (as scanners store CT)
};

/// Writes one file per slice into `dir` (created), named in shuffled order, not by
/// position; returns each slice's SOPInstanceUID, by z.
std::vector<std::string> write_ct_series(const std::string& dir, const CtToWrite& ct);

/// Writes a binary SEG with one segment (`segment_label`, number 1) for `label` != 0 (x
/// fastest, on the CT's grid), with frames only for slices that hold the segment.
void write_seg(const std::string& file, const CtToWrite& ct, const std::vector<std::string>& ct_sop_uids,
               const std::uint8_t* label, const std::string& segment_label);

/// Writes an RT Structure Set with one ROI (`roi_name`, number 1) for `label` != 0: one
/// CLOSED_PLANAR contour per run of label voxels along a row (the run's voxel squares'
/// outline), which fills back to exactly `label` by the even-odd rule.
void write_rtstruct(const std::string& file, const CtToWrite& ct, const std::vector<std::string>& ct_sop_uids,
                    const std::uint8_t* label, const std::string& roi_name);

}  // namespace medfast::dicom
