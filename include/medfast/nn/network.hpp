#pragma once
/// \file
/// Networks by name, from a config's `model` section:
///
///   model: {name: UNet, in_channels: 1, out_channels: 2, channels: [16, 32, 64, 128, 256],
///           strides: [2, 2, 2, 2], num_res_units: 2, norm: batch}
///   model: {name: SegResNet, init_filters: 16, in_channels: 4, out_channels: 3, ...}
///   model: {name: SwinUNETR, img_size: [96, 96, 96], feature_size: 48, use_v2: false, ...}
///
/// Argument names are MONAI's. Unknown names and arguments are errors.
#include <torch/nn/modules/container/any.h>

#include <nlohmann/json.hpp>

namespace medfast::nn {

/// The network a `model` section describes. Throws ValueError naming the key
/// (with `where`, e.g. the config file, in the message).
torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where = "model");

}  // namespace medfast::nn
