// medfast data synth: the built-in synthetic dataset; medfast data convert: DICOM (or NIfTI)
// to NIfTI; medfast data check: a dataset checked before training (data/check.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/progress.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/check.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/plan/dataset.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::cli {

namespace {
struct SynthArgs {
  std::string out;
  int cases = kDefaultSynthCases;
  std::string size;
  std::vector<std::string> spacing;  ///< "X,Y,Z" or three words (each a number or lo-hi)
  std::string modality = "CT";
  std::uint64_t seed = 0;
  std::string format = "nifti";
  std::string kind = "spleen";
  bool overwrite = false;
  bool json = false;
};

struct CheckArgs {
  std::string config, dataset;
  std::vector<std::string> sets;
  bool headers_only = false, json = false;
};

struct ConvertArgs {
  std::string in, out, reference, series_uid, label_dict;
  bool json = false;
};

/// --label-dict: JSON such as '{"GTV-1": 1}' or '[["GTV-1", 1], ["Lung", 2]]' (in order).
dicom::LabelDict parse_label_dict(const std::string& text) {
  if (text.empty()) return {};
  nlohmann::json j;
  try {
    j = parse_json_document(text, "data convert: --label-dict");
  } catch (const FormatError& e) {
    throw ValueError(str(e.message(), " (expected e.g. '{\"GTV-1\": 1}')"));
  }
  if (j.is_null()) throw ValueError("data convert: --label-dict: expected a JSON object or a list of [name, class] pairs");
  try {
    return dicom::parse_label_dict(j);
  } catch (const ValueError& e) {
    throw ValueError(str("data convert: --label-dict: ", e.what()));
  }
}

int run_convert(const ConvertArgs& a, Context& ctx) {
  ImageReadOptions o;
  o.nifti = NiftiReadOptions::from(ctx.settings);
  o.series_uid = a.series_uid;
  o.label_dict = parse_label_dict(a.label_dict);
  const auto t0 = std::chrono::steady_clock::now();
  Volume v;
  if (is_dicom(a.in) && dicom::is_seg_file(a.in)) {
    if (a.reference.empty()) {
      throw ValueError(str("data convert: ", a.in, " is a DICOM SEG or RT Structure Set: give --reference SERIES_DIR, the CT series it labels"));
    }
    const Volume reference = read_image(a.reference, o);
    v = read_seg_volume(a.in, reference, o);
    v.meta.intent_code = 1002;  // NIFTI_INTENT_LABEL
  } else {
    if (!a.reference.empty()) throw ValueError(str("data convert: --reference is for a DICOM SEG or RT Structure Set; ", a.in, " is not one"));
    v = read_image(a.in, o);
  }
  v.meta.descrip = v.meta.dicom ? "medfast data convert (DICOM)" : v.meta.descrip;
  write_nifti(a.out, v, NiftiWriteOptions::from(ctx.settings));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto shape = v.shape();
  if (a.json) {
    print_json(nlohmann::json{{"in", a.in}, {"out", a.out}, {"shape", shape}, {"dtype", v.dtype_name()},
                              {"orientation", v.axcodes()}, {"spacing", v.spacing()}, {"seconds", seconds}}
                   .dump(2));
  } else {
    std::string sh;
    for (auto s : shape) sh += (sh.empty() ? "" : " x ") + std::to_string(s);
    std::printf("wrote %s: %s %s, %s, in %.2f s\n", a.out.c_str(), sh.c_str(), v.dtype_name().c_str(),
                v.axcodes().c_str(), seconds);
  }
  return 0;
}

/// What `data check` checks: a run config's training and validation items against its
/// model, or a list's training items against its "labels".
struct CheckTarget {
  data::Dataset training, validation;
  data::DatasetCheckOptions options;
};

CheckTarget check_target(const CheckArgs& a, Context& ctx) {
  CheckTarget t;
  if (!a.dataset.empty()) {
    const std::string list = plan::dataset_list_path(a.dataset);
    t.training = data::load_dataset(list, "training");
    const auto names = data::list_label_names(list);
    if (!names.empty()) {
      std::vector<std::int64_t> values;
      for (const auto& [v, name] : names) values.push_back(v);
      std::string text;
      for (const auto v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
      t.options.labels.allowed = values;
      t.options.labels.source = str("the list's 'labels' name ", text);
    }
    return t;
  }
  // As `train` reads it (a data.synth dataset not written yet is written first).
  const nlohmann::json config = run_config_of(a.config, a.sets);
  train::prepare_run(config, a.config, ctx.settings);
  const train::RunConfig c = train::load_run_config(config, a.config, ctx.settings);
  t.training = c.data.dataset;
  t.validation = c.data.validation;
  t.options.image_key = c.train.image_key;
  t.options.label_key = c.train.label_key;
  const std::string where = c.path + ": model";
  t.options.labels =
      data::LabelRule::classes(nn::output_channels(nn::parse_network(c.model, where), where), "model.out_channels");
  if (c.data.labels.has_regions()) {  // a region run: label files hold the regions' values, one output per region
    std::set<std::int64_t> values{0};
    for (const auto& region : c.data.labels.regions) values.insert(region.begin(), region.end());
    t.options.labels.allowed.assign(values.begin(), values.end());
    std::string text;
    for (const auto v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
    t.options.labels.source = str("data.labels.regions hold ", text);
  }
  t.options.channels = c.model.value("in_channels", std::int64_t{1});
  return t;
}

int run_check(const CheckArgs& a, Context& ctx) {
  CheckTarget t = check_target(a, ctx);
  t.options.read_labels = !a.headers_only;
  t.options.threads = ctx.settings.threads();
  std::unique_ptr<Progress> progress;
  if (!a.json) {
    t.options.progress = [&](std::size_t done, std::size_t total) {
      if (!progress) {
        progress = std::make_unique<Progress>("data check", total, "cases",
                                              Progress::style_from(ctx.settings.get("progress")));
      }
      progress->update(done);
    };
  }
  const data::DatasetCheckReport r = data::check_dataset(t.training, t.validation, t.options);
  if (progress) progress->finish(/*clear=*/true);
  if (a.json) {
    print_json(r.to_json().dump(2));
  } else {
    for (const auto& f : r.findings) std::printf("%s: %s\n", f.error() ? "error" : "warning", f.text().c_str());
    const std::size_t e = r.errors(), w = r.warnings();
    std::printf(
        "checked %zu cases of %s (%zu training, %zu validation): %zu headers, %s in %.2f s: %zu error%s, "
        "%zu warning%s\n",
        r.training + r.validation, r.list.c_str(), r.training, r.validation, r.headers,
        a.headers_only ? "no label voxels (--headers-only)"
                       : str(r.labels_read, " labels read (", format_bytes(r.label_bytes), ")").c_str(),
        r.seconds, e, e == 1 ? "" : "s", w, w == 1 ? "" : "s");
  }
  std::fflush(stdout);
  if (r.errors() > 0) {
    std::fprintf(stderr, "medfast: error: data check: %zu error%s in %s\n", r.errors(), r.errors() == 1 ? "" : "s",
                 r.list.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Command register_data(CLI::App& root) {
  auto* data = root.add_subcommand("data", "Datasets");
  data->require_subcommand(1);
  auto* synth = data->add_subcommand(
      "synth",
      "Write a synthetic dataset in the Medical Segmentation Decathlon layout: spleen-like CT (Task09), or with "
      "--kind brats brain-tumour MR (Task01: 4 channels FLAIR, T1w, t1gd, T2w; labels 1 edema, 2 non-enhancing, "
      "3 enhancing tumour)");
  auto a = std::make_shared<SynthArgs>();
  synth->add_option("--out", a->out, "Output folder (imagesTr/, labelsTr/, dataset.json)")->required();
  synth->add_option("--cases", a->cases, "Number of cases")->capture_default_str();
  synth->add_option("--size", a->size,
                    str("X,Y,Z voxels, each a size or a range lo-hi drawn per case [default ", kDefaultSynthSizeMin[0],
                        ",", kDefaultSynthSizeMin[1], ",", kDefaultSynthSizeMin[2], "-", kDefaultSynthSizeMax[2], "]"));
  synth->add_option("--spacing", a->spacing,
                    "Voxel spacing in mm: X,Y,Z, each a number or a range lo-hi drawn per case [default 0.8,0.8,5]")
      ->expected(1, 3);
  synth->add_option("--modality", a->modality,
                    "CT: Hounsfield units; MR: T1-like intensities, 0 outside the body, scaled per case (NIfTI only)")
      ->capture_default_str();
  synth->add_option("--seed", a->seed, "Seed: the same seed writes the same files")->capture_default_str();
  synth
      ->add_option("--kind", a->kind,
                   "spleen: spleen-like abdominal CT (MSD Task09); brats: MSD Task01-shaped brain tumour MR, 4-D "
                   "images of 4 channels (default grid 240,240,155 at 1 mm; NIfTI only)")
      ->capture_default_str();
  synth
      ->add_option("--format", a->format,
                   "nifti: the MSD layout; dicom: an NSCLC-like set (per case a CT series folder, and the lesion as "
                   "segment GTV-1 of a DICOM SEG and as RT Structure Set contours)")
      ->capture_default_str();
  synth->add_flag("--overwrite", a->overwrite,
                  "Write into a folder that holds a dataset (its dataset.json is replaced and lists only the new "
                  "cases; files of the old dataset that the new one does not name stay)");
  synth->add_flag("--json", a->json, "Print JSON");

  auto ca = std::make_shared<ConvertArgs>();
  auto* convert = data->add_subcommand(
      "convert", "Write a DICOM series (a folder or a multi-frame file), a DICOM SEG or an RTSTRUCT as NIfTI");
  convert->add_option("--in", ca->in, "A DICOM series folder, a DICOM file, a SEG or RTSTRUCT file or a NIfTI file")->required();
  convert->add_option("--out", ca->out, "The .nii or .nii.gz to write")->required();
  convert->add_option("--reference", ca->reference, "For a SEG or RTSTRUCT: the DICOM series folder it labels");
  convert->add_option("--series-uid", ca->series_uid, "The SeriesInstanceUID to read from a folder with several");
  convert->add_option("--label-dict", ca->label_dict,
                      "For a SEG or RTSTRUCT: class numbers by segment (ROIName), JSON: '{\"GTV-1\": 1}' or '[[\"GTV-1\", 1], ...]' "
                      "(later entries win where segments overlap) [default: each segment's SegmentNumber]");
  convert->add_flag("--json", ca->json, "Print JSON");

  auto ka = std::make_shared<CheckArgs>();
  auto* check = data->add_subcommand(
      "check",
      "Check a dataset before training (nnU-Net's --verify_dataset_integrity), each finding naming its file. "
      "Errors: an item without its image or label file, or a file missing; an entry (image and label) listed "
      "twice; a validation case that is also a training case; a 2-D image; channels other than the model's (or "
      "most cases'); a label not on its image's grid (shape, spacing, affine to 0.001 mm); label values that are "
      "not whole numbers, or not among the model's classes (--dataset: the list's 'labels'); no training label "
      "with foreground. Warnings: an image 1 voxel thick; a label without foreground (no validation label with "
      "foreground: Dice NaN, no best.ckpt). Reads every header and every label's voxels (train checks the headers "
      "before its cache fill, and the labels as the fill reads them). Exit status 1 on errors, 0 with warnings "
      "alone");
  auto* check_config = check
                           ->add_option("--config", ka->config,
                                        "Run config (YAML/JSON): its training and validation items, its model's "
                                        "classes and channels [default: the built-in default, as train]")
                           ->check(CLI::ExistingFile);
  check
      ->add_option("--dataset", ka->dataset,
                   "Instead of --config: a folder with dataset.json, or a list (JSON or CSV), as plan and train take "
                   "it: its training items, label values against its 'labels'")
      ->excludes(check_config);
  check->add_option("--set", ka->sets, "Override a config value: key.path=value (repeatable), as train's");
  check->add_flag("--headers-only", ka->headers_only,
                  "Lists, files and headers only, no label voxels (what train checks before its cache fill)");
  check->add_flag("--json", ka->json, "Print the findings and the counts as JSON");

  Command c;
  c.app = data;
  c.run = [a, ca, ka, convert, check, synth](Context& ctx) {
    if (convert->parsed()) return run_convert(*ca, ctx);
    if (check->parsed()) return run_check(*ka, ctx);
    SynthOptions o;
    o.out_dir = a->out;
    o.set_kind(a->kind);  // first: brats sets Task01's grid, which --size and --spacing then change
    if (o.kind == "brats" && synth->count("--modality") > 0) {
      throw ValueError("data synth: --modality does not apply to --kind brats (4 MR channels: FLAIR, T1w, t1gd, T2w)");
    }
    o.set_cases(a->cases);
    if (!a->size.empty()) o.set_size(a->size);
    if (!a->spacing.empty()) {
      std::string spec;
      for (const auto& w : a->spacing) spec += (spec.empty() ? "" : ",") + w;
      o.set_spacing_spec(spec);
    }
    if (o.kind != "brats") o.set_modality(a->modality);
    o.seed = a->seed;
    o.threads = ctx.settings.threads();
    o.gzip_level = static_cast<int>(ctx.settings.get_int("gzip_level"));
    o.set_format(a->format);
    if (!a->overwrite && os::exists(o.out_dir + "/dataset.json")) {
      throw ValueError(str("data synth: --out ", o.out_dir, " holds a dataset (", o.out_dir,
                           "/dataset.json): pass --overwrite to write over it, or choose another folder"));
    }
    const SynthResult r = synthesize_dataset(o);
    if (a->json) {
      print_json(nlohmann::json{{"out", o.out_dir},
                                {"cases", o.cases},
                                {"images", r.images},
                                {"labels", r.labels},
                                {"bytes", r.bytes},
                                {"seconds", r.seconds}}
                     .dump(2));
    } else {
      std::printf("wrote %d cases to %s (%s) in %.1f s\n", o.cases, o.out_dir.c_str(), format_bytes(r.bytes).c_str(),
                  r.seconds);
    }
    return 0;
  };
  return c;
}

}  // namespace medfast::cli
