// medfast data synth: the built-in synthetic dataset; medfast data convert: DICOM (or NIfTI)
// to NIfTI.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/os/file.hpp"

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
  bool overwrite = false;
  bool json = false;
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

}  // namespace

Command register_data(CLI::App& root) {
  auto* data = root.add_subcommand("data", "Datasets");
  data->require_subcommand(1);
  auto* synth = data->add_subcommand(
      "synth", "Write a synthetic spleen-like CT dataset in the Medical Segmentation Decathlon layout");
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

  Command c;
  c.app = data;
  c.run = [a, ca, convert](Context& ctx) {
    if (convert->parsed()) return run_convert(*ca, ctx);
    SynthOptions o;
    o.out_dir = a->out;
    o.set_cases(a->cases);
    if (!a->size.empty()) o.set_size(a->size);
    if (!a->spacing.empty()) {
      std::string spec;
      for (const auto& w : a->spacing) spec += (spec.empty() ? "" : ",") + w;
      o.set_spacing_spec(spec);
    }
    o.set_modality(a->modality);
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
