#pragma once
/// \file
/// The data section of a run's config (YAML or JSON):
///
///   data:
///     dataset: data/spleen-synth/dataset.json   # MSD dataset.json, JSON list with folds, or CSV
///     section: training
///     fold: 0                    # optional: train on the other folds
///     deterministic:             # cached chain, MONAI names and arguments
///       - {name: LoadImage, keys: [image, label]}
///       - ...
///     random: [...]              # the random chain (applied after the cache)
///     seed: 0                    # run seed of the random chain and the shuffle
///     loader: {batch_size: 2, threads: 2, shuffle: true, drop_last: false, repeats: 1, prefetch: 4, pin_memory: false}
///     cache: {kind: disk, dir: cache/spleen, cache_rate: 1.0, content_hash: false}
///       # kind: memory | device | disk | disk_device | smart (with cache_num, replace_rate)
///     validation: {num: 9}       # validation items: the last num of the section (MONAI's
///                                # tutorial split), or {section: validation}; with `fold`,
///                                # the fold's items by default
///     synth: {cases: 12, size: "96,96,24-32", spacing: [1.6, 1.6, 3.0], seed: 0}
///                                # optional: write a synthetic dataset (data synth) at
///                                # `dataset`'s folder first when the list does not exist
///   settings: {threads: 2}       # medfast settings (see `medfast config show`)
///
/// Relative paths are relative to the config file's folder.

#include <array>
#include <nlohmann/json.hpp>
#include <string>

#include "medfast/core/settings.hpp"
#include "medfast/data/cached_dataset.hpp"
#include "medfast/data/loader.hpp"
#include "medfast/data/smart_cache.hpp"
#include "medfast/data/synth.hpp"

