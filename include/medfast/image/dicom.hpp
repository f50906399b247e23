#pragma once
/// \file
/// Reading DICOM CT series and DICOM Segmentation (SEG) objects, without libtorch.
///
/// medfast parses the files itself, read through its OS layer into memory, every element
/// and item length checked against the file (GDCM 3.0.21's parser aborts on some damaged
/// files). Compressed pixel data is decoded frame by frame after each frame's own header is
/// checked against Rows/Columns/Bits Allocated: RLE and lossless JPEG by medfast, JPEG-LS by
/// CharLS, JPEG 2000 by OpenJPEG, 8-bit lossy JPEG by libjpeg-turbo (src/image/
/// dicom_codecs.cpp). The geometry follows MONAI's PydicomReader: voxel [x][y][z] is column
/// x, row y of the z-th slice after sorting the slices by their
/// ImagePositionPatient along the slice normal; the affine maps it to RAS+ millimetres.
///
/// Patient identifiers (PatientName, PatientID, dates, AccessionNumber, ...) are read only
/// when ScanOptions::phi asks for them (`medfast info --phi`); nothing else ever holds them,
/// so they cannot reach cache entries, logs or reports.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "medfast/core/settings.hpp"
#include "medfast/image/affine.hpp"
#include "medfast/os/memory.hpp"

namespace medfast::dicom {

/// Options for reading DICOM.
struct ReadOptions {
  int threads = 1;                ///< files parsed and decoded in parallel
  std::string series_uid;         ///< the series to read from a folder ("": the one with most slices)
  std::uint64_t max_volume_bytes = kDefaultMaxVolumeBytes;
  bool phi = false;               ///< also read patient identifiers (for `info --phi` only)

  ReadOptions& set_threads(int v) { threads = v < 1 ? 1 : v; return *this; }
  ReadOptions& set_series_uid(std::string v) { series_uid = std::move(v); return *this; }
  ReadOptions& set_max_volume_bytes(std::uint64_t v) { max_volume_bytes = v; return *this; }
  ReadOptions& set_phi(bool v) { phi = v; return *this; }
};

/// One slice (a file, or a frame of a multi-frame file).
struct Slice {
  std::string file;
  int frame = 0;                      ///< frame within the file (0 for single-frame files)
  std::string sop_instance_uid;
  std::array<double, 3> position{};   ///< ImagePositionPatient (LPS mm)
  double slope = 1, intercept = 0;    ///< RescaleSlope / RescaleIntercept
  double along_normal = 0;            ///< position projected on the slice normal
  // As this slice's header says (check_geometry compares them across the series):
  bool has_position = false, has_orientation = false;
  std::array<double, 6> orientation{};
  std::array<double, 2> pixel_spacing{};
  int rows = 0, columns = 0;
};

/// A segment of a SEG object.
struct Segment {
  int number = 0;
  std::string label;        ///< SegmentLabel
  std::string description;  ///< SegmentDescription ("" when absent)
  /// What a label_dict entry matches: SegmentDescription, else SegmentLabel (as MONAI).
  const std::string& key() const { return description.empty() ? label : description; }
};

inline constexpr std::uint64_t kUnknownPixelBytes = ~std::uint64_t{0};

/// A series as found in a folder (or one file), its slices sorted along the normal.
struct Series {
  std::string series_uid, study_uid, modality, description, sop_class_uid, transfer_syntax;
  int rows = 0, columns = 0;
  int bits_allocated = 0, bits_stored = 0, pixel_representation = 0;
  std::array<double, 6> orientation{};     ///< ImageOrientationPatient: row, then column direction
  std::array<double, 2> pixel_spacing{};   ///< PixelSpacing: between rows, between columns
  std::vector<Slice> slices;
  std::vector<std::string> files;          ///< every file of the series
  /// Per file (as `files`): the bytes its pixel data holds, from its element's length
  /// within the file's size (kUnknownPixelBytes where not known), checked against what
  /// its header announces before a volume is allocated.
  std::vector<std::uint64_t> pixel_bytes;
  double slice_thickness = 0;              ///< SliceThickness (spacing of a one-slice series)
  double slice_spacing = 0;                ///< median distance between consecutive slices
  double largest_deviation = 0;            ///< largest |distance - median| (mm)
  std::string dose_units;                  ///< RTDOSE: DoseUnits (GY, RELATIVE); values are scaled to it
  bool multi_frame = false;
  bool is_seg = false;                     ///< a label object: a SEG, or an RT Structure Set
  bool is_rtstruct = false;                ///< an RT Structure Set (its ROIs are the segments)
  std::vector<Segment> segments;           ///< SEG only
  std::vector<std::string> referenced_series;  ///< SEG only: ReferencedSeriesSequence UIDs
  /// Patient identifiers by keyword; filled only with ReadOptions::phi.
  std::map<std::string, std::string> phi;

