// `medfast eval` and `medfast infer`: a checkpoint's network over a config's
// validation items (Dice per case) or over images, NIfTI or DICOM (predictions
// written as NIfTI on the input's own grid).
#include <torch/torch.h>

#include "detail.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>

#include "medfast/core/config.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/dataset.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/os/folder_mark.hpp"
#include "medfast/os/process.hpp"
#include "medfast/train/amp.hpp"
#include "medfast/train/checkpoint.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/train/metrics.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/train/evaluate.hpp"
#include "medfast/train/placement.hpp"

#include "medfast/train/self_check.hpp"
#include "medfast/transforms/spatial.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::train {

namespace detail {

nlohmann::json without_pretrained(nlohmann::json model) {
  if (model.is_object()) model.erase("pretrained");
  return model;
}

Loaded load_network(const std::string& checkpoint, c10::Device device) {
  Loaded l;
  l.meta = read_checkpoint_meta(checkpoint);
  if (l.meta.value("format", "") != "medfast-checkpoint" || !l.meta.contains("config")) {
    throw FormatError(str("checkpoint ", checkpoint, ": not a medfast training checkpoint (no config inside)"));
  }
  l.any = nn::make_network(without_pretrained(l.meta["config"].at("model")), checkpoint + ": model");
  l.module = l.any.ptr();
  load_checkpoint(checkpoint, *l.module, nullptr);
  l.module->to(device);
  l.module->eval();
  return l;
}

}  // namespace detail

namespace {

using detail::Loaded;
using detail::load_network;
using detail::without_pretrained;

using detail::nan_to_null;

/// No checkpoint: the network of a run config whose model names `pretrained` weights (a
/// MONAI state_dict), with that config standing in for the checkpoint's.
Loaded load_pretrained(const nlohmann::json& config, const std::string& path, c10::Device device) {
  if (!config.is_object() || !config.contains("model") || !config["model"].is_object()) {
    throw ConfigError(str(path, ": model: expected a mapping with a name (UNet, SegResNet, SwinUNETR)"));
  }
  nlohmann::json model = config["model"];
  if (!model.contains("pretrained") || !model["pretrained"].is_string()) {
    throw ConfigError(str(path, ": model.pretrained is not set: pass --checkpoint (a medfast checkpoint) or set "
                          "model.pretrained to a state_dict file"));
  }
  const std::string base = path.empty() ? "." : os::parent_directory(path);
  model["pretrained"] = data::resolve_path(base, model["pretrained"].get<std::string>());
  Loaded l;
  l.meta = {{"format", "medfast-checkpoint"}, {"config", config}, {"config_dir", base}};
  l.meta["config"]["model"] = model;
  l.any = nn::make_network(model, path + ": model");
  l.module = l.any.ptr();
  l.module->to(device);
  l.module->eval();
  return l;
}

}  // namespace

nlohmann::json EvalResult::to_json() const {
  nlohmann::json cs = nlohmann::json::array();
  for (const auto& c : cases) {
    nlohmann::json d = nlohmann::json::array();
    for (double v : c.dice) d.push_back(nan_to_null(v));
    nlohmann::json j{{"image", c.image}, {"dice", d}};
    if (c.hd95) {
      nlohmann::json h = nlohmann::json::array();
      for (double v : *c.hd95) h.push_back(nan_to_null(v));
      j["hd95"] = h;
    }
    cs.push_back(j);
  }
  nlohmann::json per = nlohmann::json::array();
  for (double v : mean_per_class) per.push_back(nan_to_null(v));
  nlohmann::json j{{"cases", cs}, {"mean_dice_per_class", per}, {"class_names", class_names},
                   {"mean_dice", nan_to_null(mean_dice)}};
  if (mean_hd95) j["mean_hd95"] = nan_to_null(*mean_hd95);
  j["nonfinite_cases"] = nonfinite_cases;
  return j;
}

