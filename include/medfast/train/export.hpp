#pragma once
/// \file
/// Models out: a medfast checkpoint as what MONAI users deploy. `export_bundle` writes
///
///   DIR/model.pt                 the network's state_dict in torch.save's zip format, MONAI's
///                                names and order (torch.load(..., weights_only=True) reads it
///                                on PyTorch 1.13 and 2.x; nn::save_state_dict_file)
///   DIR/configs/inference.json   a MONAI bundle-style config: `network_def` ({"_target_":
///                                "monai.networks.nets.UNet", every argument}) that MONAI's
///                                ConfigParser instantiates, `network`, `device`, `inferer`
///                                (SlidingWindowInferer with the run's validation window), and
///                                `medfast` (where it came from)
///   DIR/configs/metadata.json    the bundle's metadata (versions, inputs and outputs)
///
/// `model.pretrained: DIR/model.pt` reads the weights back bit for bit.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace medfast::train {

struct ExportResult {
  std::string model_file, inference_config, metadata;
  std::string network;      ///< e.g. UNet
  std::size_t tensors = 0;  ///< parameters and buffers written
  std::size_t bytes = 0;    ///< of model.pt
  nlohmann::json to_json() const;
};

/// The network_def MONAI's ConfigParser instantiates for a `model` section (its name and
/// every argument, defaults included). ConfigError naming `where` for a bad section.
nlohmann::json monai_network_def(const nlohmann::json& model, const std::string& where = "model");

/// Writes the bundle of `checkpoint` (a medfast training checkpoint) into `out_dir`.
/// Refuses (ValueError naming the file) to replace an earlier export unless `overwrite`;
/// FormatError naming the checkpoint when it is not one.
ExportResult export_bundle(const std::string& checkpoint, const std::string& out_dir, bool overwrite = false);

}  // namespace medfast::train
