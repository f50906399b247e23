#pragma once
/// \file
/// `medfast data synth`: a deterministic, spleen-like abdominal CT dataset in
/// the Medical Segmentation Decathlon layout (imagesTr/, labelsTr/,
/// dataset.json). Images are int16 Hounsfield units (air, a body with a fat
/// layer, a spine, noise, and one organ of random size and place); labels are
/// uint8 (0 background, 1 organ). Spacing is anisotropic and the affine is
/// LPS, not RAS, so orientation and spacing code is exercised. Options make the
/// planner's test sets: a spacing drawn per case, MR-like intensities.
///
/// `kind` brats writes an MSD Task01 (BrainTumour)-shaped set instead: 4-D images of 4 MR
/// channels in MSD's order (FLAIR, T1w, t1gd, T2w; 0 outside the brain, as skull-stripped
/// BraTS images are) and labels 0..3 as MSD labels them (1 edema, 2 non-enhancing tumour,
/// 3 enhancing tumour), the tumour's sub-regions nested: edema around a core whose rim
/// enhances around a non-enhancing centre, so that BraTS's regions (WT 1|2|3, TC 2|3,
/// ET 3 in MSD's numbering) are nested as in the real data.
///
/// Each case draws from its own generator seeded with (seed, case index), and
/// each slice's noise from (seed, case, slice), so the output is identical for
/// a seed whatever the thread count.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/image/volume.hpp"

namespace medfast {

inline constexpr int kDefaultSynthCases = 8;
inline constexpr std::array<std::int64_t, 3> kDefaultSynthSizeMin{512, 512, 40};
inline constexpr std::array<std::int64_t, 3> kDefaultSynthSizeMax{512, 512, 100};
inline constexpr std::array<double, 3> kDefaultSynthSpacing{0.8, 0.8, 5.0};
/// kind brats: MSD Task01's grid (240 x 240 x 155 at 1 mm).
inline constexpr std::array<std::int64_t, 3> kBratsSynthSize{240, 240, 155};
inline constexpr std::array<double, 3> kBratsSynthSpacing{1.0, 1.0, 1.0};

/// Options of the synthetic dataset.
struct SynthOptions {
  std::string out_dir;
  int cases = kDefaultSynthCases;
  /// Each case's size is drawn uniformly from [size_min, size_max] per axis.
  std::array<std::int64_t, 3> size_min = kDefaultSynthSizeMin;
  std::array<std::int64_t, 3> size_max = kDefaultSynthSizeMax;
  std::array<double, 3> spacing = kDefaultSynthSpacing;
  /// Per axis, where above `spacing`: each case's spacing is drawn uniformly from
  /// [spacing, spacing_max] (0: every case has `spacing`).
  std::array<double, 3> spacing_max{0, 0, 0};
  /// "CT": Hounsfield units (air -1000 around the body); "MR": MR-like intensities, 0 around
  /// the body, each case scaled by its own factor (MR intensities are not calibrated).
  std::string modality = "CT";
  std::uint64_t seed = 0;
  int threads = 1;
  int gzip_level = 6;
  /// "nifti": the MSD layout (imagesTr/, labelsTr/); "dicom": an NSCLC-like set, per case a
  /// CT series folder (case_N/CT/, one file per slice) and a DICOM SEG (case_N/seg.dcm) with
  /// the lesion as segment "GTV-1".
  std::string format = "nifti";
  /// "spleen": the spleen-like CT (or MR) set; "brats": MSD Task01-shaped (see the file's
  /// comment; NIfTI only, modality not applicable).
  std::string kind = "spleen";

  SynthOptions& set_cases(int v);
  /// "spleen" or "brats"; ValueError otherwise. brats sets Task01's grid (kBratsSynthSize at
  /// kBratsSynthSpacing): set sizes and spacings after it.
  SynthOptions& set_kind(const std::string& v);
  /// "nifti" or "dicom"; ValueError otherwise.
  SynthOptions& set_format(const std::string& v);
  /// "X,Y,Z" where each entry is a size or a range "lo-hi".
  SynthOptions& set_size(const std::string& spec);
  SynthOptions& set_spacing(const std::array<double, 3>& v);
  /// Per axis the top of the range each case's spacing is drawn from (0: `spacing`).
  SynthOptions& set_spacing_max(const std::array<double, 3>& v);
  /// "X,Y,Z" where each entry is a spacing or a range "lo-hi" drawn per case.
  SynthOptions& set_spacing_spec(const std::string& spec);
  /// "CT" or "MR"; ValueError otherwise.
  SynthOptions& set_modality(const std::string& v);
  /// Case `index`'s spacing (drawn from its own generator: the other draws do not change).
  std::array<double, 3> spacing_of(int index) const;
  /// Throws ValueError naming the bad option.
  void validate() const;
};

/// One synthetic case: image (int16 HU; kind brats: int16 x 4 channels, the last dim) and
/// label (uint8), same geometry.
struct SynthCase {
  Volume image;
  Volume label;
};
SynthCase make_synth_case(const SynthOptions& options, int index);

struct SynthResult {
  std::vector<std::string> images, labels;  ///< paths relative to out_dir
  std::uint64_t bytes = 0;                  ///< bytes written
  double seconds = 0;
};
/// Writes the dataset (files atomically, dataset.json last).
SynthResult synthesize_dataset(const SynthOptions& options);

}  // namespace medfast