EvalResult evaluate(const std::string& checkpoint, nlohmann::json config, const std::string& path,
                    const Settings& settings_in, const EvalOptions& o) {
  const bool hd95 = o.hd95;
  const std::string& section = o.section;
  const c10::Device device = choose_device(o.device, "--device").device;
  if (checkpoint.empty() && config.is_null()) throw ValueError("eval: pass --checkpoint, or --config with model.pretrained");
  Loaded net = checkpoint.empty() ? load_pretrained(config, path, device) : load_network(checkpoint, device);
  std::string cfg_path = path, base_dir;
  if (config.is_null()) {  // the checkpoint's own config, anchored where it was written
    config = net.meta["config"];
    for (const auto& s : o.overrides) apply_override(config, s);
    cfg_path = checkpoint + " (its config)";
    base_dir = net.meta.value("config_dir", os::parent_directory(checkpoint));
  }
  prepare_run(config, cfg_path, settings_in, base_dir);  // its synthetic dataset, if it was one and is gone
  RunConfig c = load_run_config(config, cfg_path, settings_in, base_dir);
  const Settings& settings = c.settings;
  if (!checkpoint.empty() && without_pretrained(c.model) != without_pretrained(net.meta["config"]["model"])) {
    throw ValueError(str(c.path, ": model differs from the one ", checkpoint, " was trained with"));
  }
  apply_network_threads(c.train.threads, settings);
  apply_host_memory_reuse(settings);
  apply_conv_forward(settings);
  const Precision precision = parse_precision(o.amp, device.is_cuda(), "--amp");
  ensure_backends_checked(device, precision_dtype(precision), settings.get_bool("self_check"));
  apply_cuda_determinism(device, c.train.deterministic);  // as the run's validation did
  data::PipelineConfig p = c.data;
  if (!section.empty()) p.validation = data::load_dataset(p.dataset.source, section);
  if (p.validation.items.empty()) {
    throw ValueError(str(c.path, ": no items to evaluate (set data.validation or pass --section)"));
  }
  data::CachedDataset ds = data::make_validation_dataset(p);
  ds.fill();
  torch::NoGradGuard no_grad;
  const Predictor predict =
      detail::inference_predictor(net.meta["config"]["model"], net.any, settings, c.path + ": model", device, precision,
                                  c.validation.tta, resolve_memory_format(c.train.memory_format, device));
  EvalResult r;
  MeanMetric dice, hd;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const std::size_t global = ds.global_index(i);
    const detail::CaseScores scores =
        detail::score_case(ds.get(i), c, predict, device, hd95, str("evaluation item ", global));
    dice.add(scores.dice);
    if (scores.nonfinite_logits) ++r.nonfinite_cases;
    EvalCase ec;
    const auto& item = p.validation.items.at(global);
    ec.image = item.files.count(c.train.image_key) ? item.files.at(c.train.image_key).first() : "";
    for (std::int64_t k = 0; k < scores.dice.size(1); ++k) ec.dice.push_back(scores.dice[0][k].item<double>());
    if (hd95) {
      hd.add(scores.hd95);
      std::vector<double> hv;
      for (std::int64_t k = 0; k < scores.hd95.size(1); ++k) hv.push_back(scores.hd95[0][k].item<double>());
      ec.hd95 = hv;
    }
    r.cases.push_back(std::move(ec));
    if (o.on_progress) o.on_progress(i + 1, ds.size());
  }
  const at::Tensor per = dice.per_class().to(at::kDouble).contiguous();
  for (std::int64_t k = 0; k < per.numel(); ++k) r.mean_per_class.push_back(per[k].item<double>());
  // The classes scored: every channel of a sigmoid model, the foreground ones of a softmax.
  if (per.numel() > 0) r.class_names = metric_class_names(c, c.loss.sigmoid ? per.numel() : per.numel() + 1);
  r.mean_dice = dice.mean();
  if (hd95) r.mean_hd95 = hd.mean();
  if (r.nonfinite_cases > 0) {  // no score, rather than the mean of the other cases
    r.mean_dice = std::nan("");
    for (double& v : r.mean_per_class) v = std::nan("");
    if (r.mean_hd95) r.mean_hd95 = std::nan("");
  }
  return r;
}

