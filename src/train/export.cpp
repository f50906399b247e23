// `medfast export` (see include/medfast/train/export.hpp): a checkpoint's network as a
// state_dict file and a MONAI bundle-style config.
#include "medfast/train/export.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include "detail.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/pretrained.hpp"
#include "medfast/os/file.hpp"
#include "medfast/train/inference.hpp"
#include "medfast/train/losses.hpp"
#include "medfast/transforms/transform.hpp"
#include "medfast/version.hpp"

namespace medfast::train {

nlohmann::json ExportResult::to_json() const {
  return {{"model", model_file}, {"inference_config", inference_config}, {"metadata", metadata},
          {"network", network},  {"tensors", tensors},                   {"bytes", bytes}};
}

nlohmann::json monai_network_def(const nlohmann::json& model, const std::string& where) {
  const nn::NetworkSpec spec = nn::parse_network(detail::without_pretrained(model), where);
  nlohmann::json def{{"_target_", "monai.networks.nets." + spec.name}};
  for (const auto& [k, v] : spec.arguments.items()) def[k] = v;
  if (spec.name == "SegResNet") {
    // MONAI 1.3's SegResNet ignores its (deprecated) num_groups: a group norm takes its
    // groups from the norm argument itself. And no dropout is None there, not 0.
    if (def["norm"] == "group") def["norm"] = nlohmann::json::array({"GROUP", {{"num_groups", def["num_groups"]}}});
    if (def["dropout_prob"].is_number() && def["dropout_prob"].get<double>() == 0) def["dropout_prob"] = nullptr;
  }
  if (spec.name == "DynUNet") {
    // MONAI's default instance norm has affine parameters, which its name alone does not.
    def["norm_name"] = def["norm_name"] == "instance" ? nlohmann::json::array({"INSTANCE", {{"affine", true}}})
                                                      : nlohmann::json("BATCH");
    if (def["filters"].empty()) def["filters"] = nullptr;
    if (def["dropout"].is_number() && def["dropout"].get<double>() == 0) def["dropout"] = nullptr;
  }
  return def;
}

namespace {

/// MONAI's SlidingWindowInferer for the run's validation window (the same arguments by
/// MONAI's names; medfast's accumulation device is the input's, MONAI's default too).
nlohmann::json inferer_of(const nlohmann::json& config) {
  const nlohmann::json sw =
      config.value("validation", nlohmann::json::object()).value("sliding_window", nlohmann::json::object());
  const SlidingWindowOptions o = SlidingWindowOptions::from_json(sw, "validation.sliding_window");
  const nlohmann::json j = fields_json(o);
  return {{"_target_", "SlidingWindowInferer"}, {"roi_size", j["roi_size"]}, {"sw_batch_size", j["sw_batch_size"]},
          {"overlap", j["overlap"]},           {"mode", j["mode"]},         {"sigma_scale", j["sigma_scale"]},
          {"padding_mode", j["padding_mode"]}, {"cval", j["cval"]}};
}

/// The deterministic chain on the image alone as MONAI dictionary transforms: each with its
/// arguments as medfast ran it (defaults written out), those MONAI's class takes; medfast's
/// own spellings where MONAI has another (CropForeground's threshold and nonzero are
/// MONAI's select_fn); ToDevice left to the bundle's device.
nlohmann::json monai_preprocessing(const nlohmann::json& config, const std::string& image_key) {
  nlohmann::json out = nlohmann::json::array();
  const nlohmann::json chain = detail::image_only_chain(config.at("data").at("deterministic"), image_key);
  for (const auto& t : chain) {
    const std::string name = t.at("name").get<std::string>();
    if (name == "ToDevice") continue;
    nlohmann::json args = t;
    args.erase("name");
    nlohmann::json resolved;
    const std::string canonical = transforms::make(name, args, &resolved)->name();
    nlohmann::json item{{"_target_", canonical + "d"}, {"keys", nlohmann::json::array({image_key})}};
    for (const auto& [k, v] : resolved.items()) {
      if (k == "keys" || !transforms::is_monai_argument(canonical, k)) continue;
      // As the chain wrote it (a per-key list already narrowed to the image's entry), else
      // the default medfast ran with.
      const nlohmann::json& value = t.contains(k) ? t[k] : v;
      if (canonical == "LoadImage" && k == "dtype" && (value.is_null() || value == "")) continue;  // the file's own
      item[k] = value;
    }
    if (canonical == "CropForeground") {
      const double threshold = resolved.value("threshold", 0.0);
      if (resolved.value("nonzero", false)) {
        item["select_fn"] = "$lambda x: x != 0";
      } else if (threshold != 0) {
        item["select_fn"] = str("$lambda x: x > ", threshold);
      }
    }
    out.push_back(item);
  }
  return out;
}

/// What a prediction becomes, as `medfast infer` writes it: a sigmoid network's channels
/// thresholded at 0.5 (one mask per region), a softmax network's argmax; then mapped back
/// onto the input's grid (Invertd through the preprocessing) and saved as NIfTI.
nlohmann::json monai_postprocessing(bool sigmoid) {
  nlohmann::json out = nlohmann::json::array();
  if (sigmoid) {
    out.push_back({{"_target_", "Activationsd"}, {"keys", "pred"}, {"sigmoid", true}});
    out.push_back({{"_target_", "AsDiscreted"}, {"keys", "pred"}, {"threshold", 0.5}});
  } else {
    out.push_back({{"_target_", "AsDiscreted"}, {"keys", "pred"}, {"argmax", true}});
  }
  out.push_back({{"_target_", "Invertd"},
                 {"keys", "pred"},
                 {"transform", "@preprocessing"},
                 {"orig_keys", "image"},
                 {"nearest_interp", true},
                 {"to_tensor", true}});
  out.push_back({{"_target_", "SaveImaged"},
                 {"keys", "pred"},
                 {"output_dir", "@output_dir"},
                 {"output_postfix", "seg"},
                 {"output_dtype", "$numpy.uint8"},
                 {"separate_folder", false},
                 {"resample", false}});
  return out;
}

}  // namespace

ExportResult export_bundle(const std::string& checkpoint, const std::string& out_dir, bool overwrite) {
  ExportResult r;
  r.model_file = out_dir + "/model.pt";
  r.inference_config = out_dir + "/configs/inference.json";
  r.metadata = out_dir + "/configs/metadata.json";
  if (!overwrite) {
    for (const std::string& f : {r.model_file, r.inference_config}) {
      if (os::exists(f)) {
        throw ValueError(str("export: ", f, " exists (an earlier export): pass --overwrite to replace it, or choose "
                             "another --out"));
      }
    }
  }
  torch::NoGradGuard no_grad;
  const detail::Loaded net = detail::load_network(checkpoint, c10::Device(c10::kCPU));
  const nlohmann::json& config = net.meta.at("config");
  const nlohmann::json model = detail::without_pretrained(config.at("model"));
  const nlohmann::json def = monai_network_def(model, checkpoint + ": model");
  r.network = def["_target_"].get<std::string>().substr(std::string("monai.networks.nets.").size());

  os::make_directories(out_dir + "/configs");
  r.bytes = nn::save_state_dict_file(r.model_file, *net.module);
  r.tensors = nn::state_dict_of(*net.module).size();

  const nlohmann::json inferer = inferer_of(config);
  const bool sigmoid = LossOptions::from_json(config.value("loss", nlohmann::json::object()), "loss").sigmoid;
  const std::string image_key =
      config.value("train", nlohmann::json::object()).value("image_key", std::string("image"));
  // MONAI's bundle runner infers a folder with it (docs/training.md, "Networks from and to MONAI"):
  //   python -m monai.bundle run --config_file configs/inference.json --dataset_dir IMAGES --output_dir OUT
  // each image through the preprocessing, the sliding window, the postprocessing, written as
  // <name>_seg.nii.gz on its own grid: what `medfast infer` writes.
  nlohmann::json inference{
      {"imports", {"$import glob", "$import os", "$import numpy", "$import torch"}},
      {"bundle_root", "."},
      {"dataset_dir", "$@bundle_root + '/images'"},
      {"output_dir", "$@bundle_root + '/eval'"},
      {"datalist", "$[{'image': f} for f in sorted(glob.glob(os.path.join(@dataset_dir, '*.nii*')))]"},
      {"device", "$torch.device('cuda' if torch.cuda.is_available() else 'cpu')"},
      {"network_def", def},
      {"network", "$@network_def.to(@device)"},
      {"checkpoint", "$@bundle_root + '/model.pt'"},
      {"label_names", net.meta.value("class_names", nlohmann::json::array())},
      {"preprocessing", {{"_target_", "Compose"}, {"transforms", monai_preprocessing(config, image_key)}}},
      {"dataset", {{"_target_", "Dataset"}, {"data", "@datalist"}, {"transform", "@preprocessing"}}},
      {"inferer", inferer},
      {"postprocessing", {{"_target_", "Compose"}, {"transforms", monai_postprocessing(sigmoid)}}},
      {"predict", "$torch.no_grad()(lambda d: dict(d, pred=@inferer(d['" + image_key +
                      "'][None].to(@device), @network)[0]))"},
      {"initialize",
       {"$@network.load_state_dict(torch.load(@checkpoint, map_location=@device, weights_only=True))",
        "$@network.eval()"}},
      {"run", {"$[@postprocessing(@predict(d)) for d in @dataset]"}},
      {"medfast",
       {{"exported_from", checkpoint},
        {"epoch", net.meta.value("epoch", 0)},
        {"best_dice", net.meta.value("best_dice", nlohmann::json())},
        {"best_epoch", net.meta.value("best_epoch", 0)},
        {"medfast", kVersion},
        {"config", config}}}};
  os::write_text_file(r.inference_config, inference.dump(2) + "\n");

  const std::int64_t in_channels = def.value("in_channels", 1), out_channels = def.value("out_channels", 1);
  nlohmann::json metadata{
      {"version", "0.1.0"},
      {"monai_version", "1.3.2"},
      {"pytorch_version", str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)},
      {"name", str(r.network, " trained by medfast")},
      {"task", "3D segmentation"},
      {"description", str("Exported by medfast ", kVersion, " from ", checkpoint, " (epoch ",
                          net.meta.value("epoch", 0), ")")},
      {"network_data_format",
       {{"inputs",
         {{"image",
           {{"type", "image"}, {"format", "magnitude"}, {"num_channels", in_channels},
            {"spatial_shape", inferer["roi_size"]}, {"dtype", "float32"}, {"is_patch_data", true}}}}},
        {"outputs",
         {{"pred",
           {{"type", "image"}, {"format", "segmentation"}, {"num_channels", out_channels},
            {"spatial_shape", inferer["roi_size"]}, {"dtype", "float32"}, {"is_patch_data", true}}}}}}}};
  // The output channels by name, as MONAI's bundles write them (channel_def).
  const nlohmann::json names = net.meta.value("class_names", nlohmann::json::array());
  if (names.is_array() && !names.empty()) {
    nlohmann::json channels = nlohmann::json::object();
    const bool background = !sigmoid && static_cast<std::int64_t>(names.size()) + 1 == out_channels;
    if (background) channels["0"] = "background";
    for (std::size_t k = 0; k < names.size(); ++k) channels[std::to_string(k + (background ? 1 : 0))] = names[k];
    metadata["network_data_format"]["outputs"]["pred"]["channel_def"] = channels;
  }
  os::write_text_file(r.metadata, metadata.dump(2) + "\n");
  return r;
}

}  // namespace medfast::train