  /// Voxel to RAS+ millimetres.
  Affine affine() const;
  /// Orientation codes of the affine ("LPS" for a plain axial CT read this way, ...).
  std::string axcodes() const;
};

/// What a folder (or a file) holds: its series, largest first, and the files skipped.
struct Scan {
  std::string path;
  std::vector<Series> series;
  std::vector<std::string> skipped;  ///< files that are not DICOM (names, with the reason)
};

/// The files of a folder (recursively) or the file itself, sorted by path.
std::vector<std::string> files_of(const std::string& path);

/// Parses the headers (up to the pixel data) of every file of a folder or of one file,
/// groups them into series and sorts each series' slices. Geometry is checked only when
/// a series is read (info shows a broken series rather than refusing the folder).
Scan scan(const std::string& path, const ReadOptions& options = {});

/// A decoded volume: `storage` holds shape[0]*shape[1]*shape[2] elements of `dtype`
/// ("int16", "float32" or "uint8") with x fastest (the NIfTI file order).
struct Image {
  std::array<std::int64_t, 3> shape{};
  std::string dtype;
  os::Buffer storage;
  Affine affine;
  std::shared_ptr<const Series> series;
};

/// Checks a series' geometry (sizes, orientation, spacing, missing slices) and computes
/// slice_spacing and largest_deviation; FormatError naming the file and the tag.
/// A small unevenness is logged as a warning (with the largest deviation).
void check_geometry(Series& series, const std::string& where);

/// Reads a CT/MR series from a folder, or a (multi-frame) file. Rescale applied: int16
/// when every slope and intercept is whole and the values fit, float32 otherwise.
Image read_series(const std::string& path, const ReadOptions& options = {});

/// Class numbers by segment key, applied in order (the later entry wins where segments
/// overlap). Empty: every segment gets its SegmentNumber, in ascending order.
using LabelDict = std::vector<std::pair<std::string, int>>;

/// A label_dict from JSON (LoadImage's argument, `data convert --label-dict`): a list of
/// [name, class] pairs, kept in order, or a mapping such as {"GTV-1": 1}, ordered by class;
/// null is empty. Classes are 0..255 (a uint8 label volume). ValueError saying what was
/// expected; callers add where the value came from.
LabelDict parse_label_dict(const nlohmann::json& j);

/// Reads the header of a SEG file (segments, referenced series); FormatError if the file
/// is not a SEG.
Series scan_seg(const std::string& file);

/// Places a SEG's frames on the grid of `reference` (a series read with read_series) and
/// combines its segments into one uint8 label volume by `labels`.
Image read_seg(const std::string& file, const Series& reference, const LabelDict& labels,
               const ReadOptions& options = {});

/// True when `path` is a folder, or a file that starts like DICOM (preamble "DICM", or a
/// group 0x0008 element at offset 0). NIfTI files answer false.
bool looks_like_dicom(const std::string& path);

/// True when the file is a DICOM SEG (Modality SEG or a SegmentSequence).
bool is_seg_file(const std::string& path);

/// Parses bytes already in memory as one DICOM file, as read_series/read_seg would
/// (headers, geometry of a one-file series, pixel decoding, compressed data up to 16 MiB
/// decoded so that no input takes seconds): the fuzz target's entry.
void parse_for_fuzzing(const void* data, std::size_t size);

}  // namespace medfast::dicom