namespace {

bool is_nifti_name(const std::string& name) {
  return ends_with(name, ".nii") || ends_with(name, ".nii.gz");
}

// `path` without trailing separators ("case/CT/" -> "case/CT"), so that its last component
// names it.
std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// One image --input names and the name of its output file (before the suffix).
struct InputImage {
  std::string path;
  std::string stem;       // the output's name: <stem><suffix><extension>
  std::string extension;  // ".nii" or ".nii.gz" (DICOM: .nii.gz)
  /// An nnU-Net case: its channel files, in order (path is the first); its output is named
  /// {case}{file_ending}, as nnU-Net names its predictions.
  std::vector<std::string> channels;
};

constexpr const char* kInferDescrip = "medfast infer";  // the NIfTI descrip of what infer writes

// A file `infer` wrote itself: listed in its folder's infer mark, or a NIfTI whose header says
// so. (A folder given as --input that is also the --output holds them after a first run.)
bool written_by_infer(const std::string& path) {
  const std::string folder = os::parent_directory(path);
  const std::string name = std::filesystem::path(path).filename().string();
  try {
    const std::optional<os::FolderMark> mark = os::read_folder_mark(folder);
    if (mark && mark->kind == os::kInferFolder && mark->lists(name)) return true;
    return is_nifti_name(path) && read_nifti_header(path).meta.descrip == kInferDescrip;
  } catch (const Error&) {
    return false;  // not readable as ours: an input like any other (its own error comes when it is read)
  }
}

// A NIfTI file's input, named after it.
InputImage nifti_input(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  const std::string ext = ends_with(name, ".nii.gz") ? ".nii.gz" : ".nii";
  return {path, name.substr(0, name.size() - ext.size()), ext, {}};
}

// The last component of a folder's path, also for "." or "case/CT/." ("image" for the root).
std::string folder_name(const std::string& folder) {
  std::filesystem::path p = std::filesystem::path(os::absolute_path(folder)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "/" ? "image" : name;
}

// nnU-Net's raw layout of a folder's NIfTI files ({case}_{XXXX}{file_ending}, one file a
// channel): the cases, each with its channels 0..n-1 in order, where every file (but those
// infer wrote) is named so; none otherwise. ValueError naming the case and the file where a
// case lacks a channel that others have.
std::vector<InputImage> nnunet_cases(const std::string& folder, const std::vector<std::string>& files) {
  std::map<std::pair<std::string, std::string>, std::map<int, std::string>> cases;  // (case, ending) -> channel -> file
  std::size_t channels = 0;
  for (const auto& path : files) {
    const std::string name = std::filesystem::path(path).filename().string();
    const std::string ending = ends_with(name, ".nii.gz") ? ".nii.gz" : ".nii";
    const auto [c, channel] = data::nnunet_channel_file(name, ending);
    if (channel < 0) return {};
    cases[{c, ending}][channel] = path;
    channels = std::max(channels, static_cast<std::size_t>(channel) + 1);
  }
  // Numbered scans of the user's (scan_0001, scan_0002) are not cases: the layout is taken for
  // nnU-Net's where every case has a channel 0 and the folder says so (imagesTs, imagesTr, a
  // raw dataset's dataset.json beside it) or holds several cases of as many channels each.
  bool starts_at_0 = true, same_count = true;
  for (const auto& [id, by_channel] : cases) {
    starts_at_0 = starts_at_0 && by_channel.count(0) > 0;
    same_count = same_count && by_channel.size() == cases.begin()->second.size();
  }
  const std::string name = folder_name(folder);
  const std::string parent_list = os::parent_directory(os::absolute_path(folder)) + "/dataset.json";
  const bool raw_list = [&] {
    try {
      return os::exists(parent_list) &&
             data::is_nnunet_raw(parse_json_document(os::read_text_file(parent_list), parent_list));
    } catch (const Error&) {
      return false;
    }
  }();
  const bool named = name == "imagesTs" || name == "imagesTr" || name.rfind("imagesTs", 0) == 0;
  if (cases.empty() || !starts_at_0 || !(named || raw_list || (cases.size() > 1 && same_count))) return {};
  std::vector<InputImage> out;
  for (const auto& [id, by_channel] : cases) {
    InputImage image{by_channel.begin()->second, id.first, id.second, {}};
    for (std::size_t k = 0; k < channels; ++k) {
      const auto it = by_channel.find(static_cast<int>(k));
      if (it == by_channel.end()) {
        char index[24];  // "_" and up to 20 digits
        std::snprintf(index, sizeof index, "_%04zu", k);
        throw ValueError(str("--input ", folder, ": case '", id.first, "' has no channel ", k, ": expected ", folder,
                             "/", id.first, index, id.second, " (other cases have ", channels,
                             " channels; nnU-Net names them {case}_{XXXX}", id.second, ")"));
      }
      image.channels.push_back(it->second);
    }
    image.path = image.channels.front();
    out.push_back(std::move(image));
  }
  return out;
}

// A DICOM image file (not a SEG or RT Structure Set).
bool dicom_image_file(const std::string& path) {
  return !is_nifti_name(path) && dicom::looks_like_dicom(path) && !dicom::is_seg_file(path);
}

// The images --input names, in order: a NIfTI file; a folder's .nii/.nii.gz files (sorted);
// a DICOM series: a folder that holds its files (read as LoadImage reads a folder), named
// after the folder, or a DICOM file (a multi-frame image), named after the file; a folder
// of neither: every folder below it that holds DICOM image files, one series each, named by
// its path below the given folder ("case_000/CT" -> "case_000_CT"). ValueError naming the
// input and what was expected.
std::vector<InputImage> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<InputImage> images;
  for (const auto& given : inputs) {
    const std::string in = without_trailing_slash(given);
    if (!os::exists(in)) throw ValueError(str("--input ", given, ": no such file or folder"));
    if (!os::stat(in).is_directory) {
      if (is_nifti_name(in)) {
        images.push_back(nifti_input(in));
      } else if (dicom::looks_like_dicom(in)) {
        if (dicom::is_seg_file(in)) {
          throw ValueError(str("--input ", given, ": a DICOM SEG or RT Structure Set holds labels, not an image ",
                               "(expected an image series: its folder, or a multi-frame file)"));
        }
        const std::string name = std::filesystem::path(in).filename().string();
        images.push_back(
            {in, ends_with(name, ".dcm") && name.size() > 4 ? name.substr(0, name.size() - 4) : name, ".nii.gz", {}});
      } else {
        throw ValueError(str("--input ", given, ": not a .nii or .nii.gz file, nor a DICOM file"));
      }
      continue;
    }
    std::vector<std::string> own_files;  // the folder's own files (list_directory sorts)
    std::vector<std::string> nifti_files, written;  // the folder's NIfTI inputs; what infer wrote there
    for (const auto& name : os::list_directory(in)) {
      const std::string path = in + "/" + name;
      if (!os::stat(path).is_regular) continue;
      if (is_nifti_name(name)) (written_by_infer(path) ? written : nifti_files).push_back(path);
      own_files.push_back(path);
    }
    if (!nifti_files.empty() || !written.empty()) {
      // An nnU-Net folder (imagesTs, imagesTr): one input per case, its channel files stacked.
      std::vector<InputImage> cases = nnunet_cases(in, nifti_files);
      if (cases.empty()) {
        for (const auto& path : nifti_files) images.push_back(nifti_input(path));
      } else {
        images.insert(images.end(), cases.begin(), cases.end());
      }
      for (const auto& path : written) images.push_back(nifti_input(path));  // left out below, with a word
      continue;
    }
    if (std::any_of(own_files.begin(), own_files.end(), dicom_image_file)) {
      images.push_back({in, folder_name(in), ".nii.gz", {}});
      continue;
    }
    // The folders below that hold DICOM image files, in path order.
    std::set<std::string> series_folders;
    std::size_t found = 0;
    for (const auto& f : dicom::files_of(in)) {
      const std::string folder = os::parent_directory(f);
      if (series_folders.count(folder) || folder.size() <= in.size() || !dicom_image_file(f)) continue;
      series_folders.insert(folder);
      std::string stem = folder.substr(in.size() + 1);
      std::replace(stem.begin(), stem.end(), '/', '_');
      images.push_back({folder, stem, ".nii.gz", {}});
      ++found;
    }
    if (found == 0) {
      throw ValueError(
          str("--input ", given, ": the folder holds no .nii or .nii.gz files (NIfTI images are read ",
              "from the folder itself, not from folders below it) and no DICOM images, in it or below it"));
    }
  }
  return images;
}

// The grid the labels are written on, the input's: a NIfTI file's header; a DICOM series'
// geometry as LoadImage read it (the series travels in the volume's meta through the chain).
VolumeHeader input_grid(const std::string& file, const Volume& loaded) {
  if (is_nifti_name(file)) return read_nifti_header(file);
  const std::shared_ptr<const dicom::Series>& series = loaded.meta.dicom;
  if (!series) throw Error(str(file, ": read as DICOM, but the deterministic chain's output kept no DICOM series"));
  VolumeHeader h;
  h.shape = {series->columns, series->rows, static_cast<std::int64_t>(series->slices.size())};
  h.affine = series->affine();
  h.meta = dicom_volume_meta(h.affine, file);
  return h;
}

}  // namespace

