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
  nlohmann::json inference{
      {"imports", {"$import torch"}},
      {"bundle_root", "."},
      {"device", "$torch.device('cuda' if torch.cuda.is_available() else 'cpu')"},
      {"network_def", def},
      {"network", "$@network_def.to(@device)"},
      {"checkpoint", "$@bundle_root + '/model.pt'"},
      {"inferer", inferer},
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
  os::write_text_file(r.metadata, metadata.dump(2) + "\n");
  return r;
}

}  // namespace medfast::train