namespace medfast::data {

#define MEDFAST_CACHE_KIND_LISTED(name, disk) #name ","
/// data.cache.kind's choices: the store kinds (cache/store.hpp), then smart (a rotating
/// memory cache of the training items, smart_cache.hpp).
inline constexpr const char* kCacheKindChoices = MEDFAST_CACHE_KINDS(MEDFAST_CACHE_KIND_LISTED) "smart";
#undef MEDFAST_CACHE_KIND_LISTED

/// data.cache as written (PipelineConfig::cache and smart_options are what it resolves to).
struct CacheSectionOptions {
  std::string kind = "memory";  ///< one of kCacheKindChoices
  std::string dir;              ///< disk kinds: the cache folder (relative: to the config's folder)
  double cache_rate = 1.0;
  bool content_hash = false;
  std::int64_t cache_num = 0;  ///< smart: items resident at once
  double replace_rate = 0.1;   ///< smart: share of them replaced per epoch
  static constexpr auto fields() {
    using O = CacheSectionOptions;
    return std::make_tuple(
        field("kind", &O::kind, "where cached items are kept").one_of(kCacheKindChoices),
        field("dir", &O::dir, "disk kinds: the cache folder (relative: to the config's folder)"),
        field("cache_rate", &O::cache_rate, "share of the items cached, in 0..1 (MONAI's cache_rate)"),
        field("content_hash", &O::content_hash, "key entries by the files' contents, not their names, sizes and times"),
        field("cache_num", &O::cache_num, "smart: items resident at once"),
        field("replace_rate", &O::replace_rate, "smart: share of the resident items replaced per epoch"));
  }
};

/// data.synth as written: the synthetic dataset prepare_dataset writes where data.dataset
/// points when that list does not exist yet (the options of `data synth`).
struct SynthSectionOptions {
  int cases = kDefaultSynthCases;
  std::string size;  ///< "": data synth's default sizes
  std::array<double, 3> spacing = kDefaultSynthSpacing;
  std::array<double, 3> spacing_max{0, 0, 0};
  std::uint64_t seed = 0;
  std::string format = "nifti";
  std::string modality = "CT";
  std::string kind = "spleen";
  static constexpr auto fields() {
    using O = SynthSectionOptions;
    return std::make_tuple(
        field("cases", &O::cases, "cases written").range(1, 100000),
        field("size", &O::size,
              "X,Y,Z voxels, each a size or a range lo-hi drawn per case (\"\": 512,512,40-100, as data synth)"),
        field("spacing", &O::spacing, "voxel spacing in mm"),
        field("spacing_max", &O::spacing_max,
              "per axis, where above spacing, each case's spacing is drawn from [spacing, spacing_max] (0: spacing)"),
        field("seed", &O::seed, "the same seed writes the same files"),
        field("format", &O::format, "nifti: the MSD layout; dicom: CT series with a SEG and an RTSTRUCT per case")
            .one_of("nifti,dicom"),
        field("modality", &O::modality, "CT: Hounsfield units; MR: T1-like intensities (NIfTI only)").one_of("CT,MR"),
        field("kind", &O::kind,
              "spleen: spleen-like CT (MSD Task09); brats: MSD Task01-shaped brain tumour MR, 4 channels (its grid "
              "240,240,155 at 1 mm where size and spacing are not given)")
            .one_of("spleen,brats"));
  }
};

struct PipelineConfig {
  std::string path;  ///< the config file
  Dataset dataset;
  Dataset validation;  ///< empty when the config names no validation items
  nlohmann::json deterministic = nlohmann::json::array();
  nlohmann::json random = nlohmann::json::array();
  CacheConfig cache;
  std::uint64_t seed = 0;
  LoaderOptions loader;
  SmartCacheOptions smart_options;
  CacheSectionOptions cache_options;  ///< data.cache as written, defaults filled in
  /// data.labels: a region run's regions, their names and regions_class_order (what `plan`
  /// writes for an nnU-Net v2 region dataset; infer writes one label map by that order).
  DatasetLabels labels;
  /// data.cache.kind is smart (smart_options apply, not cache).
  bool smart() const { return cache_options.kind == "smart"; }
  /// data.class_names: the names of the classes the metrics report (softmax: the foreground
  /// classes 1..N-1; sigmoid: every output channel, a region each); empty: derived from the
  /// dataset list's labels and the label chain (train::metric_class_names).
  std::vector<std::string> class_names;
  /// The largest output a transform of its chains may allocate (the max_volume_bytes
  /// setting); the chains made below carry it.
  std::uint64_t max_volume_bytes = kDefaultMaxVolumeBytes;
};

/// data.labels of a run config: {names: [...], regions: [[1, 2, 3], ...], regions_class_order:
/// [1, 2, 3]}. ConfigError naming `path` and the key.
DatasetLabels read_run_labels(const nlohmann::json& labels, const std::string& path);

/// YAML (or JSON, which is YAML) to JSON: numbers, booleans and null typed.
nlohmann::json load_yaml_as_json(const std::string& path);
/// The same for text; `what` names it in the FormatError.
nlohmann::json parse_yaml(const std::string& text, const std::string& what);

/// `settings` with the config's `settings:` map applied below flags and the environment
/// (a copy; `settings` is not changed). ConfigError naming the file and the key.
Settings with_config_settings(const Settings& settings, const nlohmann::json& root, const std::string& path);

/// Reads the data section and the dataset lists it names. Pure: it writes nothing and
/// changes no process state (no global limit, no environment read; the cache's rank is
/// 0 of 1 until the caller sets it, e.g. with CacheConfig::from_environment). The
/// config's `settings:` apply to it. Throws ConfigError naming the file and the key; a
/// data.synth whose dataset is not written yet is one (prepare_dataset writes it).
PipelineConfig load_pipeline(const std::string& path, const Settings& settings);
/// The same from an already parsed config; relative paths are relative to
/// `base_dir`, and `path` names the config in messages.
PipelineConfig load_pipeline(const nlohmann::json& root, const std::string& path, const std::string& base_dir,
                             const Settings& settings);

/// The explicit step before a run reads its data: writes data.synth's dataset where
/// data.dataset points when that list does not exist yet (a finished `data synth`
/// writes dataset.json last). True when it wrote one; false without data.synth or with
/// the list already there. The CLI and the Python API call it once, before reading.
bool prepare_dataset(const nlohmann::json& root, const std::string& path, const std::string& base_dir,
                     const Settings& settings);

/// The steps before a pipeline runs, in the one order the CLI (cache, bench) and the
/// Python API (medfast.data.Pipeline) take them: prepare_dataset, load_pipeline, then the
/// cache's rank and world size from the launcher's environment (torchrun, srun).
PipelineConfig open_pipeline(const nlohmann::json& root, const std::string& path, const std::string& base_dir,
                             const Settings& settings);

/// Builds the cached dataset the config describes (training items).
CachedDataset make_cached_dataset(const PipelineConfig& config);
/// The validation items through the same deterministic chain and cache kind
/// (ValueError when the config has none).
CachedDataset make_validation_dataset(const PipelineConfig& config);
/// Builds the random chain (data.random) with data.seed.
transforms::RandomChain make_random_chain(const PipelineConfig& config);
/// Builds the smart cache the config describes (cache.kind: smart).
std::unique_ptr<SmartCacheDataset> make_smart_cache(const PipelineConfig& config);

}  // namespace medfast::data