nlohmann::json InferCase::to_json() const {
  return {{"input", input},
          {"output", output},
          {"read_seconds", read_seconds},
          {"wait_seconds", wait_seconds},
          {"infer_seconds", infer_seconds},
          {"write_seconds", write_seconds},
          {"peak_rss_bytes", peak_rss_bytes}};
}

namespace {

// The output folder, checked before the network is loaded (nothing written): a file is
// refused; a folder of another kind of medfast's (a run, a cache) is refused; outputs that
// exist are refused unless `overwrite`.
void check_output_folder(const std::string& dir, const std::vector<std::string>& outputs, bool overwrite) {
  if (os::exists(dir) && !os::stat(dir).is_directory) throw ValueError(str("--output ", dir, ": is a file, not a folder"));
  const std::optional<os::FolderMark> mark = os::read_folder_mark(dir);
  if (mark && mark->kind != os::kInferFolder) {
    throw ValueError(str("--output ", dir, ": is a medfast ", mark->kind, " folder (", dir, "/", os::kFolderMarkName,
                         "), not an infer output folder: choose another --output"));
  }
  std::vector<std::string> existing;
  for (const std::string& out : outputs) {
    if (os::exists(out)) existing.push_back(std::filesystem::path(out).filename().string());
  }
  if (!existing.empty() && !overwrite) {
    throw ValueError(str("infer: ", existing.size(), existing.size() == 1 ? " output exists" : " outputs exist",
                         " already in ", dir, " (", os::describe_entries(dir, existing),
                         "): pass --overwrite to replace them, or choose another --output; nothing was written"));
  }
}

// The output folder once the network has taken a window, before any input is read: a
// missing or empty folder is made and marked (its mark then lists every output before it is
// written); infer writes into a folder of the user's too, but removes nothing there. A file is
// written and removed, so that a folder infer cannot write is said now, not after the first
// inference.
std::optional<os::FolderMark> open_output_folder(const std::string& dir) {
  std::optional<os::FolderMark> mark = os::read_folder_mark(dir);
  try {
    if (!mark && os::user_entries(dir).empty()) mark = os::claim_folder(dir, os::kInferFolder, "--output");
    os::make_directories(dir);
    const std::string probe = os::temporary_path(dir + "/write-check");
    os::File::open(probe, os::File::Mode::create_new);
    os::remove_file(probe);
  } catch (const OsError& e) {
    throw OsError(str("--output ", dir, ": cannot write there (", e.what(), "); nothing was inferred"), e.errno_value());
  }
  return mark;
}

}  // namespace

