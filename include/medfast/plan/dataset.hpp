#pragma once
/// \file
/// A dataset's fingerprint (nnU-Net v2's DatasetFingerprintExtractor): every training case
/// read once (NIfTI or DICOM, on threads), reoriented to RAS as the run's Orientation step
/// does, and summarised: its shape and spacing, its crop to the nonzero region, label
/// classes and their voxels, foreground intensity samples per channel. Cases that cannot
/// be planned with are left out with a note that names the file, what is off and what the
/// plan did; the others are kept, some with a note (a spacing 10x off, no foreground).
///
/// The per-case summaries are cached beside the dataset list (`fingerprint_cache_path`),
/// keyed by each case's files' identities (absolute path, size, mtime; DICOM: every file of
/// the series), so a second plan of the same data reads no image; other lists' cases in the
/// same folder stay in the cache.
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/data/dataset.hpp"
#include "medfast/plan/fingerprint.hpp"

namespace medfast::plan {

/// One case as the plan sees it (axes RAS, as the run's Orientation step leaves them).
struct CaseSummary {
  std::string image;                     ///< the image's path as the list gives it, resolved
  std::string label;                     ///< the label's
  std::string axcodes;                   ///< the file's orientation before reorienting
  Shape shape{};                         ///< voxels per axis (RAS)
  std::int64_t channels = 0;
  /// The label's channels: 1 (class indices), or a mask per channel (then label_voxels
  /// counts channel k's nonzero voxels as value k + 1).
  std::int64_t label_channels = 1;
  CaseFingerprint crop;                  ///< shape after the crop, its share, spacing, samples
  std::map<std::int64_t, std::int64_t> label_voxels;  ///< voxels per label value
};

/// A case left out or kept with a warning: which file, what is off, what the plan did.
struct CaseNote {
  std::string file;
  std::string problem;
  std::string action;
  bool excluded = false;
  std::string text() const { return file + ": " + problem + "; " + action; }
};

struct DatasetFingerprint {
  std::string list;                       ///< the dataset list (dataset.json or .csv)
  std::vector<std::string> channel_names;  ///< per channel: the list's modality / channel_names, else ""
  std::map<std::int64_t, std::string> label_names;  ///< from the list's "labels" (may be empty)
  data::DatasetLabels labels;  ///< the list's labels, with its regions (nnU-Net v2) where it has them
  /// The kept cases' label channels: 1, or masks per channel (a sigmoid run of that many outputs).
  std::int64_t label_channels = 1;
  std::vector<data::DatasetItem> items;   ///< the kept items, in list order
  std::vector<CaseSummary> cases;         ///< one per kept item
  std::vector<CaseNote> notes;            ///< per case, in list order; dataset-wide ones name the list
  std::size_t listed = 0;                 ///< training items in the list
  std::size_t read = 0;                   ///< cases read now (kept or not)
  std::size_t from_cache = 0;             ///< kept cases whose summaries came from the cache
  std::string cache_path;                 ///< where the summaries were cached ("" : not cached)
  double seconds = 0;

  /// The label values the plan trains: the list's "labels" where it names them, else every
  /// value a kept case has; 0 (background) always.
  std::vector<std::int64_t> classes() const;
  std::size_t excluded() const;
  /// Channel `channel`'s foreground samples of every kept case, pooled.
  std::vector<double> pooled_samples(std::size_t channel) const;
};

struct FingerprintOptions {
  int threads = 1;
  /// Foreground samples per channel over the whole dataset (nnU-Net: 1e8), split evenly
  /// over the cases; a case's cached samples serve while they are at least its share.
  std::int64_t total_samples = 1'000'000;
  std::uint64_t seed = 1234;  ///< each case draws from a generator seeded by this and its image's path in the list's folder
  bool use_cache = true;      ///< read and write the cache beside the list
  /// Called after each case (from the thread that read it; calls are serialised).
  std::function<void(std::size_t done, std::size_t total)> progress;
};

/// The list a --dataset argument names: DIR/dataset.json for a folder, else the file.
std::string dataset_list_path(const std::string& dataset);
/// The cache file beside `list`: <folder>/.medfast-fingerprint.cbor.
std::string fingerprint_cache_path(const std::string& list);

/// Reads the training section of the list at `dataset` (a folder with dataset.json, a
/// dataset.json or a CSV list). Per case: LoadImage (label: its file's type),
/// EnsureChannelFirst and Orientation RAS, then case_fingerprint. Left out, with a note: a
/// case that cannot be read, has no label, a channel count other than the list's (or most
/// cases'), a label whose shape or grid (affine) is not the image's, non-integer or negative
/// label values, or values the list's "labels" do not name. Kept with a note: a spacing 10x or more off
/// the median on an axis, no foreground, a class no other case has. FormatError naming the
/// list when it has no training items or no case is left.
DatasetFingerprint dataset_fingerprint(const std::string& dataset, const FingerprintOptions& options = {});

/// The fingerprint as JSON (`medfast plan --json`'s "fingerprint"): per case its file,
/// shape, spacing, orientation, crop; pooled: median shape, spacings, label voxel shares,
/// per-channel foreground statistics; the notes.
nlohmann::json fingerprint_json(const DatasetFingerprint& fingerprint);

}  // namespace medfast::plan