std::vector<InferCase> infer(const std::string& checkpoint, const std::vector<std::string>& inputs,
                             const std::string& output_dir, const InferOptions& o, const Settings& settings,
                               const std::function<void(const std::string&)>& message) {
  std::vector<InputImage> images = expand_inputs(inputs);
  // infer's own outputs are not inputs (an --output that is also an --input folder).
  std::vector<std::string> own;
  images.erase(std::remove_if(images.begin(), images.end(),
                              [&](const InputImage& image) {
                                if (!written_by_infer(image.path)) return false;
                                own.push_back(std::filesystem::path(image.path).filename().string());
                                return true;
                              }),
               images.end());
  if (!own.empty() && message) {
    message(str("skipped ", own.size(), own.size() == 1 ? " file" : " files", " that infer wrote itself (",
                os::describe_entries("", own), ")"));
  }
  // Two inputs of one name would write one output file, the second over the first.
  std::vector<std::string> files, outputs;
  std::vector<nlohmann::json> sources;          // per input what LoadImage reads: a file, or a case's channel files
  std::map<std::string, std::string> input_of;  // output name -> input
  for (const auto& image : images) {
    const std::string name = image.stem + (image.channels.empty() ? o.suffix : "") + image.extension;
    const auto [at, fresh] = input_of.emplace(name, image.path);
    if (!fresh) {
      throw ValueError(str("--input ", at->second, " and ", image.path, " would both be written to ", output_dir, "/",
                           name, ": infer them in separate runs (another --output)"));
    }
    files.push_back(image.path);
    sources.push_back(image.channels.empty() ? nlohmann::json(image.path) : nlohmann::json(image.channels));
    outputs.push_back(output_dir + "/" + name);
  }
  check_output_folder(output_dir, outputs, o.overwrite);
  const c10::Device device = choose_device(o.device, "--device").device;
  if (checkpoint.empty() && o.config.is_null()) throw ValueError("infer: pass --checkpoint, or --config with model.pretrained");
  Loaded net = checkpoint.empty() ? load_pretrained(o.config, o.config_path, device)
                                  : load_network(checkpoint, device);
  const nlohmann::json& cfg = net.meta["config"];
  const std::string image_key = cfg.value("train", nlohmann::json::object()).value("image_key", std::string("image"));
  nlohmann::json sw = cfg.value("validation", nlohmann::json::object()).value("sliding_window", nlohmann::json::object());
  if (o.sliding_window.is_object()) {
    for (const auto& [k, v] : o.sliding_window.items()) sw[k] = v;
  }
  const SlidingWindowOptions swo = SlidingWindowOptions::from_json(sw, "sliding_window");
  Tta tta = Tta::none;  // --tta, else the config's validation.tta
  const nlohmann::json tta_config = cfg.value("validation", nlohmann::json::object()).value("tta", nlohmann::json("none"));
  const std::string tta_name = !o.tta.empty() ? o.tta : tta_config.is_string() ? tta_config.get<std::string>() : "";
  if (const auto t = parse_choice<Tta>(tta_name)) {
    tta = *t;
  } else {
    throw ValueError(str(o.tta.empty() ? "validation.tta" : "--tta", ": expected ", choice_list<Tta>(), ", got '",
                         o.tta.empty() ? tta_config.dump() : o.tta, "'"));
  }
  transforms::Compose chain = transforms::make_chain(detail::image_only_chain(cfg.at("data").at("deterministic"), image_key));
  chain.set_max_output_bytes(settings.get_bytes("max_volume_bytes"));
  const Precision precision = parse_precision(o.amp, device.is_cuda(), "--amp");
  const bool sigmoid = LossOptions::from_json(cfg.value("loss", nlohmann::json::object()), "loss").sigmoid;
  // A region run (nnU-Net's): its regions written into one label map, each region's value
  // over the voxels its sigmoid puts above 0.5, later regions over earlier ones.
  std::vector<std::int64_t> class_order;
  if (sigmoid && cfg.contains("data") && cfg["data"].contains("labels")) {
    class_order = data::read_run_labels(cfg["data"]["labels"], (checkpoint.empty() ? o.config_path : checkpoint))
                      .regions_class_order;
  }
  for (const std::int64_t v : class_order) {
    if (v < 0 || v > 255)
      throw ValueError(str("infer: data.labels.regions_class_order value ", v, " is outside 0..255 (uint8 labels)"));
  }
  {
    const std::int64_t in_channels = cfg.at("model").value("in_channels", std::int64_t{1});
    for (const auto& image : images) {
      if (!image.channels.empty() && static_cast<std::int64_t>(image.channels.size()) != in_channels) {
        throw ValueError(str("--input ", image.path, ": case '", image.stem, "' has ", image.channels.size(),
                             " channel file(s); the model takes ", in_channels, " (model.in_channels)"));
      }
    }
  }
  apply_network_threads(0, settings);
  apply_host_memory_reuse(settings);
  apply_conv_forward(settings);
  ensure_backends_checked(device, precision_dtype(precision), settings.get_bool("self_check"));
  const nlohmann::json train_section = cfg.value("train", nlohmann::json::object());
  const std::string cfg_name = checkpoint.empty() ? o.config_path : checkpoint;
  // train.deterministic as the run's validation had it: false, cudnn.benchmark (every window
  // has one shape, so the fastest algorithm is timed once and kept).
  apply_cuda_determinism(device, deterministic_of(train_section, cfg_name));
  torch::NoGradGuard no_grad;
  const Predictor predict = detail::inference_predictor(cfg.at("model"), net.any, settings, "model", device, precision,
                                                        tta, memory_format_of(train_section, device, cfg_name));
  // A window through the network now, before the first file is read: a roi_size the network
  // cannot take (SegResNet: multiples of 8, SwinUNETR: of 32, UNet: of its strides' product) is
  // named at once, not after reading and preprocessing (as train checks its validation window).
  if (std::all_of(swo.roi_size.begin(), swo.roi_size.end(), [](std::int64_t r) { return r > 0; })) {
    std::vector<std::int64_t> shape{1, cfg.at("model").value("in_channels", std::int64_t{1})};
    shape.insert(shape.end(), swo.roi_size.begin(), swo.roi_size.end());
    const std::string what = str("infer: the network cannot take a window of ", at::IntArrayRef(shape),
                                 " (sliding_window roi_size ", at::IntArrayRef(swo.roi_size), ", model.in_channels)");
    const at::Tensor out = with_context(what, [&] { return predict(at::zeros(shape, at::TensorOptions().device(device))); });
    if (out.dim() != static_cast<std::int64_t>(shape.size()) || !std::equal(shape.begin() + 2, shape.end(), out.sizes().begin() + 2)) {
      throw ValueError(str(what, ": it returns ", out.sizes(), " (choose a roi_size the network's strides divide: "
                           "--set roi_size=[...])"));
    }
  }
  std::optional<os::FolderMark> mark = open_output_folder(output_dir);
  // Temporaries of an infer that was killed mid-write (.<name>_seg.nii.gz.medfast-tmp-<pid>-<n>), in
  // a folder infer marked: its writer is gone, so the file is not one it finishes; a running
  // writer's stay.
  const os::Removed stale = os::remove_stale_temporaries(output_dir);
  if (!stale.paths.empty() && message) {
    message(str("removed ", stale.paths.size(), " temporary files of an interrupted write from ", output_dir, " (",
                format_bytes(stale.bytes), ")"));
  }
  if (message && tta != Tta::none) {
    const std::int64_t calls = tta_forwards(tta, static_cast<std::int64_t>(swo.roi_size.size()));
    message(str("test-time augmentation ", name_of(tta), ": ", calls, " network calls per window, each mirror image ",
                "costing about what the whole inference costs without it (", calls, "x)"));
  }
  // Three stages overlap across files: reading and preprocessing file i + 1 (one file
  // ahead) and writing file i - 1 run on their own threads while file i is inferred, so a
  // folder takes about the sum of its inferences. Each stage is timed on its own thread.
  struct Prepared {
    Sample sample;
    VolumeHeader original;  // the input's grid, from its header
    double read_seconds = 0;
  };
  using Clock = std::chrono::steady_clock;
  const auto prepare = [&](std::size_t i) {
    const std::string& file = files[i];
    const auto started = Clock::now();
    Prepared p;
    p.sample.meta = {{image_key, sources[i]}};
    chain.apply(p.sample);
    p.original = input_grid(file, p.sample.volume(image_key));
    if (p.original.shape.size() < 3) throw FormatError(str(file, ": expected a 3D image"));
    p.read_seconds = seconds_since(started);
    return p;
  };
  // Labels [C, X, Y, Z] of `img` back onto the input's grid and written; returns the seconds.
  const auto write = [&](const at::Tensor& labels, const Affine& affine, const VolumeHeader& original,
                         const std::string& path) {
    const auto started = Clock::now();
    // Output voxel o (input index) -> world -> prediction index.
    const std::array<std::int64_t, 3> grid{original.shape[0], original.shape[1], original.shape[2]};
    const bool same_grid = affine == original.affine && labels.size(1) == grid[0] && labels.size(2) == grid[1] &&
                           labels.size(3) == grid[2];
    const Affine out_to_in = affine.inverse() * original.affine;
    const at::Tensor back = same_grid ? labels  // no spatial step in the chain: the grid is the input's
                                      : transforms::resample_index_affine(labels, out_to_in, grid, /*nearest=*/true,
                                                                          /*zeros_outside=*/true, {0, 0, 0}, grid);
    Volume out;
    out.data = back.size(0) == 1 ? back[0] : back.permute({1, 2, 3, 0}).contiguous();  // masks: X, Y, Z, C
    out.affine = original.affine;
    out.meta = original.meta;
    out.meta.disk_datatype = 0;
    out.meta.scl_slope = out.meta.scl_inter = 0;
    out.meta.intent_code = 1002;  // NIFTI_INTENT_LABEL
    out.meta.descrip = kInferDescrip;
    NiftiWriteOptions wo;
    wo.threads = settings.threads();
    write_nifti(path, out, wo);
    return seconds_since(started);
  };
  const auto with_file = [&swo](const std::string& file, auto&& f) {
    try {
      return f();
    } catch (Error& e) {
      e.add_context(str("infer ", file));
      throw;
    } catch (const c10::Error& e) {  // libtorch's, e.g. a window the network cannot take
      throw Error(str("infer ", file, ": ", e.what_without_backtrace(), " (sliding window roi_size ",
                      at::IntArrayRef(swo.roi_size), "; the model's input)"));
    }
  };

  std::vector<InferCase> written;
  std::optional<InferCase> writing_case;  // the case whose write is under way
  std::future<double> writing;
  // Waits for the write under way; reports its case.
  const auto finish_write = [&] {
    if (!writing_case) return;
    InferCase c = std::move(*writing_case);
    writing_case.reset();
    c.write_seconds = with_file(c.input, [&] { return writing.get(); });
    c.peak_rss_bytes = os::peak_rss_bytes();
    if (message) {
      message(str(c.input, " -> ", c.output, " (read ", format_seconds(c.read_seconds), ", inference ",
                  format_seconds(c.infer_seconds), ", write ", format_seconds(c.write_seconds), "; peak RSS ",
                  format_bytes(c.peak_rss_bytes), ")"));
    }
    written.push_back(std::move(c));
    if (o.on_progress) o.on_progress(written.size(), files.size());
  };
  if (files.empty()) return written;
  std::future<Prepared> next = std::async(std::launch::async, prepare, std::size_t{0});
  try {
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string& file = files[i];
      InferCase c;
      c.input = file;
      auto started = Clock::now();
      Prepared p = with_file(file, [&] { return next.get(); });
      c.wait_seconds = seconds_since(started);
      c.read_seconds = p.read_seconds;
      if (i + 1 < files.size()) next = std::async(std::launch::async, prepare, i + 1);
      const Volume& img = p.sample.volume(image_key);
      started = Clock::now();
      // The labels slab by slab: the whole output (classes x the volume, float32) is never held.
      const SlidingWindowLabels result = with_file(file, [&] {
        SlidingWindowLabels r = sliding_window_labels(img.data.unsqueeze(0).to(device, at::kFloat), predict, swo, sigmoid);
        if (r.nonfinite > 0) {
          throw Error(str("the network's output holds NaN or infinity at ", r.nonfinite,
                          " values: no labels written (check the checkpoint's weights and the image's voxels)"));
        }
        return r;
      });
      at::Tensor labels = result.labels[0].cpu();  // [C, X, Y, Z]: channel-first
      if (!class_order.empty()) {
        if (labels.size(0) != static_cast<std::int64_t>(class_order.size())) {
          throw Error(str("infer ", file, ": the network gives ", labels.size(0),
                          " region masks, data.labels."
                          "regions_class_order has ",
                          class_order.size(), " values"));
        }
        at::Tensor map =
            at::zeros({1, labels.size(1), labels.size(2), labels.size(3)}, labels.options().dtype(at::kByte));
        for (std::size_t k = 0; k < class_order.size(); ++k) {
          map.masked_fill_(labels[static_cast<std::int64_t>(k)].unsqueeze(0).to(at::kBool), class_order[k]);
        }
        labels = map;
      }
      c.infer_seconds = seconds_since(started);
      finish_write();  // the previous file's
      c.output = outputs[i];
      if (mark) os::record_file(output_dir, *mark, std::filesystem::path(c.output).filename().string());
      writing = std::async(std::launch::async, [&write, labels = std::move(labels), affine = img.affine,
                                                original = std::move(p.original), path = c.output] {
        return write(labels, affine, original, path);
      });
      writing_case = std::move(c);
    }
    finish_write();
  } catch (...) {
    // Nothing is left running: the read ahead is waited for and dropped; a write under way
    // finishes (write_nifti renames a complete file into place) and is reported as any other,
    // or, had it failed too, logged (the first error is the one thrown).
    const std::exception_ptr first = std::current_exception();
    if (next.valid()) next.wait();
    try {
      finish_write();
    } catch (const std::exception& e) {
      log::warn(e.what());
    }
    std::rethrow_exception(first);
  }
  return written;
}

}  // namespace medfast::train
